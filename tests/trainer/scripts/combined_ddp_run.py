"""A dict of two shuffled training loaders under ``Trainer(strategy="ddp", devices=2, data_order="global")``, in each
CombinedLoader mode, and a mid-epoch checkpoint of it resumed; the same with a ``training_step(self, dataloader_iter)``.
``run(2, folder)`` is the ``combined`` scenario of the trainer tests' shared DDP launch (``core_ddp_runs.py``), where
each rank saves what it saw; ``tests/trainer/test_combined_loader_ddp.py`` runs the same programs on one process
(``run(world=1)``) and compares.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem
from tandem.callbacks import ModelCheckpoint
from tandem.utilities import CombinedLoader
from tandem.utilities.data import find_sampler
from tandem.utilities.exceptions import PossibleUserWarning

MODES = ("max_size_cycle", "min_size", "max_size")


def marked(n: int, offset: int) -> TensorDataset:
    """``n`` samples whose first feature names them (``offset + i``, over 1000)."""
    g = torch.Generator().manual_seed(offset)
    x = torch.randn(n, 4, generator=g)
    x[:, 0] = (torch.arange(n) + offset) / 1000
    return TensorDataset(x, torch.randn(n, 1, generator=g))


def loaders(batch_size: int) -> dict[str, DataLoader]:
    """ "a": 12 samples, "b": 20; ``batch_size`` per process (one process: the global batch)."""
    return {
        "a": DataLoader(marked(12, 0), batch_size=batch_size, shuffle=True),
        "b": DataLoader(marked(20, 100), batch_size=batch_size, shuffle=True),
    }


class Recording(tandem.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.seen: list[dict[str, list[int] | None]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append(
            {k: None if v is None else [round(float(i) * 1000) for i in v[0][:, 0]] for k, v in batch.items()}
        )
        return sum(F.mse_loss(self.net(v[0]), v[1]) for v in batch.values() if v is not None)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class TakingTwo(Recording):
    """``training_step(self, dataloader_iter)`` taking two batches a step (one at the end of an odd epoch)."""

    def training_step(self, dataloader_iter: Any) -> torch.Tensor:
        losses = []
        for _ in range(2):
            try:
                batch, batch_idx, _ = next(dataloader_iter)
            except StopIteration:
                break
            losses.append(super().training_step(batch, batch_idx))
        return sum(losses)


def _trainer(world: int, **kwargs: Any) -> tandem.Trainer:
    return tandem.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        data_order="global",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in kwargs.get("callbacks", [])),
        **kwargs,
    )


def _fit(
    world: int, mode: str, ckpt: Path | None = None, module: type[Recording] = Recording, **kwargs: Any
) -> tuple[Recording, tandem.Trainer]:
    tandem.seed_everything(7)
    model = module()
    trainer = _trainer(world, **kwargs)
    trainer.fit(model, CombinedLoader(loaders(4 // world), mode), ckpt_path=ckpt)
    return model, trainer


def run(world: int, folder: Path) -> dict[str, Any]:
    """Every mode for 2 epochs; then max_size_cycle stopped at step 4 with a checkpoint (mid-epoch: "a", 3 batches,
    in its second pass), and resumed to the end; then the dataloader_iter step's fit and resume (:func:`_iter_fits`)."""
    result: dict[str, Any] = {}
    for mode in MODES:
        model, trainer = _fit(world, mode, max_epochs=2)
        samplers = [type(find_sampler(loader)).__name__ for loader in trainer.train_dataloader.values()]
        result[mode] = {
            "seen": model.seen,
            "batches": trainer.num_training_batches,
            "steps": trainer.global_step,
            "samplers": samplers,
            "weights": {k: v.clone() for k, v in model.state_dict().items()},
        }
    saving = ModelCheckpoint(dirpath=folder / f"ckpt{world}", every_n_train_steps=4, filename="{step}", save_top_k=-1)
    _fit(world, "max_size_cycle", max_epochs=2, max_steps=4, callbacks=[saving])
    model, trainer = _fit(world, "max_size_cycle", ckpt=folder / f"ckpt{world}" / "step=4.ckpt", max_epochs=2)
    result["resumed"] = {"seen": model.seen, "weights": {k: v.clone() for k, v in model.state_dict().items()}}
    # the dataloader_iter step: 5 batches an epoch taken 2 a step; then stopped at step 2 (batch 4) and resumed
    with warnings.catch_warnings():  # the flavour's announcement (tests/trainer/test_dataloader_iter.py asserts it)
        warnings.filterwarnings("ignore", "Found `dataloader_iter` argument", PossibleUserWarning)
        result.update(_iter_fits(world, folder))
    return result


def _iter_fits(world: int, folder: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    model, trainer = _fit(world, "max_size_cycle", module=TakingTwo, max_epochs=2)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    result["iter"] = {"seen": model.seen, "steps": trainer.global_step, "weights": weights}
    saving = ModelCheckpoint(dirpath=folder / f"iter{world}", every_n_train_steps=2, filename="{step}", save_top_k=-1)
    _fit(world, "max_size_cycle", module=TakingTwo, max_epochs=2, max_steps=2, callbacks=[saving])
    ckpt = folder / f"iter{world}" / "step=2.ckpt"
    model, trainer = _fit(world, "max_size_cycle", ckpt=ckpt, module=TakingTwo, max_epochs=2)
    result["iter_resumed"] = {"seen": model.seen, "weights": {k: v.clone() for k, v in model.state_dict().items()}}
    return result
