"""Where tandem's per-step time over a hand-written loop goes, in wall time: a diagnostic, not a ratio.

overhead.py and logging_cost.py give the tandem / raw ratio from fresh processes, pair by pair. On a small
shared machine those ratios move by 3-5 % from run to run, and one process can run the same code 20 % faster than
the next. That hides a change of a few microseconds a step. This script runs everything in ONE process instead,
in short blocks, each round running every variant once in rotating order. Each block is compared with the raw
block of the same round, so a slow spell of the machine hits both alike. The median of those paired differences
has a spread of a few microseconds. Use it to see how much of the overhead a part of the loop is, and what a
change to the per-step path saves. It does not replace the ratio benchmarks.

The variants, on overhead.py's MLP (one thread, 300 steps a block, one epoch), timed from the first batch to the
last step (raw) or from ``on_train_start`` to ``on_train_end`` (tandem; set-up is left out on both sides):

- ``raw``: the hand-written loop (forward, cross-entropy, backward, SGD step, ``zero_grad(set_to_none=True)``);
- ``tandem``: ``Trainer.fit`` with ``self.log("loss", loss)`` every step, no logger (overhead.py's settings);
- ``no_log``: the same without the ``self.log`` call;
- ``bare_step``: ``no_log`` with the fit loop's batch runner and the automatic optimization replaced by the raw
  loop's body (plus the counters that end the fit). What is left is the epoch loop around the batches, the
  per-epoch work (the parameters' NaN check, the RNG capture, the epoch's hooks), and the process tandem's
  objects live in.

The differences give the split: ``tandem - no_log`` is one ``self.log``; ``no_log - bare_step`` is the batch
runner and the optimization; ``bare_step - raw`` is the rest. Every variant must end with the raw loop's weights,
or the script stops.

Lightning's anchor column (``--lightning PYTHON``, a Python that has ``lightning`` installed, e.g. a separate venv;
Lightning is an optional benchmark dependency, never imported by ``import tandem`` or the tests): a sibling process
runs the same rounds with two variants, ``raw`` and ``lightning`` (``lightning.Trainer.fit`` with the same module,
``self.log`` every step, no logger, the same settings, timed from ``on_train_start`` to ``on_train_end``), paired
the same way, and its row is printed with the others. It must end with the raw loop's weights too.

    python benchmarks/overhead_split.py                 # 40 rounds of 300 steps
    python benchmarks/overhead_split.py --rounds 80
    python benchmarks/overhead_split.py --lightning /path/to/venv-with-lightning/bin/python
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import overhead  # noqa: E402  (the MLP, the data, the learning rate)

STEPS = overhead.STEPS_PER_EPOCH  # one epoch a block


def _checksum(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def run_raw(steps: int) -> tuple[float, float]:
    """Seconds of overhead.py's hand-written loop (set-up left out), and the final weights' checksum."""
    import torch

    loader, model = overhead._data(steps), overhead._mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=overhead.LR)
    start = time.perf_counter()
    overhead.raw_loop(loader, model, optimizer, steps)
    return time.perf_counter() - start, _checksum(model)


#: the Trainer settings of every variant (overhead.py's), Lightning's as tandem's
TRAINER_SETTINGS = dict(
    accelerator="cpu",
    devices=1,
    max_epochs=-1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)


def _module(log: bool, base: type | None = None):
    """overhead.py's MLP as a module of ``base`` (tandem's ``TrainingModule`` by default, or Lightning's)."""
    import torch
    from torch.nn import functional as F

    if base is None:
        import tandem

        base = tandem.TrainingModule

    class MLP(base):
        def __init__(self) -> None:
            super().__init__()
            self.net = overhead._mlp()

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            if log:
                self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=overhead.LR)

    return MLP()


def run_tandem(steps: int, log: bool = True) -> tuple[float, float]:
    import tandem

    timer, module = overhead.loop_timer(), _module(log)
    trainer = tandem.Trainer(max_steps=steps, callbacks=[timer], **TRAINER_SETTINGS)
    trainer.fit(module, overhead._data(steps))
    if trainer.global_step != steps:
        sys.exit(f"tandem took {trainer.global_step} steps, expected {steps}")
    return timer.seconds, _checksum(module)


@contextlib.contextmanager
def bare_batches() -> Iterator[None]:
    """The fit loop's batch runner runs the raw loop's body instead of its own and the optimization's."""
    from tandem.trainer.batch_runner import BatchRunner

    original = BatchRunner._run_batch

    def run_batch(self, batch, batch_idx):
        loop, optimizer = self.state, self.optimization.optimizers[0]
        loss = self.context.strategy.module.training_step(batch, batch_idx)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loop.global_step += 1
        loop.batches_stepped += 1
        loop.batches_done = batch_idx + 1
        return True

    BatchRunner._run_batch = run_batch
    try:
        yield
    finally:
        BatchRunner._run_batch = original


