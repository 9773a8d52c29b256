"""EarlyStopping: stop training when a monitored metric stops improving."""

from __future__ import annotations

import logging
import math
from enum import Enum
from typing import TYPE_CHECKING, Any

from tandem.callbacks.callback import Callback
from tandem.utilities.exceptions import bad_choice, missing_metric, out_of_range
from tandem.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer

log = logging.getLogger(__name__)  # Lightning's: its messages go here (patch it to read them)

_MODES = ("min", "max")
_MODE_FIX = "Use 'min' for losses, 'max' for accuracies."
_ORDER = {"min": "<", "max": ">"}


class EarlyStoppingReason(Enum):
    """Why ``EarlyStopping`` stopped the fit (``EarlyStopping.stopping_reason``), as Lightning 2.6's."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(Callback):
    """Stop training when ``monitor`` has not improved by more than ``min_delta`` for ``patience`` checks.

    When the check runs follows Lightning: at the end of each training epoch (after that epoch's
    validation) when validation runs once at the end of every epoch or not at all, else at the end of
    each validation; ``check_on_train_epoch_end`` picks one. Only during ``fit``, never in the sanity
    check. Every process decides from global rank 0's value of the metric, so all of them stop at the
    same point (several processes finish the epoch first).

    Args:
        monitor: the logged metric to watch, e.g. ``"val_loss"``.
        min_delta: the smallest change that counts as an improvement (>= 0).
        patience: how many checks without improvement to allow before stopping (>= 0).
        verbose: report each improvement, not only the reason for stopping.
        mode: ``"min"`` when lower is better, ``"max"`` when higher is better.
        strict: raise when ``monitor`` was never logged (otherwise warn once and skip the check).
        check_finite: stop as soon as the metric is NaN or infinite.
        stopping_threshold: stop as soon as the metric is better than this.
        divergence_threshold: stop as soon as the metric is worse than this.
        check_on_train_epoch_end: check at the training epoch end (True) or at validation ends (False);
            ``None`` decides as described above.
        log_rank_zero_only: report on global rank 0 only; otherwise every rank reports, its message prefixed
            with ``[rank: r]`` under several processes (Lightning's rule).

    Attributes:
        stopping_reason: an ``EarlyStoppingReason`` (``NOT_STOPPED`` until it stops the fit).
        stopping_reason_message: the reason in words once it stopped the fit, else None.

    The reason for stopping is reported (with ``verbose``, each improvement too) through the module's ``log``
    logger (``logging.getLogger("tandem.callbacks.early_stopping")``), in Lightning's words.

    Example:
        ```python
        trainer = Trainer(callbacks=[EarlyStopping("val_loss", patience=5, min_delta=1e-3)], max_epochs=100)
        ```
    """

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        verbose: bool = False,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_on_train_epoch_end: bool | None = None,
        log_rank_zero_only: bool = False,
    ) -> None:
        if mode not in _MODES:
            lead = f"`mode` can be {', '.join(_MODES)}, got {mode}."  # Lightning's sentence first, then ours
            raise bad_choice("EarlyStopping: mode", mode, _MODES, _MODE_FIX, lead=lead)
        if not isinstance(patience, int) or patience < 0:
            raise out_of_range("EarlyStopping: patience", patience, "an int >= 0")
        if not isinstance(min_delta, (int, float)) or not math.isfinite(min_delta) or min_delta < 0:
            raise out_of_range("EarlyStopping: min_delta", min_delta, "a finite number >= 0")
        self.monitor = monitor
        self.min_delta = float(min_delta)
        self.patience = patience
        self.verbose = verbose
        self.mode = mode
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.check_on_train_epoch_end = check_on_train_epoch_end
        self.log_rank_zero_only = log_rank_zero_only
        self.wait_count = 0
        self.stopped_epoch = 0
        self.best_score = math.inf if mode == "min" else -math.inf
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None
        self._warned_missing = False

    @property
    def state_key(self) -> str:
        key = {"monitor": self.monitor, "mode": self.mode}
        return f"{type(self).__qualname__}{key!r}"

    def _at_train_epoch_end(self, trainer: Trainer) -> bool:
        if self.check_on_train_epoch_end is not None:
            return self.check_on_train_epoch_end
        return trainer.fit_loop.validates_only_at_epoch_ends  # the loop knows its validation schedule

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if self._at_train_epoch_end(trainer):
            self._check(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if not self._at_train_epoch_end(trainer):
            self._check(trainer)

    def _check(self, trainer: Trainer) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or trainer.fast_dev_run:  # Lightning's rule
            return
        local = trainer.callback_metrics.get(self.monitor)
        current = trainer.strategy.broadcast(float(local) if local is not None else None)
        if current is None:
            if self.strict:
                raise missing_metric("EarlyStopping", self.monitor, trainer.callback_metrics)
            if not self._warned_missing:
                self._warned_missing = True
                rank_zero_warn(
                    f"EarlyStopping(monitor={self.monitor!r}, strict=False): the metric was not logged, so "
                    f"the check is skipped. Logged metrics: {sorted(trainer.callback_metrics)}."
                )
            return
        should_stop, reason = self._evaluate(current)
        if should_stop:
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason_message = reason
            trainer.should_stop = True
        if reason and (should_stop or self.verbose):
            self._log_info(trainer, reason, self.log_rank_zero_only)

    @staticmethod
    def _log_info(trainer: Trainer, message: str, log_rank_zero_only: bool) -> None:
        """Lightning's rule: under several processes each rank's message starts ``[rank: r]``, and only rank 0
        reports with ``log_rank_zero_only``."""
        rank = trainer.global_rank if trainer.world_size > 1 else None
        if rank is None or not log_rank_zero_only or rank == 0:
            log.info(message if rank is None else f"[rank: {rank}] {message}")

    def _better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    def _evaluate(self, current: float) -> tuple[bool, str | None]:
        """Update the counters with ``current`` (rank 0's value) and say whether to stop, and why (Lightning's
        words)."""
        name, best = self.monitor, self.best_score
        stop = "Signaling Trainer to stop."
        if self.check_finite and not math.isfinite(current):
            self.stopping_reason = EarlyStoppingReason.NON_FINITE_METRIC
            return (
                True,
                f"Monitored metric {name} = {current} is not finite. Previous best value was {best:.3f}. {stop}",
            )
        if self.stopping_threshold is not None and self._better(current, self.stopping_threshold):
            self.stopping_reason = EarlyStoppingReason.STOPPING_THRESHOLD
            order = _ORDER[self.mode]
            return True, f"Stopping threshold reached: {name} = {current} {order} {self.stopping_threshold}. {stop}"
        if self.divergence_threshold is not None and self._better(self.divergence_threshold, current):
            self.stopping_reason = EarlyStoppingReason.DIVERGENCE_THRESHOLD
            worse = _ORDER["max" if self.mode == "min" else "min"]  # the side past the threshold
            return True, f"Divergence threshold reached: {name} = {current} {worse} {self.divergence_threshold}. {stop}"
        delta = -self.min_delta if self.mode == "min" else self.min_delta
        if self._better(current - delta, best):
            reason = (
                f"Metric {name} improved. New best score: {current:.3f}"
                if math.isinf(best)
                else f"Metric {name} improved by {abs(best - current):.3f} >= min_delta = {self.min_delta}. "
                f"New best score: {current:.3f}"
            )
            self.best_score, self.wait_count = current, 0
            return False, reason
        self.wait_count += 1
        if self.wait_count >= self.patience:
            self.stopping_reason = EarlyStoppingReason.PATIENCE_EXHAUSTED
            return True, (
                f"Monitored metric {name} did not improve in the last {self.wait_count} records. "
                f"Best score: {best:.3f}. {stop}"
            )
        return False, None

    def state_dict(self) -> dict[str, Any]:
        return {
            "wait_count": self.wait_count,
            "stopped_epoch": self.stopped_epoch,
            "best_score": self.best_score,
            "patience": self.patience,
            "stopping_reason": self.stopping_reason.value,
            "stopping_reason_message": self.stopping_reason_message,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.wait_count = state["wait_count"]
        self.stopped_epoch = state["stopped_epoch"]
        self.best_score = state["best_score"]
        self.patience = state["patience"]
        # checkpoints written before Lightning 2.6 / this tandem version have no reason
        self.stopping_reason = EarlyStoppingReason(state.get("stopping_reason", EarlyStoppingReason.NOT_STOPPED.value))
        self.stopping_reason_message = state.get("stopping_reason_message")
