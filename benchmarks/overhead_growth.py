"""How tandem's per-step cost over a hand-written loop grows with what a fit turns on: logged metrics, hooks the
module overrides, callbacks. In ONE process, as overhead_split.py measures (the same MLP, blocks of 300 steps,
each tandem block paired with a raw block of the same round, rotating order), µs a step.

The rows:

- ``metrics N``: ``self.log`` of N values a step (logging_cost.py's values; no logger), against a raw loop that
  computes the same N values and keeps them detached;
- ``hooks N``: the module overrides N hooks that do not run per training batch (no-op bodies: epoch, stage,
  checkpoint and evaluation hooks), one ``self.log`` a step;
- ``batch hooks N``: the module overrides N of the six hooks a training batch calls (no-op bodies);
- ``callbacks N (epoch)``: N callbacks that override ``on_train_epoch_end`` only;
- ``callbacks N (batch)``: N callbacks that override ``on_train_batch_end`` (no-op bodies).

A feature that is off for the batches (the epoch hooks, callbacks without a batch hook) should leave its row flat;
one that runs per batch costs what its calls cost.

    python benchmarks/overhead_growth.py               # 10 rounds
    python benchmarks/overhead_growth.py --rounds 20
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overhead  # noqa: E402  (the MLP, the data, the learning rate)
from logging_cost import _metric_values  # noqa: E402  (the N values a step)
from overhead_split import STEPS, TRAINER_SETTINGS, _checksum  # noqa: E402

BATCH_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
)


def run_raw(steps: int, metrics: int) -> tuple[float, float]:
    import torch
    from torch.nn import functional as F

    loader, model = overhead._data(steps), overhead._mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=overhead.LR)
    start = time.perf_counter()
    done, kept = 0, None
    while done < steps:
        for x, y in loader:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            kept = [v.detach() for v in _metric_values(loss, logits, metrics)]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done == steps:
                break
    del kept
    return time.perf_counter() - start, _checksum(model)


def _noop(self, *args, **kwargs) -> None:
    return None


def run_tandem(
    steps: int, metrics: int = 1, hooks: tuple[str, ...] = (), callbacks: int = 0, callback_hook: str = ""
) -> tuple[float, float]:
    import torch
    from torch.nn import functional as F

    import tandem

    names = ["loss"] + [f"m{i:03d}" for i in range(1, metrics)]

    class MLP(tandem.TrainingModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = overhead._mlp()

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.net(x)
            loss = F.cross_entropy(logits, y)
            for name, value in zip(names, _metric_values(loss, logits, metrics)):
                self.log(name, value)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=overhead.LR)

    module = type("Overriding", (MLP,), dict.fromkeys(hooks, _noop))()
    extra = [
        type(f"Hooked{i}", (tandem.Callback,), {callback_hook: _noop})() for i in range(callbacks)
    ]  # a class each: callbacks of one class would share a checkpoint state key
    timer = overhead.loop_timer()
    trainer = tandem.Trainer(max_steps=steps, callbacks=[timer, *extra], **TRAINER_SETTINGS)
    trainer.fit(module, overhead._data(steps))
    if trainer.global_step != steps:
        sys.exit(f"tandem took {trainer.global_step} steps, expected {steps}")
    return timer.seconds, _checksum(module)


def _configs() -> dict[str, tuple[Callable[[int], tuple[float, float]], Callable[[int], tuple[float, float]]]]:
    """Each row's (raw, tandem) pair of runners."""
    from tandem.trainer.hooks import _HOOK_NAMES

    other_hooks = [n for n in _HOOK_NAMES if n not in BATCH_HOOKS and n != "on_exception"]
    raw1 = functools.partial(run_raw, metrics=1)
    configs = {}
    for n in (1, 16, 64, 256):
        configs[f"metrics {n}"] = (functools.partial(run_raw, metrics=n), functools.partial(run_tandem, metrics=n))
    for n in (5, 10, 20):
        configs[f"hooks {n}"] = (raw1, functools.partial(run_tandem, hooks=tuple(other_hooks[:n])))
    for n in (3, 6):
        configs[f"batch hooks {n}"] = (raw1, functools.partial(run_tandem, hooks=BATCH_HOOKS[:n]))
    for n in (5, 10):
        for kind, hook in (("epoch", "on_train_epoch_end"), ("batch", "on_train_batch_end")):
            configs[f"callbacks {n} ({kind})"] = (raw1, functools.partial(run_tandem, callbacks=n, callback_hook=hook))
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds; each runs every row's pair once")
    parser.add_argument("--steps", type=int, default=STEPS, help="steps a block")
    parser.add_argument("--only", nargs="*", help="row names to run (default: all)")
    args = parser.parse_args()
    import torch

    import tandem.utilities.rank_zero  # noqa: F401  (sets up the info logger, quietened next)

    torch.set_num_threads(1)
    logging.getLogger("lightning_utilities.core.rank_zero").setLevel(logging.WARNING)
    configs = {k: v for k, v in _configs().items() if not args.only or k in args.only}
    for name, (raw, tandem_run) in configs.items():  # warm-up, and the same training
        if abs(raw(args.steps)[1] - tandem_run(args.steps)[1]) > 1e-4:
            sys.exit(f"{name}: tandem did not end with the raw loop's weights")
    diffs: dict[str, list[float]] = {name: [] for name in configs}
    names = list(configs)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            raw, tandem_run = configs[name]
            pair = [raw, tandem_run] if r % 2 == 0 else [tandem_run, raw]
            seconds = {id(run): run(args.steps)[0] for run in pair}
            diffs[name].append(1e6 * (seconds[id(tandem_run)] - seconds[id(raw)]) / args.steps)
    print(f"overhead_growth: {args.rounds} rounds of {args.steps} steps; tandem minus raw, paired, µs a step")
    print(f"{'row':>22}  {'median':>7}  {'quartiles':>15}")
    for name in names:
        q1, median, q3 = statistics.quantiles(diffs[name]) if len(diffs[name]) > 1 else (diffs[name][0],) * 3
        print(f"{name:>22}  {statistics.median(diffs[name]):+7.1f}  {q1:+7.1f}/{q3:+7.1f}")


if __name__ == "__main__":
    main()
