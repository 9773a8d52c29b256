"""The Callback base class: every hook the Trainer fires, all no-ops."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from tandem.utilities.exceptions import LogCallError
from tandem.utilities.logged_values import running_module

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer


class Callback:
    """Code that observes or steers a run from outside the module.

    Hooks receive the Trainer and the module and run on every process, in the order the callbacks were
    given; gate side effects on ``trainer.is_global_zero``. Read the Trainer's public attributes
    (``current_epoch``, ``global_step``, ``callback_metrics``, ``loggers``, ...). A callback that has
    state for checkpoints returns it from ``state_dict`` and gets it back in ``load_state_dict``.

    The evaluation batch hooks (``on_validation_batch_end`` and friends) get ``dataloader_idx`` only when
    the stage has several loaders; declare it as ``dataloader_idx=0``, as Lightning does.

    Example:
        ```python
        class PrintLoss(Callback):
            def on_train_epoch_end(self, trainer, module):
                if trainer.is_global_zero:
                    print(trainer.current_epoch, float(trainer.callback_metrics["train_loss"]))
        ```
    """

    @property
    def state_key(self) -> str:
        """The key of this callback's state in checkpoints; unique among the callbacks of a run."""
        return type(self).__qualname__

    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None: ...
    def teardown(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None: ...
    def on_fit_start(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_fit_end(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_sanity_check_start(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_sanity_check_end(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_train_start(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_train_end(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_train_epoch_start(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_train_epoch_end(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_train_batch_start(self, trainer: Trainer, module: TrainingModule, batch: Any, batch_idx: int) -> None: ...
    def on_train_batch_end(
        self, trainer: Trainer, module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None: ...
    def on_validation_start(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_validation_end(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_validation_epoch_start(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_validation_epoch_end(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_validation_batch_start(
        self, trainer: Trainer, module: TrainingModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        module: TrainingModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...
    def on_test_start(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_test_end(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_test_epoch_start(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_test_epoch_end(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_test_batch_start(
        self, trainer: Trainer, module: TrainingModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...
    def on_test_batch_end(
        self,
        trainer: Trainer,
        module: TrainingModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...
    def on_predict_start(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_predict_end(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_predict_epoch_start(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_predict_epoch_end(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_predict_batch_start(
        self, trainer: Trainer, module: TrainingModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...
    def on_predict_batch_end(
        self,
        trainer: Trainer,
        module: TrainingModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...
    def on_before_backward(self, trainer: Trainer, module: TrainingModule, loss: torch.Tensor) -> None: ...
    def on_after_backward(self, trainer: Trainer, module: TrainingModule) -> None: ...
    def on_before_optimizer_step(
        self, trainer: Trainer, module: TrainingModule, optimizer: torch.optim.Optimizer
    ) -> None: ...
    def on_before_zero_grad(
        self, trainer: Trainer, module: TrainingModule, optimizer: torch.optim.Optimizer
    ) -> None: ...
    def on_save_checkpoint(self, trainer: Trainer, module: TrainingModule, checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, trainer: Trainer, module: TrainingModule, checkpoint: dict[str, Any]) -> None: ...
    def on_exception(self, trainer: Trainer, module: TrainingModule, exception: BaseException) -> None: ...

    def log(self, name: str, value: Any, **kwargs: Any) -> None:
        """Log a value from a callback hook, as ``pl_module.log(name, value, **kwargs)`` (Lightning's ``Callback.log``):
        the same arguments, defaults per hook, rules and errors, into the module the run is training or evaluating.

        Example:
            ```python
            class LogEpoch(Callback):
                def on_train_epoch_end(self, trainer, pl_module):
                    self.log("epoch_seen", trainer.current_epoch)
            ```
        """
        _running_module(name).log(name, value, **kwargs)

    def log_dict(self, values: Mapping[str, Any], **kwargs: Any) -> None:
        """[`log`][tandem.Callback.log] for each item, with the same options (``pl_module.log_dict``)."""
        _running_module(next(iter(values), "")).log_dict(values, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Checkpoint(Callback):
    """The base of the callbacks that save checkpoints, ``ModelCheckpoint`` and ``OnExceptionCheckpoint``
    (Lightning's ``Checkpoint``). As in Lightning, the Trainer moves them after its other callbacks, and runs their
    ``on_train_epoch_end`` after the module's, so that they see what the other callbacks and the module logged."""


def _running_module(name: str) -> TrainingModule:
    """The module of the run whose hooks are running (what a callback's ``self.log`` logs through)."""

    module = running_module()
    if module is None:
        raise LogCallError(
            f"A callback called self.log({name!r}, ...) outside a run: there is no module to log through. Log from "
            "the callback hooks the Trainer calls during fit, validate or test (e.g. on_train_batch_end), where "
            "self.log(...) is pl_module.log(...)."
        )
    return module
