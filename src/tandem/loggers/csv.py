"""Plain-text logging: ``metrics.csv`` and ``hparams.yaml`` in ``<save_dir>/<name>/version_<n>``."""

from __future__ import annotations

import argparse
import csv
import io
import os
from collections.abc import Mapping
from typing import Any

from tandem.loggers.logger import HPARAMS_FILE, Logger, atomic_write_text, require_url_filesystem
from tandem.utilities.exceptions import csv_experiment_lacks, out_of_range, write_failed
from tandem.utilities.rank_zero import rank_zero_only

METRICS_FILE = "metrics.csv"


class CSVLogger(Logger):
    """Writes metrics to ``metrics.csv`` and hyperparameters to ``hparams.yaml``, as Lightning's CSVLogger.

    One row per ``log_metrics`` call; the columns are every metric name, sorted, with ``step`` (and
    ``epoch``, which the Trainer adds to every row) among them, so ``pandas.read_csv(path).set_index("epoch")``
    works. Cells a row did not log stay empty. Rows are kept in memory and written every
    ``flush_logs_every_n_steps`` steps, at ``save`` (the Trainer calls it at each epoch end) and at
    [`finalize`][tandem.loggers.Logger.finalize]. A metric name that appears mid-run adds a column: the file is
    rewritten with the union of columns, and earlier rows leave the new cells empty.

    ``save_dir`` may be an fsspec URL (``s3://bucket/runs`` with s3fs, ``gs://...`` with gcsfs): the files are
    written to a local staging folder and uploaded whole whenever rows are written (see
    ``StagingFolder``).

    Args:
        save_dir: the folder that holds every experiment: a local path or an fsspec URL.
        name: the experiment's folder under ``save_dir``.
        version: an int (``version_<n>``), a folder name, or ``None`` for the next free ``version_<n>``.
        flush_logs_every_n_steps: write pending rows once the step has advanced this far since the last write.

    Example:
        ```python
        logger = CSVLogger("runs", name="mnist")
        trainer = Trainer(logger=logger, max_epochs=3)
        # afterwards: pandas.read_csv(f"{logger.log_dir}/metrics.csv")
        ```
    """

    def __init__(
        self,
        save_dir: str | os.PathLike,
        name: str = "tandem_logs",
        version: int | str | None = None,
        flush_logs_every_n_steps: int = 100,
    ) -> None:
        if not isinstance(flush_logs_every_n_steps, int) or flush_logs_every_n_steps < 1:
            raise out_of_range("CSVLogger: flush_logs_every_n_steps", flush_logs_every_n_steps, "an int >= 1")
        require_url_filesystem("CSVLogger", save_dir)
        super().__init__(save_dir, name, version)
        self._flush_every = flush_logs_every_n_steps
        self._pending: list[dict[str, Any]] = []
        self._file_columns: list[str] | None = None  # the header of metrics.csv as written
        self._last_flush_step = 0

    @property
    def log_dir(self) -> str:
        """``<save_dir>/<name>/version_<n>``, or ``<save_dir>/<name>/<version>`` for a str version."""
        log_dir = super().log_dir
        assert log_dir is not None  # its root_dir is always a folder
        return log_dir

    @property
    def metrics_file_path(self) -> str:
        """``<log_dir>/metrics.csv`` (a URL when ``save_dir`` is one)."""
        return os.path.join(self.log_dir, METRICS_FILE)

    @property
    def experiment(self) -> ExperimentWriter:
        """The writer of ``metrics.csv`` and ``hparams.yaml`` (Lightning's ``ExperimentWriter``): ``log_metrics``,
        ``log_hparams`` and ``save``, which write on global rank 0 only. It has no ``add_image`` or other
        TensorBoard call: log those with a [`TensorBoardLogger`][tandem.loggers.TensorBoardLogger]."""
        return ExperimentWriter(self)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        row: dict[str, Any] = {k: _cell(k, v) for k, v in metrics.items()}
        row["step"] = int(step)
        self._pending.append(row)
        if step - self._last_flush_step >= self._flush_every:
            self.save()

    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        self._save_hparams_yaml(params)

    @rank_zero_only
    def save(self) -> None:
        if not self._pending:
            return
        path = os.path.join(self._local_log_dir, METRICS_FILE)
        if self._file_columns is None:
            self._fetch(METRICS_FILE)  # a resumed run at a URL appends to the file there
            self._file_columns = _read_header(path)
        names = set(self._file_columns or ()).union(*self._pending)
        if self._file_columns is not None and names == set(self._file_columns):
            chunk = _format_rows(self._file_columns, self._pending, header=False)
            try:
                with open(path, "a", encoding="utf-8", newline="") as f:  # rows formatted first: one write
                    f.write(chunk)
            except OSError as err:
                raise write_failed(path, err, "the metrics file") from None
        else:  # a new file, or new columns: rewrite everything with the union of columns
            old_rows = _read_rows(path) if self._file_columns is not None else []
            columns = sorted(names)  # Lightning's order
            text = _format_rows(columns, old_rows + self._pending, header=True)
            atomic_write_text(path, text, what="the metrics file")
            self._file_columns = columns
        self._last_flush_step = self._pending[-1]["step"]
        self._pending = []
        self._upload()


class ExperimentWriter:
    """``CSVLogger.experiment``, as Lightning's: what a CSV file can hold, numbers and hyperparameters.

    Args:
        logger: the CSVLogger it writes for.

    Example:
        ```python
        self.logger.experiment.log_metrics({"val_f1": 0.8}, step=self.global_step)
        ```
    """

    NAME_METRICS_FILE = METRICS_FILE
    NAME_HPARAMS_FILE = HPARAMS_FILE

    def __init__(self, logger: CSVLogger) -> None:
        self._logger = logger

    @property
    def log_dir(self) -> str:
        return self._logger.log_dir

    @property
    def metrics_file_path(self) -> str:
        return self._logger.metrics_file_path

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The rows logged and not yet written to ``metrics.csv``."""
        return self._logger._pending

    @property
    def hparams(self) -> dict[str, Any]:
        """The hyperparameters logged so far (what ``hparams.yaml`` holds)."""
        return self._logger._hparams

    def log_metrics(self, metrics_dict: Mapping[str, float], step: int | None = None) -> None:
        """One row of ``metrics.csv``; without ``step``, the number of rows not yet written (Lightning's)."""
        self._logger.log_metrics(metrics_dict, len(self._logger._pending) if step is None else step)

    def log_hparams(self, params: Mapping[str, Any]) -> None:
        """Merge ``params`` into ``hparams.yaml``."""
        self._logger.log_hyperparams(params)

    def save(self) -> None:
        """Write the pending rows to ``metrics.csv``."""
        self._logger.save()

    def __getattr__(self, name: str) -> Any:  # only for names the writer lacks (add_image, add_histogram, ...)
        if name.startswith("__"):
            raise AttributeError(name)
        raise csv_experiment_lacks(name, self)


def _cell(name: str, value: Any) -> int | float:
    """A metric as written: ``epoch`` as an int (Lightning writes ``0``, not ``0.0``), the rest as floats."""
    value = float(value)
    return int(value) if name == "epoch" and value.is_integer() else value


def _format_rows(columns: list[str], rows: list[dict[str, Any]], header: bool) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)  # the csv default "\r\n" line ends, as Lightning's file
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _read_header(path: str) -> list[str] | None:
    """The columns of an existing metrics.csv (a resumed run appends to it), or None."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return next(csv.reader(f), None)
    except FileNotFoundError:
        return None


def _read_rows(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))
