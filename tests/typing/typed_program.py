"""A small user program with type annotations, as a user's editor and type checker see tandem.

``make test`` type-checks it (mypy, settings in pyproject.toml: ``tests/typing`` is among the checked files), and
``tests/test_typing.py`` runs ``main()`` on its tiny generated data, so the program is both checked and real.
It uses what a first program meets: a module with training and validation steps, a DataModule, a callback with
typed hooks, manual optimization through ``self.optimizers()``, ``trainer.callback_metrics`` and
``trainer.fit(..., datamodule=...)``.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem
from tandem.module import STEP_OUTPUT
from tandem.trainer.optim import OptimizerLRScheduler

Batch = Sequence[torch.Tensor]  # (inputs, targets), as the default collate gives a TensorDataset's items


class LinearData(tandem.DataModule):
    """``y = x @ w + noise`` on 4 features, generated in ``setup``: 3/4 for training, 1/4 for validation."""

    def __init__(self, samples: int = 64, batch_size: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.samples, self.batch_size = samples, batch_size
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None

    def setup(self, stage: str) -> None:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(self.samples, 4, generator=generator)
        y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.01 * torch.randn(self.samples, 1, generator=generator)
        split = self.samples * 3 // 4
        self.train_set, self.val_set = TensorDataset(x[:split], y[:split]), TensorDataset(x[split:], y[split:])

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        assert self.train_set is not None, "setup() makes the datasets"
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        assert self.val_set is not None, "setup() makes the datasets"
        return DataLoader(self.val_set, batch_size=self.batch_size)


class LinearModel(tandem.TrainingModule):
    """One linear layer, its validation and its optimizer; the subclasses train it."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        x, y = batch
        error = self(x) - y
        self.log_dict({"val_loss": error.pow(2).mean(), "val_mae": error.abs().mean()})

    def configure_optimizers(self) -> OptimizerLRScheduler:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)}


class Regressor(LinearModel):
    """Automatic optimization: ``training_step`` returns the loss, the Trainer steps."""

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss


class ManualRegressor(LinearModel):
    """Manual optimization: ``training_step`` steps its optimizer itself, through ``self.optimizers()``."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__(lr)
        self.automatic_optimization = False

    def training_step(self, batch: Batch, batch_idx: int) -> STEP_OUTPUT:
        optimizer = self.optimizers()
        assert not isinstance(optimizer, list), "configure_optimizers returns one optimizer"
        x, y = (tensor.to(self.device) for tensor in batch)
        loss = nn.functional.mse_loss(self(x), y)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        self.log("train_loss", loss, prog_bar=True)
        self.log("steps_seen", float(self.trainer.global_step), on_step=True, on_epoch=False)
        return {"loss": loss.detach()}

    def on_train_epoch_end(self) -> None:
        scheduler = self.lr_schedulers()  # manual optimization steps its schedulers itself
        if isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
            scheduler.step()


class LossHistory(tandem.Callback):
    """Keeps the training loss of every batch and the validation loss of every validation."""

    def __init__(self) -> None:
        self.train_losses: list[float] = []
        self.val_losses: list[float] = []

    def on_train_batch_end(
        self, trainer: tandem.Trainer, module: tandem.TrainingModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        loss = trainer.callback_metrics.get("train_loss")
        if loss is not None:
            self.train_losses.append(float(loss))

    def on_validation_epoch_end(self, trainer: tandem.Trainer, module: tandem.TrainingModule) -> None:
        if not trainer.sanity_checking:
            self.val_losses.append(float(trainer.callback_metrics["val_loss"]))


def main(root_dir: str, max_steps: int = 2) -> dict[str, float]:
    """Fit each regressor for ``max_steps`` optimizer steps, then validate it; returns what the runs measured."""
    tandem.seed_everything(0)
    measured: dict[str, float] = {}
    for module in (Regressor(), ManualRegressor()):
        history = LossHistory()
        trainer = tandem.Trainer(
            accelerator="cpu",
            max_steps=max_steps,
            default_root_dir=root_dir,
            callbacks=[history],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        trainer.fit(module, datamodule=LinearData())
        results = trainer.validate(module, datamodule=LinearData(), verbose=False)
        name = type(module).__name__
        measured[f"{name}/global_step"] = trainer.global_step
        measured[f"{name}/train_batches"] = len(history.train_losses)
        measured[f"{name}/val_loss"] = results[0]["val_loss"]
        measured[f"{name}/last_val_loss"] = history.val_losses[-1]
    return measured


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        for key, value in main(folder, max_steps=int(sys.argv[1]) if len(sys.argv) > 1 else 20).items():
            print(f"{key}: {value:.4g}")
