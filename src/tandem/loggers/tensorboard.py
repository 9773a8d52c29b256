"""TensorBoard logging through ``torch.utils.tensorboard.SummaryWriter`` (imported on first write)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from tandem.loggers.logger import Logger
from tandem.utilities.rank_zero import rank_zero_only


class _NoOpExperiment:
    """What ``experiment`` returns on ranks other than 0: every method call does nothing."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class TensorBoardLogger(Logger):
    """Writes scalars and hyperparameters as TensorBoard event files in ``<save_dir>/<name>/version_<n>``.

    Hyperparameters go both to TensorBoard's HPARAMS tab (in the same run, no sub-folder) and to
    ``hparams.yaml``. Watch the runs with ``tensorboard --logdir <save_dir>``.

    Args:
        save_dir: the folder that holds every experiment.
        name: the experiment's folder under ``save_dir``.
        version: an int (``version_<n>``), a folder name, or ``None`` for the next free ``version_<n>``.
        **summary_writer_kwargs: passed to ``SummaryWriter`` (e.g. ``flush_secs=30``, ``max_queue=100``).

    Example::

        logger = TensorBoardLogger("runs", name="mnist")
        trainer = Trainer(logger=logger, max_epochs=3)
        logger.experiment.add_histogram("weights", w, step)  # the SummaryWriter itself
    """

    def __init__(
        self,
        save_dir: str | os.PathLike,
        name: str = "tandem_logs",
        version: int | str | None = None,
        **summary_writer_kwargs: Any,
    ) -> None:
        super().__init__(save_dir, name, version)
        self._summary_writer_kwargs = summary_writer_kwargs
        self._experiment: Any = None

    @property
    def experiment(self) -> Any:
        """The ``SummaryWriter`` (created with the run folder on first use); a no-op object on other ranks."""
        if rank_zero_only.rank != 0:
            return _NoOpExperiment()
        if self._experiment is None:
            from torch.utils.tensorboard import SummaryWriter

            self._experiment = SummaryWriter(log_dir=self.log_dir, **self._summary_writer_kwargs)
        return self._experiment

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        writer = self.experiment
        for key, value in metrics.items():
            writer.add_scalar(key, float(value), step)

    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        from torch.utils.tensorboard.summary import hparams

        merged = self._save_hparams_yaml(params)
        flat = {k: _tb_value(v) for k, v in _flatten(merged).items()}
        writer = self.experiment.file_writer  # add_hparams would write to a sub-folder, a separate run
        for summary in hparams(flat, {}):
            writer.add_summary(summary)

    @rank_zero_only
    def save(self) -> None:
        if self._experiment is not None:
            self._experiment.flush()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._experiment is not None:
            self._experiment.flush()
            self._experiment.close()
            self._experiment = None  # a later run with this logger opens a new event file

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_experiment"] = None  # a SummaryWriter cannot be pickled (spawned processes)
        return state


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 0.1}}`` -> ``{"optim/lr": 0.1}``: TensorBoard's hparams are flat."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, argparse.Namespace):
            value = vars(value)
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{name}/"))
        else:
            out[name] = value
    return out


def _tb_value(value: Any) -> bool | int | float | str:
    """TensorBoard's hparams take numbers, bools and strings; anything else is shown as its ``str()``."""
    return value if isinstance(value, (bool, int, float, str)) else str(value)
