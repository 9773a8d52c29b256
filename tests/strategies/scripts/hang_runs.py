"""A two-rank ``Trainer(strategy=DDPStrategy(hang_timeout=3 s))`` fit under tandem's launcher, with one mistake that
hangs the job (each mode one job: a hang ends it). Rank 0 writes what its fit raised to ``<out>/raised0``.

Modes:
    skip_backward1  manual optimization; rank 1 skips manual_backward at batch 2 (DDP's gradient all-reduce hangs)
    all_reduce1     rank 1 alone calls torch.distributed.all_reduce in training_step at batch 2 (on a group of both
                    ranks made in setup: on the default group gloo pairs it with DDP's all-reduce and aborts on the
                    size mismatch instead of hanging)
    validate_all_reduce1  trainer.validate alone: rank 1 calls torch.distributed.all_reduce in validation_step at
                    batch 2
    slow_data1      rank 1's Dataset.__getitem__ sleeps (for 10 minutes) at its third batch (slow_data0: rank 0's)
    slow_setup0     no mistake: rank 0 spends 2 x hang_timeout in setup() (a download, say), before the loop starts
"""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import tandem
from tandem.strategies.ddp import DDPStrategy

MODE = sys.argv[1]
OUT = Path(sys.argv[2])
HANG_TIMEOUT = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
DEVICES = int(sys.argv[4]) if len(sys.argv) > 4 else 2


class Points(Dataset):
    def __len__(self) -> int:
        return 256

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if MODE.startswith("slow_data") and dist.get_rank() == int(MODE[-1]) and self.calls == 8:
            time.sleep(600)  # the mistake: a data loader that blocks on one rank
        self.calls += 1
        g = torch.Generator().manual_seed(index)
        return torch.randn(8, generator=g), torch.randint(0, 3, (), generator=g)

    calls = 0


class Model(tandem.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 3)
        self.automatic_optimization = MODE != "skip_backward1"

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        one = self.trainer.global_rank == 1 and batch_idx == 2
        if MODE == "all_reduce1" and one:
            dist.all_reduce(torch.ones(1), group=self.group)  # the mistake: a collective on one rank
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        opt.zero_grad()
        if not one:  # the mistake: rank 1 skips backward in one step
            self.manual_backward(loss)
        opt.step()
        return None

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        if MODE == "validate_all_reduce1" and self.trainer.global_rank == 1 and batch_idx == 2:
            dist.all_reduce(torch.ones(1), group=self.group)  # the mistake, in a validation run
        self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]), sync_dist=True)

    def setup(self, stage: str) -> None:
        if MODE == "slow_setup0" and dist.get_rank() == 0:
            time.sleep(2 * HANG_TIMEOUT)  # not a hang: no loop runs yet, the other rank waits in tandem's set-up
        self.group = dist.new_group([0, 1]) if MODE.endswith("all_reduce1") else None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    strategy = DDPStrategy(hang_timeout=datetime.timedelta(seconds=HANG_TIMEOUT))
    trainer = tandem.Trainer(
        accelerator="cpu",
        strategy=strategy,
        devices=DEVICES,
        max_steps=40,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    start = time.monotonic()
    try:
        if MODE.startswith("validate"):
            trainer.validate(Model(), DataLoader(Points(), batch_size=4))
        else:
            trainer.fit(Model(), DataLoader(Points(), batch_size=4))
    except BaseException as err:
        if trainer.global_rank == 0:
            (OUT / "raised0").write_text(f"{time.monotonic() - start:.1f}\n{type(err).__name__}: {err}")
        raise
    (OUT / f"done{trainer.global_rank}").write_text(f"{time.monotonic() - start:.1f}")


if __name__ == "__main__":
    main()
