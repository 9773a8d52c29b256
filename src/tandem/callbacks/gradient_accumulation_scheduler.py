"""GradientAccumulationScheduler: change how many batches are accumulated per optimizer step, by epoch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tandem.callbacks.callback import Callback
from tandem.utilities.exceptions import TandemConfigError, incompatible

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer


class GradientAccumulationScheduler(Callback):
    """Set ``trainer.accumulate_grad_batches`` at the start of each training epoch from ``scheduling``.

    Epochs count from 0: ``{0: 1, 4: 2}`` steps the optimizer every batch for epochs 0-3 and every 2 batches
    from epoch 4 on. Without a key 0, epochs before the first key accumulate 1 batch. The last batch of an
    epoch always steps the optimizer. Leave ``Trainer(accumulate_grad_batches=...)`` at 1 when using it.

    Args:
        scheduling: ``{first epoch: batches to accumulate}``; keys ints >= 0, values ints >= 1.

    Example:
        ```python
        trainer = Trainer(callbacks=[GradientAccumulationScheduler(scheduling={0: 8, 4: 4, 8: 1})])
        ```
    """

    def __init__(self, scheduling: Mapping[int, int]) -> None:
        if not isinstance(scheduling, Mapping) or not scheduling:
            raise TandemConfigError(
                f"GradientAccumulationScheduler: scheduling={scheduling!r} must be a non-empty dict "
                "{first epoch: batches to accumulate}, e.g. {0: 4, 10: 1}."
            )
        bad_keys = [k for k in scheduling if isinstance(k, bool) or not isinstance(k, int) or k < 0]
        if bad_keys:
            raise TandemConfigError(
                f"GradientAccumulationScheduler: the epochs {bad_keys} are not ints >= 0 (epochs count from 0)."
            )
        bad_values = [v for v in scheduling.values() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if bad_values:
            raise TandemConfigError(
                f"GradientAccumulationScheduler: the accumulation factors {bad_values} are not ints >= 1."
            )
        self.scheduling = {0: 1, **dict(scheduling)}
        self.epochs = sorted(self.scheduling)
        self._set: int | None = None  # the value this callback last gave the Trainer

    def going_to_accumulate_grad_batches(self) -> bool:
        return any(v > 1 for v in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """The factor for ``epoch``: the value of the largest key <= ``epoch``."""
        return self.scheduling[max(e for e in self.epochs if e <= epoch)]

    def on_train_start(self, trainer: Trainer, module: TrainingModule) -> None:
        if not getattr(module, "automatic_optimization", True):
            raise incompatible(
                "GradientAccumulationScheduler",
                "with manual optimization the module steps its optimizers itself, so there is nothing to schedule",
                "Remove the callback, or accumulate in training_step yourself.",
            )
        if trainer.accumulate_grad_batches not in (1, self._set):
            raise incompatible(
                f"GradientAccumulationScheduler with Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches})",
                "both set the accumulation",
                "Remove accumulate_grad_batches from the Trainer or remove the callback.",
            )

    def on_train_epoch_start(self, trainer: Trainer, module: TrainingModule) -> None:
        self._set = self.get_accumulate_grad_batches(trainer.current_epoch)
        trainer.accumulate_grad_batches = self._set
