"""Per-step overhead of tandem's Trainer against a hand-written PyTorch loop.

The workload is deliberately tiny (an MLP 32 -> 64 -> 10, batches of 32, SGD, 3000 steps, one thread), so
that whatever the framework does per step shows up instead of hiding behind the matrix multiplications.
tandem runs with ``self.log("loss", loss)`` every step and the progress bar, checkpointing, logger and model
summary off.

Each measurement runs in its own process (this script with ``--worker raw|tandem``); the runs alternate
(raw, tandem, then tandem, raw, ...) and repeat, and the median of the per-pair ratios is reported.
Both workers use the same data, the same initial weights and the same batch order, and each warms up on
its own path (100 steps on a throwaway model) before the timed run; both print the final loss, which
must agree.

    python benchmarks/overhead.py                 # 5 pairs
    python benchmarks/overhead.py --repeats 9 --steps 5000
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

TARGET_RATIO = 1.05
BATCH_SIZE = 32
STEPS_PER_EPOCH = 300
WARMUP_STEPS = 100
LR = 0.05


# ---------------------------------------------------------------------------- workers (one per process)
def _data(steps: int):
    """The same fixed synthetic data for both workers: ``steps`` batches of 32 in a fixed order."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    generator = torch.Generator().manual_seed(1234)
    n = min(steps, STEPS_PER_EPOCH) * BATCH_SIZE
    x = torch.randn(n, 32, generator=generator)
    y = (x[:, :10].argmax(dim=1) + (x[:, 10] > 1).long()) % 10  # learnable, not trivial
    return DataLoader(TensorDataset(x, y), batch_size=BATCH_SIZE, shuffle=False)


def _mlp():
    import torch
    from torch import nn

    torch.manual_seed(0)  # the same initial weights in both workers
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def run_raw(steps: int) -> float:
    """The hand-written loop; returns the last step's loss."""
    import torch

    loader = _data(steps)
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    return raw_loop(loader, model, optimizer, steps).item()


def raw_loop(loader, model, optimizer, steps: int):
    """The loop itself (overhead_split.py times it alone); returns the last step's loss."""
    from torch.nn import functional as F

    model.train()
    done = 0
    while done < steps:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if done == steps:
                break
    return loss


def loop_timer():
    """A callback that times the training loop alone: ``seconds`` from ``on_train_start`` to ``on_train_end``."""
    import tandem

    class LoopTimer(tandem.Callback):
        def on_train_start(self, trainer, module):
            self.start = time.perf_counter()

        def on_train_end(self, trainer, module):
            self.seconds = time.perf_counter() - self.start

    return LoopTimer()


def run_tandem(steps: int) -> float:
    """The same training through tandem's Trainer; returns the last logged loss."""
    import torch
    from torch.nn import functional as F

    from tandem import Trainer, TrainingModule

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

    loader = _data(steps)
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
    )
    trainer.fit(model, loader)
    assert trainer.global_step == steps, f"tandem took {trainer.global_step} steps, expected {steps}"
    return float(trainer.callback_metrics["loss"])


def worker(mode: str, steps: int) -> None:
    """Time one run of ``mode`` in this process and print one JSON line."""
    import torch

    torch.set_num_threads(1)
    run = {"raw": run_raw, "tandem": run_tandem}[mode]
    run(WARMUP_STEPS)  # first-call costs (autograd, allocator, lazy imports) out of the timed run
    start = time.perf_counter()
    final_loss = run(steps)
    loop_s = time.perf_counter() - start
    print(json.dumps({"mode": mode, "steps": steps, "loop_s": loop_s, "final_loss": final_loss}))


# ---------------------------------------------------------------------------- driver
def _spawn(mode: str, steps: int) -> dict:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", mode, "--steps", str(steps)],
        capture_output=True,
        text=True,
        check=False,
    )
    wall_s = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"the {mode} worker failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall_s
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="raw/tandem pairs to run")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--worker", choices=("raw", "tandem"), help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=f"exit 1 if the median ratio exceeds {TARGET_RATIO}")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps)
        return

    print(
        f"overhead: MLP 32-64-10, batch {BATCH_SIZE}, SGD, {args.steps} steps, 1 thread, "
        f"{args.repeats} pairs of fresh processes"
    )
    print(
        f"{'pair':>4}  {'raw us/step':>11}  {'tandem us/step':>14}  {'ratio':>6}  "
        f"{'raw wall s':>10}  {'tandem wall s':>13}  final loss (raw / tandem)"
    )
    rows = []
    for pair in range(args.repeats):
        order = ("raw", "tandem") if pair % 2 == 0 else ("tandem", "raw")  # alternate who goes first
        results = {mode: _spawn(mode, args.steps) for mode in order}
        raw, tandem = results["raw"], results["tandem"]
        raw_us, tandem_us = (1e6 * r["loop_s"] / args.steps for r in (raw, tandem))
        ratio = tandem_us / raw_us
        rows.append((raw_us, tandem_us, ratio, raw["wall_s"], tandem["wall_s"]))
        same = "same" if abs(raw["final_loss"] - tandem["final_loss"]) <= 1e-6 else "DIFFERENT"
        print(
            f"{pair:>4}  {raw_us:>11.1f}  {tandem_us:>14.1f}  {ratio:>6.3f}  {raw['wall_s']:>10.2f}  "
            f"{tandem['wall_s']:>13.2f}  {raw['final_loss']:.6f} / {tandem['final_loss']:.6f} ({same})"
        )
        if same != "same":
            sys.exit("raw and tandem ended with different losses: they did not do the same work.")

    raw_us, tandem_us, ratio, raw_wall, tandem_wall = (statistics.median(col) for col in zip(*rows))
    print(f"{'med':>4}  {raw_us:>11.1f}  {tandem_us:>14.1f}  {ratio:>6.3f}  {raw_wall:>10.2f}  {tandem_wall:>13.2f}")
    verdict = "met" if ratio <= TARGET_RATIO else "MISSED"
    print(
        f"median ratio tandem/raw: {ratio:.3f}x (target <= {TARGET_RATIO}x: {verdict}); "
        f"tandem adds {tandem_us - raw_us:.1f} us per step"
    )
    if args.check and ratio > TARGET_RATIO:
        sys.exit(1)


if __name__ == "__main__":
    main()
