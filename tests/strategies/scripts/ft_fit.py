"""One replica group of a ``ddp_ft`` fit (started by ``ReplicaGroupsRun``; see tests/strategies/test_ddp_ft.py and
benchmarks/fault_tolerance.py).

Every committed step appends a record to ``<out>/steps_<group>.jsonl`` (the group, its start, the epoch, the global
step, the dataset indices this group trained in it, the time); the fit's end writes the weights to
``<out>/weights_<group>.pt``. Group ``--kill-group``, on its first start, SIGKILLs itself as the batch of global step
``--kill-step`` begins (after the step's quorum took it in: the other groups' step fails and runs again).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import tandem
from tandem.callbacks import Callback, ModelCheckpoint
from tandem.loggers import CSVLogger


class Indexed(Dataset):
    """A regression dataset whose samples carry their index."""

    def __init__(self, n: int, features: int = 4) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, features, generator=g)
        self.y = self.x @ torch.arange(1.0, features + 1) + 0.1 * torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return i, self.x[i], self.y[i]


class Regression(tandem.TrainingModule):
    def __init__(self, features: int = 4, alone_sleep: float = 0.0) -> None:
        super().__init__()
        self.layer = nn.Linear(features, 1)
        self.alone_sleep = alone_sleep
        self.indices: list[int] = []

    def training_step(self, batch, batch_idx):
        index, x, y = batch
        self.indices = index.tolist()  # the attempt that commits is the last one
        if self.alone_sleep and self.trainer.strategy.replica_groups.participants == 1:
            time.sleep(self.alone_sleep)  # a slow step while alone: a restarted group is back before the end
        loss = nn.functional.mse_loss(self.layer(x).squeeze(-1), y)
        self.log("loss", loss, on_step=True, on_epoch=True, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


class StartTogether(Callback):
    """On the groups' first start: wait, once this group's torchft manager beats (it starts with the strategy), until
    every group's does, so that the first quorum waits for all of them (the lighthouse waits for groups that beat)
    and every group trains from step 0 (else the first one up trains alone until the others join)."""

    def __init__(self, out: Path, group: int, groups: int, restarts: int) -> None:
        self.out, self.group, self.groups, self.restarts = out, group, groups, restarts

    def setup(self, trainer, module, stage):
        if self.restarts:
            return
        (self.out / f"ready_{self.group}").touch()
        deadline = time.monotonic() + 120
        while len(list(self.out.glob("ready_*"))) < self.groups and time.monotonic() < deadline:
            time.sleep(0.05)


class Record(Callback):
    def __init__(self, out: Path, group: int, restarts: int, kill_group: int, kill_step: int) -> None:
        self.path = out / f"steps_{group}.jsonl"
        self.group, self.restarts, self.kill_group, self.kill_step = group, restarts, kill_group, kill_step

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.group == self.kill_group and self.restarts == 0 and trainer.global_step >= self.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        record = {
            "group": self.group,
            "start": self.restarts,
            "epoch": trainer.current_epoch,
            "step": trainer.global_step - 1,
            "batch_idx": batch_idx,
            "indices": module.indices,
            "batch": batch[0].tolist(),
            "time": time.monotonic(),
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--kill-group", type=int, default=-1)
    parser.add_argument("--kill-step", type=int, default=-1)
    parser.add_argument("--alone-sleep", type=float, default=0.0)
    args = parser.parse_args()
    group, groups = int(os.environ.get("REPLICA_GROUP_ID", "0")), int(os.environ.get("NUM_REPLICA_GROUPS", "1"))
    restarts = int(os.environ.get("TANDEM_FT_RESTARTS", "0"))
    tandem.seed_everything(0)
    loader = DataLoader(Indexed(args.samples), batch_size=args.batch_size, shuffle=True)
    model = Regression(alone_sleep=args.alone_sleep)
    strategy = tandem.strategies.DDPFTStrategy(step_timeout=__import__("datetime").timedelta(seconds=30))
    trainer = tandem.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_epochs=args.epochs,
        log_every_n_steps=1,
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=CSVLogger(args.out / f"logs_{group}", name="", version=f"start_{restarts}"),
        callbacks=[
            StartTogether(args.out, group, groups, restarts),
            Record(args.out, group, restarts, args.kill_group, args.kill_step),
            ModelCheckpoint(dirpath=args.out / "checkpoints", save_last=True, save_top_k=0),
        ],
    )
    trainer.fit(model, loader, ckpt_path="last")  # a group alone after a restart continues the run's checkpoint
    torch.save(model.state_dict(), args.out / f"weights_{group}.pt")


if __name__ == "__main__":
    main()
