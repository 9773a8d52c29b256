"""What TrainingModule and DataModule share besides their hyperparameters: the data hooks (where data comes from,
how a batch reaches the device), and ``logs_per_step``, the mark of a hook whose ``self.log`` defaults to per-step
values."""

from __future__ import annotations

from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn


def logs_per_step(hook: Any) -> Any:
    """Declare that ``self.log`` in ``hook`` defaults to ``on_step=True, on_epoch=False`` (every other hook:
    ``on_step=False, on_epoch=True``); the Trainer's hook dispatcher reads the mark."""
    hook.logs_per_step = True
    return hook


class DataHooks:
    """Where data comes from and how a batch reaches the device: shared by [`TrainingModule`][tandem.TrainingModule] and
    [`DataModule`][tandem.DataModule] (a DataModule's override wins). Transfer hooks are called only when overridden."""

    # ------------------------------------------------------------------ data (used when fit gets no loaders)
    def prepare_data(self) -> None:
        """Download or write data once per node (local rank 0); do not set state on ``self`` here."""

    def setup(self, stage: str) -> None:
        """Called on every process before the run, with ``stage`` in "fit" | "validate" | "test" | "predict"."""

    def teardown(self, stage: str) -> None:
        """Called on every process after the run."""

    def train_dataloader(self) -> Any:
        """The training loader, used when ``fit`` gets neither loaders nor a datamodule."""
        return None

    def val_dataloader(self) -> Any:
        """The validation loader(s): one, a list or a dict."""
        return None

    def test_dataloader(self) -> Any:
        return None

    def predict_dataloader(self) -> Any:
        return None

    # ------------------------------------------------------------------ batch transfer (called only when overridden)
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move ``batch`` to ``device``: tensors (and objects with ``.to``) inside any collection."""
        return apply_to_collection(batch, (torch.Tensor, nn.Module), lambda t: t.to(device, non_blocking=True))

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change the batch on the CPU before it moves to the device; return it."""
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change the batch on the device (e.g. GPU augmentations); return it."""
        return batch
