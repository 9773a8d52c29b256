"""Two fits of the same model on two gloo ranks under tandem's launcher: a clean one, then one during which an
outsider writes the process group's store (``test_side_channel_forgery.py`` is the outsider: it connects to the store
at MASTER_PORT as a client of its own). Rank 0 pauses the second fit at epoch 0, batch 3 (rank 1 then waits in DDP's
gradient all-reduce), writes ``<out>/ready``, and goes on when ``<out>/forged`` appears. Each rank saves what it saw
to ``<out>/rank<r>.pt``: both fits' weights and steps, and after the second fit whether its side channel's watcher
still runs and beats, whether the channel says the job is torn down, and whether a pre-emption or a hang is pending.

usage: forged_store_fit.py OUT  (MASTER_ADDR and MASTER_PORT set: the outsider's way in)
"""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem
from tandem.strategies.ddp import DDPStrategy
from tandem.strategies.side_channel.group import current_channel
from tandem.utilities.preemption import PREEMPTION

OUT = Path(sys.argv[1])
g = torch.Generator().manual_seed(1)
X = torch.randn(64, 8, generator=g)
Y = ((X[:, 0] > 0).long() + (X[:, 1] > 0).long()) % 3
PAUSE_AT = (0, 3)  # (epoch, batch) where rank 0 waits for the outsider in the second fit
#: far above the pause: a hang would be declared only if the outsider made one look real
HANG_TIMEOUT = datetime.timedelta(seconds=60)


class Net(tandem.TrainingModule):
    def __init__(self, pause: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        self.pause = pause

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.pause and self.global_rank == 0 and (self.current_epoch, batch_idx) == PAUSE_AT:
            (OUT / "ready").write_text("")
            deadline = time.monotonic() + 90
            while not (OUT / "forged").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("loss", loss, sync_dist=True)  # a checked collective at each publishing step
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def fit(name: str, pause: bool) -> tuple[tandem.Trainer, Net]:
    tandem.seed_everything(7)
    model = Net(pause)
    trainer = tandem.Trainer(
        strategy=DDPStrategy(hang_timeout=HANG_TIMEOUT),
        accelerator="cpu",
        devices=2,
        max_epochs=2,
        log_every_n_steps=2,
        default_root_dir=OUT / name,
        logger=False,
        enable_checkpointing=False,  # the only checkpoint a fit could write: a pre-emption stop's last.ckpt
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    data = DataLoader(TensorDataset(X, Y), batch_size=4)
    trainer.fit(model, data, DataLoader(TensorDataset(X[:16], Y[:16]), batch_size=4))
    return trainer, model


if __name__ == "__main__":
    clean, clean_model = fit("clean", pause=False)
    forged, forged_model = fit("forged", pause=True)
    channel = current_channel()
    assert channel is not None
    rank = forged.global_rank
    first_beat = channel.beat(rank)
    time.sleep(2.5)  # two beats or more
    last_beat = channel.beat(rank)
    result = {
        "clean": {k: v.clone() for k, v in clean_model.state_dict().items()},
        "forged": {k: v.clone() for k, v in forged_model.state_dict().items()},
        "steps": (clean.global_step, forged.global_step),
        "watcher_alive": channel._watcher.is_alive(),
        "beats": (first_beat.number if first_beat else None, last_beat.number if last_beat else None),
        "torn_down": channel.torn_down(),
        "preemption": (PREEMPTION.signum, PREEMPTION.stopped),
        "hang": channel.hang,
        "hang_timeout": channel.hang_timeout,
    }
    torch.save(result, OUT / f"rank{rank}.pt")
    forged.strategy.barrier()
