"""LearningRateMonitor: log each optimizer's learning rate (and optionally momentum, weight decay)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer

from tandem.callbacks.callback import Callback
from tandem.utilities.exceptions import TandemConfigError, bad_choice, incompatible

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer

_INTERVALS = (None, "step", "epoch")


class LearningRateMonitor(Callback):
    """Log learning rates to every logger of the Trainer and to ``trainer.callback_metrics``, under Lightning's
    names.

    Keys are ``lr-{OptimizerClass}`` (``lr-SGD``), or the scheduler's ``name`` when its config gives one;
    ``/pg1``, ``/pg2``... are appended when an optimizer has several parameter groups (``/{name}`` for a group with
    a ``"name"``, also when it is the only group), ``-1``, ``-2``... when two optimizers share a class. Optimizers
    with a scheduler are named first, in the schedulers' order, then the others. Momentum is logged as
    ``lr-SGD-momentum`` (``betas[0]`` for Adam-like optimizers) and weight decay as ``lr-SGD-weight_decay``.
    Every rank puts the values in ``trainer.callback_metrics`` as tensors on its device (so ``EarlyStopping`` or
    ``ModelCheckpoint`` can monitor them); rank 0 sends them to the loggers.

    Args:
        logging_interval: ``"step"`` logs every ``log_every_n_steps`` optimizer steps, ``"epoch"`` at the
            start of each epoch, ``None`` logs each optimizer with a scheduler at that scheduler's interval and the
            others at both (as Lightning).
        log_momentum: also log the momentum.
        log_weight_decay: also log the weight decay.

    Example:
        ```python
        trainer = Trainer(callbacks=[LearningRateMonitor(logging_interval="step")], logger=True)
        trainer.fit(model)
        trainer.callback_metrics["lr-SGD"]  # the last rate logged, a tensor
        ```
    """

    def __init__(
        self, logging_interval: str | None = None, log_momentum: bool = False, log_weight_decay: bool = False
    ) -> None:
        if logging_interval not in _INTERVALS:
            raise bad_choice("LearningRateMonitor: logging_interval", logging_interval, _INTERVALS)
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay

    def setup(self, trainer: Trainer, module: TrainingModule, stage: str) -> None:
        if stage == "fit" and not trainer.loggers:
            raise incompatible(
                "LearningRateMonitor",
                "it writes to the Trainer's loggers, and the Trainer has none",
                "Enable a logger (Trainer(logger=True) or logger=CSVLogger(...)), or remove the callback.",
            )

    def on_train_start(self, trainer: Trainer, module: TrainingModule) -> None:
        lr_names(trainer.optimizers, trainer.lr_scheduler_configs)  # refuses duplicate group names before training

    def on_train_batch_start(self, trainer: Trainer, module: TrainingModule, batch: Any, batch_idx: int) -> None:
        # As Lightning: at the start of each batch that publishes, the rates that batch trains with, on the row of
        # its logged values (the same step)
        if self.logging_interval != "epoch" and trainer.is_log_step:
            self._publish(trainer, "step")

    def on_train_epoch_start(self, trainer: Trainer, module: TrainingModule) -> None:
        if self.logging_interval != "step":
            self._publish(trainer, "epoch")

    def _publish(self, trainer: Trainer, interval: str) -> None:
        """The values due at ``interval`` into ``callback_metrics`` (every rank), and to the loggers (rank 0)."""
        stats = self._stats(trainer, interval)
        device = trainer.strategy.root_device
        trainer.callback_metrics.update({name: _as_tensor(value, device) for name, value in stats.items()})
        if stats and trainer.is_global_zero:
            trainer.log_metrics(stats)

    def _stats(self, trainer: Trainer, interval: str) -> dict[str, Any]:
        """The values due at ``interval`` ("step" or "epoch"), keyed by their logged names: with
        ``logging_interval=None``, an optimizer with a scheduler only at that scheduler's interval."""
        out: dict[str, Any] = {}
        for optimizer, names, scheduled in lr_names(trainer.optimizers, trainer.lr_scheduler_configs):
            if self.logging_interval is None and scheduled not in (None, interval):
                continue
            out.update(self._optimizer_stats(optimizer, names))
        return out

    def _optimizer_stats(self, optimizer: Optimizer, names: list[str]) -> dict[str, Any]:
        use_betas = "betas" in optimizer.defaults
        out: dict[str, Any] = {}
        for group, key in zip(optimizer.param_groups, names):
            out[key] = group["lr"]
            if self.log_momentum:
                out[f"{key}-momentum"] = group["betas"][0] if use_betas else group.get("momentum", 0)
            if self.log_weight_decay:
                out[f"{key}-weight_decay"] = group.get("weight_decay", 0)
        return out


def _as_tensor(value: Any, device: torch.device) -> torch.Tensor:
    """A logged value as ``callback_metrics`` keeps it: a tensor of its own, of the dtype ``torch.tensor(value)``
    has (Lightning's), filled on the device (a copy from the host would wait for the queued steps; a rate held as a
    tensor is copied)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone().to(device)
    return torch.full((), value, device=device)


def lr_names(
    optimizers: list[Optimizer], scheduler_configs: list[Any]
) -> list[tuple[Optimizer, list[str], str | None]]:
    """Lightning's names: for each optimizer with a scheduler (in the schedulers' order), then each other optimizer,
    the optimizer, the key of each of its parameter groups, and the scheduler's interval (None: no scheduler).

    The base is the scheduler config's ``name``, else ``lr-{Class}``; the n-th optimizer of a class (counting those
    without a named scheduler) gets ``-{n-1}``; several groups get ``/{group name}`` or ``/pg{i}``, a single group
    ``/{group name}`` only when it has one."""
    out: list[tuple[Optimizer, list[str], str | None]] = []
    seen: list[Optimizer] = []
    classes: dict[type, int] = {}

    def keys(optimizer: Optimizer, base: str, counted: bool) -> list[str]:
        seen.append(optimizer)
        kind = type(optimizer)
        if counted:
            classes[kind] = classes.get(kind, 0) + 1
        groups = optimizer.param_groups
        group_names = [group.get("name", f"pg{i}") for i, group in enumerate(groups, start=1)]
        repeated = sorted({n for n in group_names if group_names.count(n) > 1})
        if repeated:
            raise TandemConfigError(
                f"LearningRateMonitor: {base} has parameter groups with the same name {repeated}; each group of one "
                "optimizer needs its own name (its rate is logged under it). Rename the groups or drop 'name'."
            )
        if classes.get(kind, 0) > 1:
            base = f"{base}-{classes[kind] - 1}"
        if len(groups) > 1:
            return [f"{base}/{n}" for n in group_names]
        return [f"{base}/{groups[0]['name']}" if groups[0].get("name") else base]

    for config in scheduler_configs:
        optimizer = config.scheduler.optimizer
        named = config.name is not None
        base = config.name if named else f"lr-{type(optimizer).__name__}"
        out.append((optimizer, keys(optimizer, base, counted=not named), config.interval))
    for optimizer in optimizers:
        optimizer = getattr(optimizer, "optimizer", optimizer)  # a wrapper (DeepSpeed's) holds the torch optimizer
        if any(optimizer is other for other in seen):
            continue
        out.append((optimizer, keys(optimizer, f"lr-{type(optimizer).__name__}", counted=True), None))
    return out
