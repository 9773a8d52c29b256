"""Resume after a kill: a training process is killed (or pre-empted) mid-epoch, and the rerun continues exactly.

The script starts itself as a child process that trains with ``ModelCheckpoint(every_n_train_steps=N,
save_last=True)`` and is stopped at a chosen step by a signal it sends itself:

- ``--signal KILL`` (the default): killed outright, as by the out-of-memory killer or a lost node. Nothing runs
  after the signal, so the rerun continues from the last periodic ``last.ckpt``, redoing the steps after it.
- ``--signal TERM``: pre-empted, as a cluster does. tandem stops at the end of the current step, writes an exact
  ``last.ckpt`` there and exits with 143; the rerun continues from that very step.

Then it runs the same program again with ``trainer.fit(..., ckpt_path="last")``, and, for comparison, the whole
training uninterrupted; the two end with the same weights, bit for bit (a shuffled loader, dropout and Adam).

    python examples/resume.py                   # killed at step 130 of 200, resumed from step 100
    python examples/resume.py --signal TERM     # pre-empted at step 130, resumed from step 130
    python examples/resume.py --fast            # fewer steps and samples
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from tandem import Callback, Trainer, TrainingModule, seed_everything
from tandem.callbacks import ModelCheckpoint


class Classifier(TrainingModule):
    def __init__(self, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 5))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


RUN_FOLDER = "run folder: "


class StopAt(Callback):
    """Sends this process ``signum`` after global step ``step`` (what a kill or a pre-emption would do), having
    printed its run folder: each launch gets a new ``version_<n>``, and the parent reads this run's checkpoint."""

    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            print(f"{RUN_FOLDER}{trainer.log_dir}", flush=True)  # nothing is printed after a SIGKILL
            os.kill(os.getpid(), self.signum)


def plan(fast: bool) -> dict[str, int]:
    """Steps to train, when the child is stopped, how often last.ckpt is written, and the samples."""
    return (
        dict(max_steps=20, stop_at=13, every=5, samples=320)
        if fast
        else dict(max_steps=200, stop_at=130, every=50, samples=3200)
    )


def train(root: Path, fast: bool, ckpt_path: str | None = None, stop: StopAt | None = None) -> Classifier:
    steps = plan(fast)
    seed_everything(0)
    x = torch.randn(steps["samples"], 20)
    data = DataLoader(TensorDataset(x, x[:, :5].argmax(1)), batch_size=32, shuffle=True)  # 10 or 100 batches an epoch
    model = Classifier()
    trainer = Trainer(
        max_steps=steps["max_steps"],
        callbacks=[ModelCheckpoint(every_n_train_steps=steps["every"], save_last=True), *([stop] if stop else [])],
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=5,
    )
    trainer.fit(model, data, ckpt_path=ckpt_path)
    return model


def main(argv: list[str] | None = None) -> float:
    """Returns the largest difference between the resumed and the uninterrupted weights (0.0: exact)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signal", choices=["KILL", "TERM"], default="KILL", help="how the first run is stopped")
    parser.add_argument("--root-dir", default="runs/resume")
    parser.add_argument("--fast", action="store_true", help="fewer steps and samples")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # the run that gets stopped
    args = parser.parse_args(argv)
    root = Path(args.root_dir)
    signum = getattr(signal, f"SIG{args.signal}")

    if args.child:
        train(root / "stopped", args.fast, stop=StopAt(plan(args.fast)["stop_at"], signum))
        return 0.0

    command = [sys.executable, __file__, "--child", "--signal", args.signal, "--root-dir", str(root)]
    child = subprocess.run(command + (["--fast"] if args.fast else []), capture_output=True, text=True)
    expected = -signum if args.signal == "KILL" else 128 + signum  # tandem exits 143 after a SIGTERM stop
    if child.returncode != expected:
        raise SystemExit(
            f"the first run should have ended with {expected}, not {child.returncode}:\n{child.stderr[-3000:]}"
        )
    # this run's own file: an earlier run in the same --root-dir left its last.ckpt in another version_<n>
    run_folder = next(line[len(RUN_FOLDER) :] for line in child.stdout.splitlines() if line.startswith(RUN_FOLDER))
    last = torch.load(Path(run_folder) / "checkpoints" / "last.ckpt")
    print(
        f"first run: stopped by SIG{args.signal} after step {plan(args.fast)['stop_at']} (exit {child.returncode}); "
        f"last.ckpt holds step {last['global_step']}"
    )

    resumed = train(root / "stopped", args.fast, ckpt_path="last")  # the rerun: the newest last.ckpt of the run
    straight = train(root / "uninterrupted", args.fast)
    difference = max((a - b).abs().max().item() for a, b in zip(resumed.parameters(), straight.parameters()))
    print(f"resumed run against uninterrupted run: largest weight difference {difference}")
    return difference


if __name__ == "__main__":
    main()
