"""``LogSink``: where logged numbers go (every logger, on global rank 0, and ``trainer.logged_metrics``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from tandem.utilities.logged_values import to_float

if TYPE_CHECKING:
    from tandem.loggers.logger import Logger
    from tandem.strategies.strategy import Strategy
    from tandem.trainer.logging.collector import MetricCollector
    from tandem.trainer.state import LoopState


class LogSink:
    """Where logged numbers go: every logger (on global rank 0) and ``trainer.logged_metrics``.

    Args:
        loggers: the Trainer's loggers.
        collector: whose ``logged_metrics`` record what was sent.
        strategy: says which process is global rank 0.
        loop: the training loop's state, whose ``logger_step`` is the default step and ``epoch`` the epoch.
    """

    def __init__(self, loggers: list[Logger], collector: MetricCollector, strategy: Strategy, loop: LoopState) -> None:
        self.loggers = loggers
        self._collector, self._strategy, self._loop = collector, strategy, loop

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None, epoch: bool = True) -> None:
        """See [`tandem.Trainer.log_metrics`][tandem.Trainer.log_metrics]. ``epoch``: a row at the default step names
        its epoch (the rows of ``self.log`` values, as Lightning writes them; the callbacks' rows, through the Trainer,
        do not)."""
        if not metrics:
            return
        self._collector.logged_metrics.update(as_logged(metrics))
        if self.loggers and self._strategy.is_global_zero:
            values = to_float(dict(metrics))  # the loggers write numbers: one host sync for the row
            if step is None and epoch:  # as Lightning: every row of self.log values says its epoch (a CSV column)
                values.setdefault("epoch", self._loop.epoch)
            step = self._loop.logger_step if step is None else step
            for logger in self.loggers:  # by keyword, as Lightning calls them (a logger's own may rename the first)
                logger.log_metrics(metrics=values, step=step)

    def save(self) -> None:
        for logger in self.loggers:
            logger.save()


def as_logged(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``metrics`` as ``trainer.logged_metrics`` holds them (Lightning's types): a tensor as it is, one of integers
    or booleans as float32; anything else (a number a callback sent) as given. No host sync."""
    return {
        k: v.float() if isinstance(v, torch.Tensor) and not v.is_floating_point() else v for k, v in metrics.items()
    }
