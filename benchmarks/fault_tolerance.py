"""What a dead replica costs: ``ddp_ft`` (torchft replica groups) against ``ddp`` under ``torchrun --max-restarts``.

The same fit runs three ways on the CPU, and in each one process of the job is SIGKILLed (from outside, at a random
step of the second epoch) and started again:

- ``ddp_ft``, 2 and 3 replica groups of one process (``tandem.strategies.ft_launch.ReplicaGroupsRun``: a lighthouse,
  each group under its own restart loop): the killed group's step fails on the others, runs again without it, and the
  restarted group takes their live state and joins;
- ``ddp``, 2 processes under ``torchrun --standalone --max-restarts 1``, a checkpoint at every epoch's end: torchrun
  restarts every process and they resume from ``last.ckpt``.

Every process records each step it completes (the step, its start count, the time). Reported, for the process that
was not killed (group 0, or rank 0):

- **stall**: the longest wait between two of its steps, less the median step time (under ``ddp``: from its last step
  before the kill until it trains a step it had not trained before, the restart and the replay included);
- **steps lost**: steps trained before the kill whose work was thrown away and trained again (under ``ddp``, those since
  the last checkpoint; under ``ddp_ft`` none: the step in flight runs again, as one attempt);
- **back after**: from the kill until the killed process trains again (its restart, its imports, its recovery);
- the job's wall time.

    python benchmarks/fault_tolerance.py                  # ddp_ft x2, ddp_ft x3, ddp (2 processes), seed 0
    python benchmarks/fault_tolerance.py --runs ft2 --seed 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EPOCHS, STEPS_PER_EPOCH, BATCH, FEATURES, HIDDEN = 3, 60, 64, 1024, 4096
_POLL_S = 0.02


# ---------------------------------------------------------------------- one process of the job
def worker(out: Path, strategy: str, replicas: int) -> None:
    """The fit: an MLP on random data, a checkpoint at every epoch's end, each step recorded."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import tandem
    from tandem.callbacks import Callback, ModelCheckpoint

    ft = strategy == "ddp_ft"
    me = int(os.environ["REPLICA_GROUP_ID"] if ft else os.environ["RANK"])
    start = int(os.environ["TANDEM_FT_RESTARTS"] if ft else os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    (out / f"pid_{me}").write_text(str(os.getpid()))
    tandem.seed_everything(0)
    samples = STEPS_PER_EPOCH * replicas * BATCH
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(samples, FEATURES, generator=g), torch.randint(0, 10, (samples,), generator=g))

    class MLP(tandem.TrainingModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 10))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.cross_entropy(self.net(x), y)
            self.log("loss", loss, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Record(Callback):
        def setup(self, trainer, module, stage):  # ddp_ft's first start: every group's manager beats before any
            if ft and start == 0:  # quorum, so that the first quorum waits for all (as torchrun's rendezvous does)
                (out / f"ready_{me}").touch()
                while len(list(out.glob("ready_*"))) < replicas:
                    time.sleep(0.05)

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            with open(out / f"steps_{me}.jsonl", "a") as f:
                f.write(json.dumps({"start": start, "step": trainer.global_step - 1, "time": time.monotonic()}) + "\n")

    trainer = tandem.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1 if ft else replicas,
        max_epochs=EPOCHS,
        num_sanity_val_steps=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Record(), ModelCheckpoint(dirpath=out / "checkpoints", save_last=True)],
    )
    trainer.fit(MLP(), DataLoader(data, batch_size=BATCH, shuffle=True), ckpt_path="last")


