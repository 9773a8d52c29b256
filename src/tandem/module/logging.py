"""What a TrainingModule reports (``LoggingMixin``): ``self.log`` and ``self.log_dict``, which hand each value to
the Trainer's collector (trainer/logging.py), and ``self.print``, once on rank zero."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from tandem.utilities.rank_zero import rank_zero_print, rank_zero_warn

if TYPE_CHECKING:
    from torchmetrics import Metric


class LoggingMixin:
    """``self.log``, ``self.log_dict`` and ``self.print`` of a [`TrainingModule`][tandem.TrainingModule]."""

    def log(
        self,
        name: str,
        value: torch.Tensor | float | Metric,
        *,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        prog_bar: bool = False,
        logger: bool = True,
        sync_dist: bool = False,
        reduce_fx: str | Callable[..., Any] = "mean",
        batch_size: int | None = None,
        rank_zero_only: bool = False,
        add_dataloader_idx: bool = True,
        metric_attribute: str | None = None,
    ) -> None:
        """Record a metric. Floats, scalar tensors and torchmetrics ``Metric`` objects are accepted.

        Args:
            name: key in ``trainer.callback_metrics`` and in the loggers.
            value: the value; a ``Metric`` is computed (and synchronised by torchmetrics) at epoch end.
            on_step / on_epoch: log every step / the epoch's aggregate. Defaults: step in training
                hooks, epoch in evaluation and epoch-end hooks. Both: keys ``name_step`` and ``name_epoch``.
            prog_bar: show in the progress bar.
            logger: send to the loggers.
            sync_dist: reduce across processes (by sums and counts, then divide). Epoch values are
                reduced once per epoch; in evaluation, step values stay per process (ranks see
                different numbers of batches there, so a per-step collective could never complete).
            reduce_fx: how the epoch value combines the steps': ``"mean"`` (weighted by batch size), ``"sum"``,
                ``"max"`` or ``"min"``, as Lightning reads them: in any case, ``"avg"`` for ``"mean"``, or as
                ``torch.mean`` / ``torch.sum`` / ``torch.max`` / ``torch.min`` or the builtins ``sum`` / ``max`` /
                ``min``. For another reduction, log a torchmetrics ``Metric``.
            batch_size: weight for the epoch mean; inferred from the batch when omitted.
            rank_zero_only: the call is made on rank 0 only (the value is never reduced across processes).
            add_dataloader_idx: with several evaluation loaders, name the value ``name/dataloader_idx_N``.
            metric_attribute: the module attribute that holds a logged torchmetrics ``Metric``; needed only when
                the logged object is not one of the module's submodules (found by itself otherwise). A ``Metric``
                that is neither is refused: the module would not move it to its device nor save it.
        """
        ref = self.__dict__.get("_trainer_ref")  # self._trainer, inline: this runs for every logged value
        trainer = None if ref is None else ref()
        if trainer is None:  # outside a Trainer run (e.g. a unit test calling training_step): nothing to collect
            _warn_log_without_trainer(name)
            return
        trainer.metric_collector.log(
            name,
            value,
            on_step,
            on_epoch,
            prog_bar,
            logger,
            sync_dist,
            reduce_fx,
            batch_size,
            rank_zero_only,
            add_dataloader_idx,
            metric_attribute,
        )  # positional: this runs every step

    def log_dict(
        self,
        values: Mapping[str, torch.Tensor | float | Metric],
        *,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        prog_bar: bool = False,
        logger: bool = True,
        sync_dist: bool = False,
        reduce_fx: str | Callable[..., Any] = "mean",
        batch_size: int | None = None,
        rank_zero_only: bool = False,
        add_dataloader_idx: bool = True,
        metric_attribute: str | None = None,
    ) -> None:
        """``self.log`` for each item, with the same options."""
        for name, value in values.items():
            self.log(
                name,
                value,
                on_step=on_step,
                on_epoch=on_epoch,
                prog_bar=prog_bar,
                logger=logger,
                sync_dist=sync_dist,
                reduce_fx=reduce_fx,
                batch_size=batch_size,
                rank_zero_only=rank_zero_only,
                add_dataloader_idx=add_dataloader_idx,
                metric_attribute=metric_attribute,
            )

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once, on global rank 0."""
        rank_zero_print(*args, **kwargs)


_LOG_WITHOUT_TRAINER_WARNED = False


def _warn_log_without_trainer(name: str) -> None:
    """Once per process: ``self.log`` was called on a module no Trainer runs, so the value went nowhere."""
    global _LOG_WITHOUT_TRAINER_WARNED
    if not _LOG_WITHOUT_TRAINER_WARNED:
        _LOG_WITHOUT_TRAINER_WARNED = True
        rank_zero_warn(
            f"self.log({name!r}, ...) was called on a module that is not attached to a Trainer, so the value is "
            "dropped (as are later ones). Logging works inside trainer.fit / validate / test; outside a Trainer "
            "(e.g. calling training_step in a unit test) this is expected. (Shown once.)"
        )
