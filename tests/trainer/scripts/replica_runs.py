"""The DDP replica checks on two gloo ranks: four small fits in one process group. The test starts both ranks
itself (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as torchrun would), so a fit that fails on every
rank leaves the ranks running for the next one; each rank saves what it saw to ``<out>/rank<r>.pt``.

    manual     manual optimization calling loss.backward() instead of self.manual_backward(loss): the ranks'
               weights diverge; an error at the first epoch end
    buffer     a buffer updated on rank 1 only: an error before the first checkpoint save, nothing written
    same_data  an IterableDataset giving both ranks the same batches: a warning, once, from rank 0
    normal     a BatchNorm model with sharded data and checkpoints: neither error nor warning, though the
               ranks' running statistics differ

    python replica_runs.py OUT
"""

from __future__ import annotations

import faulthandler
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import tandem
from tandem.callbacks import ModelCheckpoint
from tandem.utilities.exceptions import ReplicasDivergedError

FEATURES = 6
QUIET = dict(
    strategy="ddp",
    accelerator="cpu",
    devices=2,
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
)


def dataset(n: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(11)
    return TensorDataset(torch.randn(n, FEATURES, generator=g), torch.randn(n, 1, generator=g))


class Regression(tandem.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return (self.net(x) - y).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class LossBackward(Regression):
    """Manual optimization calling ``loss.backward()``: DDP does not average the gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt = self.optimizers()
        opt.zero_grad()
        super().training_step(batch, batch_idx).backward()
        opt.step()


class OneRankBuffer(Regression):
    """Rank 1 counts its steps in a buffer; rank 0 does not."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.zeros(()))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_rank == 1:
            self.seen += 1
        return super().training_step(batch, batch_idx)


class Normalized(Regression):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(FEATURES)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return super().training_step((self.norm(batch[0]), batch[1]), batch_idx)


class SameOnEveryRank(IterableDataset):
    def __iter__(self) -> Any:
        return iter(dataset(16))


def fit(model: tandem.TrainingModule, data: Any, folder: Path | None = None, **kwargs: Any) -> tandem.Trainer:
    callbacks = [ModelCheckpoint(dirpath=folder, every_n_train_steps=2, save_top_k=-1)] if folder else []
    trainer = tandem.Trainer(callbacks=callbacks, enable_checkpointing=folder is not None, **QUIET, **kwargs)
    trainer.fit(model, data)
    return trainer


def error(model: tandem.TrainingModule, data: Any, folder: Path | None = None) -> str | None:
    try:
        fit(model, data, folder, max_epochs=1)
    except ReplicasDivergedError as raised:
        return str(raised)
    return None


def main(out: Path) -> None:
    loader = DataLoader(dataset(), batch_size=4)
    result: dict[str, Any] = {"manual": error(LossBackward(), loader)}
    result["buffer"] = error(OneRankBuffer(), loader, out / "buffer")
    result["buffer_files"] = sorted(os.listdir(out / "buffer")) if (out / "buffer").exists() else []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(Regression(), DataLoader(SameOnEveryRank(), batch_size=4), max_epochs=2)
    result["same_data"] = [str(w.message) for w in caught if "same first training batch" in str(w.message)]
    model = Normalized()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = fit(model, loader, out / "normal", max_epochs=2)
    statistics = trainer.strategy.all_gather(model.norm.running_mean)
    result["normal"] = {
        "warnings": [str(w.message) for w in caught],
        "epochs": trainer.current_epoch,
        "saved": sorted(os.listdir(out / "normal")),
        "running_mean_differs": not torch.equal(statistics[0], statistics[1]),
    }
    torch.save(result, out / f"rank{dist.get_rank()}.pt")


if __name__ == "__main__":
    faulthandler.dump_traceback_later(100, exit=True)  # a hang fails with its stack shown
    faulthandler.enable(all_threads=True)  # an abort at exit (seen once, rank 1, SIGABRT) shows every thread's stack
    main(Path(sys.argv[1]))