# ---------------------------------------------------------------------- the runs
def _records(out: Path, me: int) -> list[dict]:
    path = out / f"steps_{me}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _kill_at(out: Path, step: int, victim: int, kill: object) -> float:
    """Wait until process 0 has trained ``step``, then kill the victim; the time of the kill."""
    deadline = time.monotonic() + 300
    while not any(r["step"] >= step for r in _records(out, 0)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process 0 did not reach step {step} in 300 s; see the logs in {out}")
        time.sleep(_POLL_S)
    victim_pid = int((out / f"pid_{victim}").read_text())
    kill(victim_pid)  # type: ignore[operator]
    return time.monotonic()


def run_ft(out: Path, groups: int, kill_step: int) -> dict:
    from tandem.strategies.ft_launch import ReplicaGroupsRun

    command = [sys.executable, __file__, "--worker", "ddp_ft", "--replicas", str(groups), "--out", str(out)]
    run = ReplicaGroupsRun(command, groups, max_restarts=1, log_dir=out, cwd=out)
    begun = time.monotonic()
    run.start()
    try:
        killed = _kill_at(out, kill_step, groups - 1, lambda pid: os.kill(pid, signal.SIGKILL))
        code = run.wait(timeout=600)
    finally:
        run.stop()
    if code != 0:
        raise RuntimeError(f"ddp_ft x{groups} failed ({code}); see {out}/group_*.log")
    return _figures(out, groups - 1, killed, time.monotonic() - begun, restarted_all=False)


def run_ddp(out: Path, processes: int, kill_step: int) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    command += ["--max-restarts=1", __file__, "--worker", "ddp", "--replicas", str(processes), "--out", str(out)]
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}
    begun = time.monotonic()
    with open(out / "torchrun.log", "wb") as log:
        job = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=out)
        try:
            killed = _kill_at(out, kill_step, processes - 1, lambda pid: os.kill(pid, signal.SIGKILL))
            code = job.wait(timeout=600)
        finally:
            if job.poll() is None:
                job.kill()
    if code != 0:
        raise RuntimeError(f"ddp under torchrun failed ({code}); see {out}/torchrun.log")
    return _figures(out, processes - 1, killed, time.monotonic() - begun, restarted_all=True)


def _figures(out: Path, victim: int, killed: float, wall: float, restarted_all: bool) -> dict:
    healthy = _records(out, 0)
    before = [r for r in healthy if r["time"] < killed]
    step_time = statistics.median(b["time"] - a["time"] for a, b in zip(before, before[1:]))
    if restarted_all:  # every process started again from the checkpoint: process 0's steps after the restart
        last = max(r["step"] for r in before)
        after = [r for r in healthy if r["start"] > 0]
        lost = last + 1 - after[0]["step"]
        new = next(r for r in after if r["step"] > last)
        stall = new["time"] - max(r["time"] for r in before) - step_time
    else:
        lost = len(healthy) - len({r["step"] for r in healthy})  # steps process 0 trained twice
        stall = max(b["time"] - a["time"] for a, b in zip(healthy, healthy[1:])) - step_time
    back = min((r["time"] for r in _records(out, victim) if r["start"] > 0), default=math.nan) - killed
    return {"step_s": step_time, "stall_s": stall, "lost": lost, "back_s": back, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=("ddp_ft", "ddp"), help=argparse.SUPPRESS)
    parser.add_argument("--replicas", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--runs", nargs="+", default=["ft2", "ft3", "ddp"], choices=("ft2", "ft3", "ddp"))
    parser.add_argument("--seed", type=int, default=0, help="picks the step of the kill")
    options = parser.parse_args()
    if options.worker:
        worker(options.out, options.worker, options.replicas)
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    kill_step = random.Random(options.seed).randint(STEPS_PER_EPOCH + 2, 2 * STEPS_PER_EPOCH - 3)
    print(
        f"{EPOCHS} epochs of {STEPS_PER_EPOCH} steps; one process SIGKILLed after step {kill_step} (epoch 1)",
        flush=True,
    )
    rows = []
    for name in options.runs:
        with tempfile.TemporaryDirectory(prefix=f"tandem_ft_{name}_") as folder:
            if name == "ddp":
                figures, label = run_ddp(Path(folder), 2, kill_step), "ddp, 2 processes, torchrun --max-restarts 1"
            else:
                groups = int(name[2:])
                figures, label = run_ft(Path(folder), groups, kill_step), f"ddp_ft, {groups} replica groups"
        rows.append((label, figures))
        print(
            f"  {label}: "
            + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()),
            flush=True,
        )
    print("\n| run | step (s) | healthy replica's stall (s) | steps lost | killed replica back after (s) | job (s) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, f in rows:
        print(
            f"| {label} | {f['step_s']:.3f} | {f['stall_s']:.1f} | {f['lost']} | {f['back_s']:.1f} | {f['wall_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
