"""Timer: how long each stage ran, and a time limit that stops training."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from tandem.callbacks.callback import Callback
from tandem.utilities.exceptions import TandemConfigError, bad_choice
from tandem.utilities.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer

STAGES = ("train", "sanity_check", "validate", "test", "predict")
_INTERVALS = ("step", "epoch")
_DURATION = re.compile(r"(\d+):(\d\d):(\d\d):(\d\d)")


class Timer(Callback):
    """Measure the time spent training, validating, testing and predicting, and stop training once
    ``duration`` of training time has passed.

    The limit is checked after every training batch (``interval="step"``) or at the end of every training
    epoch (``"epoch"``), and when a fit starts (a resumed run whose time is already used up stops at once).
    Training time is kept in checkpoints, so a resumed run counts the time of the runs before it. Each
    process measures its own time; with several processes the Trainer stops them all at the same step: the
    next publishing step (every ``log_every_n_steps``) after one of them ran out of time, or the epoch's end.
    ``Trainer(max_time=...)`` adds one of these (``interval="step"``).

    Args:
        duration: the training time allowed: ``"DD:HH:MM:SS"``, a ``datetime.timedelta``, or a dict of
            ``timedelta`` arguments such as ``{"hours": 12}``. ``None``: measure only.
        interval: ``"step"`` or ``"epoch"``: when the limit is checked.
        verbose: say when the time limit stops training.

    Example:
        ```python
        timer = Timer(duration="00:12:00:00")  # stop after 12 hours of training
        trainer = Trainer(callbacks=[timer])
        trainer.fit(model, data)
        print(timer.time_elapsed("train"), timer.time_elapsed("validate"))
        ```
    """

    def __init__(
        self,
        duration: str | timedelta | Mapping[str, int] | None = None,
        interval: str = "step",
        verbose: bool = True,
    ) -> None:
        if interval not in _INTERVALS:
            raise bad_choice("Timer: interval", interval, _INTERVALS)
        self._duration = _seconds(duration)
        self._interval = interval
        self._verbose = verbose
        self._start_time: dict[str, float | None] = dict.fromkeys(STAGES)
        self._end_time: dict[str, float | None] = dict.fromkeys(STAGES)
        self._offset = 0.0  # training time of the runs this one resumed

    # ------------------------------------------------------------------ queries
    def start_time(self, stage: str = "train") -> float | None:
        """When ``stage`` last started (``time.monotonic()`` seconds), or None."""
        return self._start_time[_stage(stage)]

    def end_time(self, stage: str = "train") -> float | None:
        """When ``stage`` last ended (``time.monotonic()`` seconds), or None while it runs or never ran."""
        return self._end_time[_stage(stage)]

    def time_elapsed(self, stage: str = "train") -> float:
        """Seconds ``stage`` ran (so far, while it runs); training time includes resumed runs' time."""
        stage = _stage(stage)
        start, end = self._start_time[stage], self._end_time[stage]
        offset = self._offset if stage == "train" else 0.0
        if start is None:
            return offset
        return (time.monotonic() if end is None else end) - start + offset

    def time_remaining(self, stage: str = "train") -> float | None:
        """Seconds left of ``duration`` (None without a duration)."""
        return None if self._duration is None else self._duration - self.time_elapsed(stage)

    # ------------------------------------------------------------------ hooks
    def _start(self, stage: str) -> None:
        self._start_time[stage], self._end_time[stage] = time.monotonic(), None

    def _end(self, stage: str) -> None:
        self._end_time[stage] = time.monotonic()

    def on_train_start(self, trainer: Trainer, module: TrainingModule) -> None:
        self._start("train")

    def on_train_end(self, trainer: Trainer, module: TrainingModule) -> None:
        self._end("train")

    def on_validation_start(self, trainer: Trainer, module: TrainingModule) -> None:
        self._start("sanity_check" if trainer.sanity_checking else "validate")

    def on_validation_end(self, trainer: Trainer, module: TrainingModule) -> None:
        self._end("sanity_check" if trainer.sanity_checking else "validate")

    def on_test_start(self, trainer: Trainer, module: TrainingModule) -> None:
        self._start("test")

    def on_test_end(self, trainer: Trainer, module: TrainingModule) -> None:
        self._end("test")

    def on_predict_start(self, trainer: Trainer, module: TrainingModule) -> None:
        self._start("predict")

    def on_predict_end(self, trainer: Trainer, module: TrainingModule) -> None:
        self._end("predict")

    def on_fit_start(self, trainer: Trainer, module: TrainingModule) -> None:
        if self._duration is not None:
            self._check(trainer, self._duration)  # after the restore: a resumed run may have no time left

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._interval == "step" and self._duration is not None:
            self._check(trainer, self._duration)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainingModule) -> None:
        if self._interval == "epoch" and self._duration is not None:
            self._check(trainer, self._duration)

    def _check(self, trainer: Trainer, duration: float) -> None:
        if trainer.should_stop or self.time_elapsed("train") < duration:
            return
        trainer.should_stop = True
        if self._verbose:
            elapsed = timedelta(seconds=int(self.time_elapsed("train")))
            rank_zero_info(f"Time limit reached. Elapsed time is {elapsed}. Signaling Trainer to stop.")

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in STAGES}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._offset = float(state.get("time_elapsed", {}).get("train", 0.0))


def _stage(stage: str) -> str:
    if stage not in STAGES:
        raise bad_choice("Timer: stage", stage, STAGES)
    return stage


def _seconds(duration: str | timedelta | Mapping[str, int] | None) -> float | None:
    if duration is None:
        return None
    if isinstance(duration, str):
        match = _DURATION.fullmatch(duration.strip())
        if not match:
            raise TandemConfigError(
                f"Timer: duration={duration!r} is not a duration; expected 'DD:HH:MM:SS' (e.g. '00:12:00:00' for "
                "12 hours), a datetime.timedelta, or a dict such as {'hours': 12}."
            )
        days, hours, minutes, seconds = (int(g) for g in match.groups())
        return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds).total_seconds()
    if isinstance(duration, Mapping):
        try:
            return timedelta(**duration).total_seconds()
        except TypeError as err:
            raise TandemConfigError(f"Timer: duration={dict(duration)!r} is not a duration ({err}).") from None
    if not isinstance(duration, timedelta):
        raise TandemConfigError(
            f"Timer: duration={duration!r} is not a duration; expected 'DD:HH:MM:SS', a datetime.timedelta or a dict."
        )
    return duration.total_seconds()
