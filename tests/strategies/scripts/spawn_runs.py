"""Trainer(strategy="ddp_spawn", devices=2) scenarios, one after the other in this process (each test process costs
seconds to start); results go to ``--out``.

    launcher     ddp_spawn without a Trainer, twice (``ddp_steps.run_spawn``): rank 0's return value, weights and
                 metrics back in the caller (spawn.pt); then rank 1 raises, and the caller's error goes to
                 error.txt
    seeded       seed_everything(7), dropout, shuffled data: fit then test with the default TensorBoard logger
                 and checkpointing; what the caller sees afterwards (weights, current_epoch, global_step,
                 log_dir, version folders) goes to seeded.pt; then the module and Trainer are dropped with
                 the garbage collector off, and those still alive are named in seeded-alive.txt
    unpicklable  a module holding a lock: the error the caller gets goes to unpicklable.txt (no process starts)
    killed       (last: the error ends this script) the seeded fit again, in a new Trainer and module after
                 seed_everything(7), but rank 1 SIGKILLs itself in its third training step while rank 0 is in
                 the gradient all-reduce; it first writes the time to killed-at, and the caller writes the time
                 it got the error to killed-reported-at

In both fits rank 0 saves its weights after two steps (dropout and the shuffled order have acted) to
``step2-<scenario>.pt``: seed_everything must make them equal.

Every spawned rank writes its pid to ``pid-<scenario>-<rank>`` so the test can check that none is left.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import threading
import time
import weakref
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem
from tandem.utilities.exceptions import TandemUserCodeError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_steps  # noqa: E402  (its module-level launcher scenario; spawned children find it on the same path)


class Classifier(tandem.TrainingModule):
    def __init__(self, out: str, scenario: str) -> None:
        super().__init__()
        self.out, self.scenario = out, scenario
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, 3))

    def on_fit_start(self) -> None:
        Path(self.out, f"pid-{self.scenario}-{self.global_rank}").write_text(str(os.getpid()))

    def on_train_batch_start(self, batch, batch_idx) -> None:
        if self.global_rank == 0 and self.trainer.global_step == 2:
            weights = {k: v.clone() for k, v in self.state_dict().items()}
            torch.save(weights, Path(self.out, f"step2-{self.scenario}.pt"))

    def training_step(self, batch, batch_idx):
        if self.scenario == "killed" and self.global_rank == 1 and self.trainer.global_step == 2:
            Path(self.out, "killed-at").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.cross_entropy(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class Writer:
    """Something a user might keep on a module: an open resource guarded by a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


def data() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 8, generator=g)
    y = ((x[:, 0] > 0).long() + (x[:, 1] > 0).long()) % 3
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)


def trainer(root: Path, **kwargs) -> tandem.Trainer:
    options = dict(
        accelerator="cpu",
        strategy="ddp_spawn",
        devices=2,
        max_epochs=2,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    return tandem.Trainer(**{**options, **kwargs})


def seeded(out: Path) -> None:
    tandem.seed_everything(7)
    module = Classifier(str(out), "seeded")
    fitter = trainer(out / "seeded")
    fitter.fit(module, data())
    after_fit = {"log_dir": fitter.log_dir, "epoch": fitter.current_epoch, "step": fitter.global_step}
    tested = fitter.test(module, data())
    torch.save(
        {
            "after_fit": after_fit,
            "log_dir": fitter.log_dir,
            "log_dir_exists": os.path.isdir(fitter.log_dir),
            "versions": sorted(os.listdir(out / "seeded" / "tandem_logs")),
            "best_model_path": fitter.checkpoint_callback.best_model_path,
            "tested": tested,
        },
        out / "seeded.pt",
    )
    # With Python's garbage collector off, dropping the run frees the module and the Trainer at once.
    refs = {"module": weakref.ref(module), "trainer": weakref.ref(fitter)}
    gc.collect()
    gc.disable()
    try:
        del module, fitter
        alive = [name for name, ref in refs.items() if ref() is not None]
    finally:
        gc.enable()
    (out / "seeded-alive.txt").write_text(" ".join(alive))


def unpicklable(out: Path) -> None:
    module = Classifier(str(out), "unpicklable")
    module.net.writer = Writer()
    try:
        trainer(out / "unpicklable", logger=False, enable_checkpointing=False).fit(module, data())
    except TandemUserCodeError as err:
        (out / "unpicklable.txt").write_text(str(err))


def killed(out: Path) -> None:
    tandem.seed_everything(7)
    module = Classifier(str(out), "killed")
    try:
        trainer(out / "killed", logger=False, enable_checkpointing=False).fit(module, data())
    finally:
        (out / "killed-reported-at").write_text(repr(time.time()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = Path(parser.parse_args().out)
    ddp_steps.run_spawn(out)
    ddp_steps.run_spawn(out, crash=True)
    seeded(out)
    unpicklable(out)
    killed(out)