def run_bare_step(steps: int) -> tuple[float, float]:
    with bare_batches():
        return run_tandem(steps, log=False)


def run_lightning(steps: int) -> tuple[float, float]:
    """The tandem variant's module and settings through Lightning's Trainer (only in a process that has it)."""
    import lightning as L

    class LoopTimer(L.Callback):
        def on_train_start(self, trainer, module):
            self.start = time.perf_counter()

        def on_train_end(self, trainer, module):
            self.seconds = time.perf_counter() - self.start

    timer, module = LoopTimer(), _module(True, L.LightningModule)
    trainer = L.Trainer(max_steps=steps, callbacks=[timer], **TRAINER_SETTINGS)
    trainer.fit(module, overhead._data(steps))
    if trainer.global_step != steps:
        sys.exit(f"Lightning took {trainer.global_step} steps, expected {steps}")
    return timer.seconds, _checksum(module)


def measure(variants: dict[str, Callable[[int], tuple[float, float]]], rounds: int, steps: int) -> dict[str, list]:
    """µs a step of each variant, ``rounds`` blocks each, every round running every variant once in rotating order;
    after one warm-up block each, whose weights must be the raw loop's."""
    import torch

    torch.set_num_threads(1)
    for name in ("lightning", "lightning.pytorch", "lightning_utilities.core.rank_zero"):  # no "fit stopped" per block
        logging.getLogger(name).setLevel(logging.WARNING)
    names = list(variants)
    checksums = {name: variants[name](steps)[1] for name in names}  # warm-up, and the same training
    expected = checksums["raw"]
    for name, checksum in checksums.items():
        if abs(checksum - expected) > 1e-4 * max(1.0, abs(expected)):
            sys.exit(f"{name} ended with weights summing to {checksum}, the raw loop's to {expected}")
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(1e6 * variants[name](steps)[0] / steps)
    return times


def _lightning_times(python: str, rounds: int, steps: int) -> dict[str, list[float]]:
    """raw and lightning, measured as :func:`measure` does, in a sibling process of ``python``."""
    command = [python, os.path.abspath(__file__), "--lightning-worker", "--rounds", str(rounds), "--steps", str(steps)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"the Lightning process failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


VARIANTS: dict[str, Callable[[int], tuple[float, float]]] = {
    "raw": run_raw,
    "tandem": run_tandem,
    "no_log": lambda steps: run_tandem(steps, log=False),
    "bare_step": run_bare_step,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="rounds; each runs every variant once")
    parser.add_argument("--steps", type=int, default=STEPS, help="steps a block")
    parser.add_argument("--lightning", metavar="PYTHON", help="a Python with lightning installed: adds its anchor row")
    parser.add_argument("--lightning-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lightning_worker:  # the sibling process: raw and Lightning only, as JSON
        print(json.dumps(measure({"raw": run_raw, "lightning": run_lightning}, args.rounds, args.steps)))
        return
    import tandem.utilities.rank_zero  # noqa: F401  (sets up the info logger, quietened in measure)

    times = measure(VARIANTS, args.rounds, args.steps)
    print(
        f"overhead_split: overhead.py's MLP in one process, {args.rounds} rounds of {args.steps} steps, each round "
        "every variant once (rotating order); µs a step"
    )
    print(f"{'variant':>10}  {'median':>7}  {'minus raw, paired: median':>26}  {'quartiles':>15}")
    paired = {name: _row(name, times[name], times["raw"]) for name in times}
    if args.lightning:
        anchor = _lightning_times(args.lightning, args.rounds, args.steps)
        _row(
            "lightning",
            anchor["lightning"],
            anchor["raw"],
            note=f"  (its own raw: {statistics.median(anchor['raw']):.1f})",
        )
    print(
        f"split: self.log {paired['tandem'] - paired['no_log']:+.1f}, batch runner and optimization "
        f"{paired['no_log'] - paired['bare_step']:+.1f}, the rest of the loop {paired['bare_step']:+.1f} µs a step"
    )


def _row(name: str, times: list[float], raw: list[float], note: str = "") -> float:
    """Print a variant's median and its paired difference from the raw blocks of the same rounds; returns that."""
    diffs = [t - r for t, r in zip(times, raw)]
    paired = statistics.median(diffs)
    q1, _, q3 = statistics.quantiles(diffs) if len(diffs) > 1 else (diffs[0],) * 3
    print(f"{name:>10}  {statistics.median(times):7.1f}  {paired:+26.1f}  {q1:+7.1f}/{q3:+7.1f}{note}")
    return paired


if __name__ == "__main__":
    main()
