"""What ``Trainer(on_nonfinite="rollback")`` costs on overhead.py's tiny MLP: the whole fit against the default
``on_nonfinite="raise"``, and one snapshot (its time and memory) on its own.

With rollback every batch records its loss (a reference on the device), every publishing step
(``log_every_n_steps``, 50 here) reads the losses since the last one, and every ``every_n_checks``-th clean check
copies the module, the optimizers, the schedulers, the loop counters and the RNG states. The workload is
overhead.py's (MLP 32 -> 64 -> 10, batches of 32, SGD, one thread), the Trainer as there (no logger, no progress
bar, no checkpoints), so that a per-step cost shows instead of hiding behind the matrix multiplications.

Each run is a fresh process (``--worker raise|rollback``); the runs alternate and repeat, and the median of the
per-pair ratios is reported. Both print the final loss, which must agree (no batch is bad here: the rollback
run trains exactly the same steps).

    python benchmarks/rollback.py                    # 5 pairs, a snapshot at every check (every 50 steps)
    python benchmarks/rollback.py --every-n-checks 4 --log-every 10
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

from overhead import LR, WARMUP_STEPS, _data, _mlp  # noqa: E402

TARGET_RATIO = 1.03


def run(mode: str, steps: int, log_every: int, every_n_checks: int, optimizer: str = "sgd") -> tuple[float, object]:
    """One fit; returns the final loss and the Trainer."""
    import torch
    from torch.nn import functional as F

    from tandem import Trainer, TrainingModule
    from tandem.trainer import Rollback

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
            if optimizer == "adam":
                return torch.optim.Adam(self.parameters(), lr=1e-3)
            return torch.optim.SGD(self.parameters(), lr=LR)

    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=log_every,
        on_nonfinite=Rollback(every_n_checks=every_n_checks) if mode == "rollback" else "raise",
    )
    trainer.fit(MLP(), _data(steps))
    assert trainer.global_step == steps and not trainer.rollbacks
    return float(trainer.callback_metrics["loss"]), trainer


def snapshot_cost(optimizer: str, repeats: int = 500) -> dict:
    """Microseconds per snapshot and the bytes it holds, after a short fit (so the optimizer has its state)."""
    import torch

    from tandem.trainer.rollback import Rollback, RollbackGuard

    _, trainer = run("rollback", 100, 50, 1, optimizer)
    guard = RollbackGuard(Rollback(), trainer.strategy)
    loop, optimization = trainer.fit_loop, trainer.fit_loop.optimization
    args = (trainer.strategy, optimization, loop.state, trainer.metric_collector)
    guard.take(*args)  # the first allocates; the others copy into its tensors
    start = time.perf_counter()
    for _ in range(repeats):
        guard.take(*args)
    us = 1e6 * (time.perf_counter() - start) / repeats
    # what a snapshot copies: the parameters and buffers, and every tensor of the optimizers' state
    module = trainer.lightning_module
    tensors = [*module.parameters(), *module.buffers()]
    tensors += [t for o in trainer.optimizers for state in o.state.values() for t in state.values()]
    held = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    parameters = sum(p.numel() * p.element_size() for p in module.parameters())
    return {"optimizer": optimizer, "us": us, "bytes": held, "parameter_bytes": parameters}


def worker(mode: str, steps: int, log_every: int, every_n_checks: int) -> None:
    import torch

    torch.set_num_threads(1)
    run(mode, WARMUP_STEPS, log_every, every_n_checks)
    start = time.perf_counter()
    final_loss, _ = run(mode, steps, log_every, every_n_checks)
    loop_s = time.perf_counter() - start
    result = {"mode": mode, "loop_s": loop_s, "final_loss": final_loss}
    if mode == "rollback":
        result["snapshots"] = [snapshot_cost("sgd"), snapshot_cost("adam")]
    print(json.dumps(result))


def _spawn(mode: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--worker", mode, "--steps", str(args.steps)]
    command += ["--log-every", str(args.log_every), "--every-n-checks", str(args.every_n_checks)]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"the {mode} worker failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="raise/rollback pairs to run")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--log-every", type=int, default=50, help="log_every_n_steps: the checks")
    parser.add_argument("--every-n-checks", type=int, default=1, help="Rollback(every_n_checks=...)")
    parser.add_argument("--worker", choices=("raise", "rollback"), help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=f"exit 1 if the median ratio exceeds {TARGET_RATIO}")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.log_every, args.every_n_checks)
        return
    print(
        f"rollback: overhead.py's MLP, {args.steps} steps, 1 thread, log_every_n_steps={args.log_every}, a "
        f"snapshot every {args.every_n_checks} check(s), {args.repeats} pairs of fresh processes"
    )
    print(f"{'pair':>4}  {'raise us/step':>13}  {'rollback us/step':>16}  {'ratio':>6}  final loss")
    rows, snapshots = [], []
    for pair in range(args.repeats):
        order = ("raise", "rollback") if pair % 2 == 0 else ("rollback", "raise")
        results = {mode: _spawn(mode, args) for mode in order}
        plain, rolled = results["raise"], results["rollback"]
        plain_us, rolled_us = (1e6 * r["loop_s"] / args.steps for r in (plain, rolled))
        rows.append((plain_us, rolled_us, rolled_us / plain_us))
        snapshots.append(rolled["snapshots"])
        if abs(plain["final_loss"] - rolled["final_loss"]) > 1e-6:
            sys.exit("raise and rollback ended with different losses: they did not do the same work.")
        print(f"{pair:>4}  {plain_us:>13.1f}  {rolled_us:>16.1f}  {rows[-1][2]:>6.3f}  {plain['final_loss']:.6f}")
    plain_us, rolled_us, ratio = (statistics.median(col) for col in zip(*rows))
    print(f"{'med':>4}  {plain_us:>13.1f}  {rolled_us:>16.1f}  {ratio:>6.3f}")
    for i, first in enumerate(snapshots[0]):
        us = statistics.median(s[i]["us"] for s in snapshots)
        print(
            f"one snapshot ({first['optimizer']}): {us:.1f} us, holds {first['bytes']} bytes "
            f"({first['bytes'] / first['parameter_bytes']:.2f}x the parameters' {first['parameter_bytes']})"
        )
    verdict = "met" if ratio <= TARGET_RATIO else "MISSED"
    print(f"median ratio rollback/raise: {ratio:.3f}x (target <= {TARGET_RATIO}x: {verdict})")
    if args.check and ratio > TARGET_RATIO:
        sys.exit(1)


if __name__ == "__main__":
    main()
