"""The hooks a user overrides, as Lightning's ``core/hooks.py``: ``DataHooks``, which TrainingModule and DataModule
share (where data comes from, how a batch reaches the device), the TrainingModule's ``ModelHooks`` (its run's
lifecycle, the backward, its mode around an evaluation) and ``CheckpointHooks``; and ``logs_per_step``, the mark of a
hook whose ``self.log`` defaults to per-step values."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn

if TYPE_CHECKING:
    from tandem.module.training_module import STEP_OUTPUT


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


class ModelHooks:
    """The hooks of a [`TrainingModule`][tandem.TrainingModule]'s run (Lightning's ``ModelHooks``), all optional:
    its stages' starts and ends, the backward and what comes before and after it, and the module's mode around an
    evaluation."""

    if TYPE_CHECKING:  # what the mode hooks use of the TrainingModule they are part of

        def zero_grad(self, set_to_none: bool = True) -> None: ...
        def _stepped_model(self) -> nn.Module: ...

    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    @logs_per_step
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        """Return -1 to skip the rest of this epoch (Lightning's)."""
        return None

    @logs_per_step
    def on_train_batch_end(self, outputs: STEP_OUTPUT, batch: Any, batch_idx: int) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(
        self, outputs: STEP_OUTPUT, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(self, outputs: STEP_OUTPUT, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Lightning's hook for the backward pass the Trainer runs (automatic optimization) and
        ``manual_backward``: ``loss.backward(*args, **kwargs)``. Override it to run the backward otherwise (e.g.
        ``loss.backward(retain_graph=True)``); under float16 scaling ``loss`` is already scaled."""
        loss.backward(*args, **kwargs)

    @logs_per_step
    def on_before_backward(self, loss: torch.Tensor) -> None: ...
    @logs_per_step
    def on_after_backward(self) -> None: ...
    @logs_per_step
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...
    @logs_per_step
    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None: ...

    # ------------------------------------------------------------------ the module's mode around an evaluation
    # The loops record every submodule's ``training`` flag before an evaluation and give each its own back after it
    # (a frozen BatchNorm stays in eval mode); the fit itself never calls ``train()``. Override to change the switch.
    def on_validation_model_zero_grad(self) -> None:
        """Called by the fit before a validation that follows an optimizer step: releases the gradients."""
        self.zero_grad()

    def on_validation_model_eval(self) -> None:
        """Called as validation starts: puts the model in eval mode (see
        [`on_validation_model_train`][tandem.TrainingModule.on_validation_model_train])."""
        self._stepped_model().eval()

    def on_validation_model_train(self) -> None:
        """Called as validation ends, only when overridden: by default each submodule gets back the mode it had
        before validation. An override takes that over (``super()`` puts the whole model in training mode)."""
        self._stepped_model().train()

    def on_test_model_eval(self) -> None:
        """Called as testing starts: puts the model in eval mode (see
        [`on_test_model_train`][tandem.TrainingModule.on_test_model_train])."""
        self._stepped_model().eval()

    def on_test_model_train(self) -> None:
        """Called as testing ends, only when overridden: by default each submodule gets back the mode it had
        before testing. An override takes that over (``super()`` puts the whole model in training mode)."""
        self._stepped_model().train()

    def on_predict_model_eval(self) -> None:
        """Called as prediction starts: puts the model in eval mode (each submodule's mode returns after it)."""
        self._stepped_model().eval()


class CheckpointHooks:
    """What a [`TrainingModule`][tandem.TrainingModule] adds to a checkpoint it saves, and reads from one it loads
    (Lightning's ``CheckpointHooks``)."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
