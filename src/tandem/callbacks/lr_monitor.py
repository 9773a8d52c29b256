"""LearningRateMonitor: log each optimizer's learning rate (and optionally momentum, weight decay)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.optim import Optimizer

from tandem.callbacks.callback import Callback
from tandem.utilities.exceptions import bad_choice, incompatible

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer

_INTERVALS = (None, "step", "epoch")


class LearningRateMonitor(Callback):
    """Log learning rates to every logger of the Trainer, under Lightning's names.

    Keys are ``lr-{OptimizerClass}`` (``lr-SGD``); ``/pg1``, ``/pg2``... are appended when an optimizer has
    several parameter groups (or ``/{name}`` when the group has a ``"name"``), ``-1``, ``-2``... when two
    optimizers share a class. Momentum is logged as ``lr-SGD-momentum`` (``betas[0]`` for Adam-like
    optimizers) and weight decay as ``lr-SGD-weight_decay``.

    Args:
        logging_interval: ``"step"`` logs every ``log_every_n_steps`` optimizer steps, ``"epoch"`` at the
            start of each epoch, ``None`` follows each scheduler's interval (``"epoch"`` without a scheduler).
        log_momentum: also log the momentum.
        log_weight_decay: also log the weight decay.

    Example::

        trainer = Trainer(callbacks=[LearningRateMonitor(logging_interval="step")], logger=True)
    """

    def __init__(
        self, logging_interval: str | None = None, log_momentum: bool = False, log_weight_decay: bool = False
    ) -> None:
        if logging_interval not in _INTERVALS:
            raise bad_choice("LearningRateMonitor: logging_interval", logging_interval, _INTERVALS)
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self._names: list[str] = []

    def setup(self, trainer: Trainer, module: TrainingModule, stage: str) -> None:
        if stage == "fit" and not trainer.loggers:
            raise incompatible(
                "LearningRateMonitor",
                "it writes to the Trainer's loggers, and the Trainer has none",
                "Enable a logger (Trainer(logger=True) or logger=CSVLogger(...)), or remove the callback.",
            )

    def on_train_start(self, trainer: Trainer, module: TrainingModule) -> None:
        self._names = optimizer_names(trainer.optimizers)

    def on_train_batch_start(self, trainer: Trainer, module: TrainingModule, batch: Any, batch_idx: int) -> None:
        # As Lightning: at the start of each batch that publishes, the rates that batch trains with, on the row of
        # its logged values (the same step)
        if self.logging_interval != "epoch" and trainer.is_log_step:
            self._log(trainer, "step")

    def on_train_epoch_start(self, trainer: Trainer, module: TrainingModule) -> None:
        if self.logging_interval != "step":
            self._log(trainer, "epoch")

    def _log(self, trainer: Trainer, interval: str) -> None:
        if trainer.is_global_zero:
            trainer.log_metrics(self._stats(trainer, interval))

    def _stats(self, trainer: Trainer, interval: str) -> dict[str, float]:
        """The values due at ``interval`` ("step" or "epoch"), keyed by their logged names."""
        scheduled = {id(cfg.scheduler.optimizer): cfg.interval for cfg in trainer.lr_scheduler_configs}
        names = self._names or optimizer_names(trainer.optimizers)
        out: dict[str, float] = {}
        for optimizer, name in zip(trainer.optimizers, names):
            if self.logging_interval is None and scheduled.get(id(optimizer), "epoch") != interval:
                continue
            out.update(self._optimizer_stats(optimizer, name))
        return out

    def _optimizer_stats(self, optimizer: Optimizer, name: str) -> dict[str, float]:
        groups = optimizer.param_groups
        use_betas = "betas" in optimizer.defaults
        out: dict[str, float] = {}
        for i, group in enumerate(groups):
            key = name if len(groups) == 1 else f"{name}/{group.get('name', f'pg{i + 1}')}"
            out[key] = float(group["lr"])
            if self.log_momentum:
                out[f"{key}-momentum"] = float(group["betas"][0] if use_betas else group.get("momentum", 0.0))
            if self.log_weight_decay:
                out[f"{key}-weight_decay"] = float(group.get("weight_decay", 0.0))
        return out


def optimizer_names(optimizers: list[Optimizer]) -> list[str]:
    """``lr-{Class}`` per optimizer, with ``-1``, ``-2``... for repeated classes (Lightning's names)."""
    names, seen = [], {}
    for optimizer in optimizers:
        base = f"lr-{type(optimizer).__name__}"
        count = seen.get(base, 0)
        seen[base] = count + 1
        names.append(base if count == 0 else f"{base}-{count}")
    return names
