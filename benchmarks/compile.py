"""Per-step time of ``trainer.fit(torch.compile(model))`` against a hand-written loop compiled the same way.

The workload is overhead.py's (an MLP 32 -> 64 -> 10, batches of 32, SGD, one thread), trained three ways, each
in its own process:

- ``raw``: the eager hand-written loop (the reference overhead.py measures tandem against);
- ``raw_compiled``: the same loop with the loss computation compiled (``torch.compile`` of a function running the
  model and the cross-entropy: what tandem compiles, ``training_step`` up to its ``self.log``);
- ``tandem_compiled``: ``Trainer.fit(torch.compile(module))`` with ``self.log("loss", loss)`` every step.

Compilation (inductor, the default backend) happens during the first ``--warmup`` steps of each run, which are
not timed: the timed steps are the ones after them, on the same model. The compiled runs alternate
(raw_compiled, tandem_compiled, then the other way round), one eager raw run per pair, and the median of the
per-pair ratios tandem_compiled / raw_compiled is reported, with each compiled run against the eager loop. The
final losses of the two compiled runs must agree.

    python benchmarks/compile.py                 # 3 pairs
    python benchmarks/compile.py --repeats 5 --steps 5000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from overhead import BATCH_SIZE, LR, _data, _mlp  # noqa: E402  (the same data and MLP)

TARGET_RATIO = 1.05
MODES = ("raw", "raw_compiled", "tandem_compiled")


# ---------------------------------------------------------------------------- workers (one per process)
def run_raw(steps: int, warmup: int, compiled: bool) -> tuple[float, float]:
    """The hand-written loop; returns (seconds of the steps after ``warmup``, last loss)."""
    import torch
    from torch.nn import functional as F

    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    def compute_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x), y)

    loss_of = torch.compile(compute_loss) if compiled else compute_loss
    model.train()
    done, start = 0, None
    while done < steps:
        for x, y in _data(steps):
            if done == warmup:
                start = time.perf_counter()
            loss = loss_of(x, y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done == steps:
                break
    return time.perf_counter() - start, loss.item()


def run_tandem(steps: int, warmup: int) -> tuple[float, float]:
    """``Trainer.fit(torch.compile(module))``; the clock starts at the start of batch ``warmup``."""
    import torch
    from torch.nn import functional as F

    from tandem import Callback, Trainer, TrainingModule

    class MLP(TrainingModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

    class Clock(Callback):
        start = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if trainer.global_step == warmup:
                Clock.start = time.perf_counter()

    model = MLP()
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Clock()],
    )
    trainer.fit(torch.compile(model), _data(steps))
    seconds = time.perf_counter() - Clock.start
    assert trainer.global_step == steps, f"tandem took {trainer.global_step} steps, expected {steps}"
    return seconds, float(trainer.callback_metrics["loss"])


def worker(mode: str, steps: int, warmup: int) -> None:
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    if mode == "tandem_compiled":
        loop_s, final_loss = run_tandem(steps, warmup)
    else:
        loop_s, final_loss = run_raw(steps, warmup, compiled=mode == "raw_compiled")
    total_s = time.perf_counter() - start
    print(json.dumps({"mode": mode, "loop_s": loop_s, "total_s": total_s, "final_loss": final_loss}))


# ---------------------------------------------------------------------------- driver
def _spawn(mode: str, steps: int, warmup: int) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", mode, "--steps", str(steps), "--warmup", str(warmup)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"the {mode} worker failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="raw_compiled/tandem_compiled pairs to run")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=100, help="untimed first steps (compilation happens there)")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=f"exit 1 if the median ratio exceeds {TARGET_RATIO}")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.warmup)
        return

    timed = args.steps - args.warmup
    print(
        f"compile: MLP 32-64-10, batch {BATCH_SIZE}, SGD, {args.steps} steps ({timed} timed after {args.warmup}), "
        f"1 thread, inductor, {args.repeats} pairs of fresh processes"
    )
    print(
        f"{'pair':>4}  {'raw us':>7}  {'raw_c us':>8}  {'tandem_c us':>11}  {'tandem_c/raw_c':>14}  "
        f"{'raw_c/raw':>9}  {'tandem_c/raw':>12}  {'compile+run s (raw_c / tandem_c)':>32}"
    )
    rows = []
    for pair in range(args.repeats):
        order = ("raw", "raw_compiled", "tandem_compiled")
        if pair % 2:
            order = ("tandem_compiled", "raw_compiled", "raw")
        results = {mode: _spawn(mode, args.steps, args.warmup) for mode in order}
        raw, raw_c, tandem_c = (1e6 * results[m]["loop_s"] / timed for m in MODES)
        rows.append((raw, raw_c, tandem_c, tandem_c / raw_c, raw_c / raw, tandem_c / raw))
        print(
            f"{pair:>4}  {raw:>7.1f}  {raw_c:>8.1f}  {tandem_c:>11.1f}  {tandem_c / raw_c:>14.3f}  {raw_c / raw:>9.3f}  "
            f"{tandem_c / raw:>12.3f}  "
            f"{results['raw_compiled']['total_s']:>15.2f} / {results['tandem_compiled']['total_s']:.2f}"
        )
        losses = {m: results[m]["final_loss"] for m in ("raw_compiled", "tandem_compiled")}
        if abs(losses["raw_compiled"] - losses["tandem_compiled"]) > 1e-5:
            sys.exit(f"the compiled runs ended with different losses {losses}: they did not do the same work.")

    medians = [statistics.median(col) for col in zip(*rows)]
    raw, raw_c, tandem_c, ratio, raw_speedup, tandem_vs_raw = medians
    print(
        f"{'med':>4}  {raw:>7.1f}  {raw_c:>8.1f}  {tandem_c:>11.1f}  {ratio:>14.3f}  {raw_speedup:>9.3f}  "
        f"{tandem_vs_raw:>12.3f}"
    )
    verdict = "met" if ratio <= TARGET_RATIO else "MISSED"
    print(
        f"median ratio tandem_compiled/raw_compiled: {ratio:.3f}x (target <= {TARGET_RATIO}x: {verdict}); "
        f"tandem adds {tandem_c - raw_c:.1f} us per compiled step"
    )
    if args.check and ratio > TARGET_RATIO:
        sys.exit(1)


if __name__ == "__main__":
    main()
