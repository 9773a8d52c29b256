"""TensorBoard logging through ``torch.utils.tensorboard.SummaryWriter`` (imported on first write)."""

from __future__ import annotations

import argparse
import os
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from tandem.loggers.logger import Logger, NoOpExperiment, flatten_params, require_url_filesystem
from tandem.utilities.rank_zero import rank_zero_only, rank_zero_warn

if TYPE_CHECKING:
    from torch import nn


class TensorBoardLogger(Logger):
    """Writes scalars and hyperparameters as TensorBoard event files in ``<save_dir>/<name>/version_<n>``.

    Hyperparameters go both to TensorBoard's HPARAMS tab (in the same run, no sub-folder) and to
    ``hparams.yaml``. The tab compares runs by their hyperparameters and by the last value of every
    metric they logged (``val_loss``, ``val_acc``, ...): each run writes its hyperparameters when it
    starts and its status when it ends, and no fixed list of metrics, so TensorBoard gathers the
    hyperparameters of every run and the metrics from their scalars. Watch the runs with
    ``tensorboard --logdir <save_dir>``.

    ``save_dir`` may be an fsspec URL (``s3://bucket/runs`` with s3fs, ``gs://...`` with gcsfs,
    ``memory://...``): the SummaryWriter writes to a local staging folder, and the event files and
    ``hparams.yaml`` are uploaded whole at each :meth:`save` (every epoch end) and at :meth:`finalize` (also
    of a failed or interrupted run); see :class:`~tandem.loggers.logger.StagingFolder`.

    Args:
        save_dir: the folder that holds every experiment: a local path or an fsspec URL.
        name: the experiment's folder under ``save_dir``.
        version: an int (``version_<n>``), a folder name, or ``None`` for the next free ``version_<n>``.
        log_graph: add the model's graph (TensorBoard's GRAPHS tab) at the start of ``fit``, traced with
            ``model.example_input_array``, which the module sets (e.g. ``self.example_input_array =
            torch.zeros(1, 28 * 28)`` in ``__init__``). The trace runs ``forward`` on global rank 0 alone, so
            it suits modules that are whole on every rank (not sharded ones).
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
        log_graph: bool = False,
        **summary_writer_kwargs: Any,
    ) -> None:
        require_url_filesystem("TensorBoardLogger", save_dir)
        super().__init__(save_dir, name, version)
        self._log_graph = log_graph
        self._summary_writer_kwargs = summary_writer_kwargs
        self._experiment: Any = None
        self._session_started = False

    @property
    def experiment(self) -> Any:
        """The ``SummaryWriter`` (created with the run folder on first use); a no-op object on other ranks."""
        if rank_zero_only.rank != 0:
            return NoOpExperiment()
        if self._experiment is None:
            from torch.utils.tensorboard import SummaryWriter

            self._experiment = SummaryWriter(log_dir=self._local_log_dir, **self._summary_writer_kwargs)
        return self._experiment

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """All of the step's values in one event (one ``Summary`` holding a value per name), read by TensorBoard
        as ``add_scalar`` would have written them: one event per value costs ~27 us each, one summary ~1.5 us a
        value (``benchmarks/logging_cost.py``)."""
        if not metrics:
            return
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=key, simple_value=float(value)) for key, value in metrics.items()]
        self.experiment.file_writer.add_summary(Summary(value=values), step)

    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        from torch.utils.tensorboard.summary import hparams

        merged = self._save_hparams_yaml(params)
        flat = {k: _tb_value(v) for k, v in flatten_params(merged).items()}
        # Only the session start. An experiment summary would fix the metric list (empty here: metrics come
        # later) and TensorBoard would take one run's summary for all of them; without one it lists every
        # run's hyperparameters and every scalar as a metric. (add_hparams would write to a sub-folder.)
        _, session_start, _ = hparams(flat, {})
        self.experiment.file_writer.add_summary(session_start)
        self._session_started = True

    @rank_zero_only
    def log_graph(self, model: nn.Module, input_array: Any = None) -> None:
        if not self._log_graph:
            return
        if input_array is None:
            input_array = getattr(model, "example_input_array", None)
        if input_array is None:
            rank_zero_warn(
                "TensorBoardLogger(log_graph=True) could not add the model's graph: the module has no "
                "example_input_array. Set one in its __init__ (e.g. self.example_input_array = torch.zeros(1, 8)), "
                "or call logger.log_graph(model, input_array)."
            )
            return
        if not isinstance(input_array, (torch.Tensor, tuple)):
            rank_zero_warn(
                f"TensorBoardLogger(log_graph=True) could not add the model's graph: example_input_array is a "
                f"{type(input_array).__name__}, which cannot be traced. Give a tensor, or a tuple of forward's "
                "positional arguments."
            )
            return
        with warnings.catch_warnings():  # add_graph traces with torch.jit, which torch now calls deprecated
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.trace", category=DeprecationWarning)
            self.experiment.add_graph(model, _on_device(model, input_array))

    @rank_zero_only
    def save(self) -> None:
        if self._experiment is not None:
            self._experiment.flush()
        self._upload()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._experiment is not None:
            if self._session_started:
                self._experiment.file_writer.add_summary(_session_end(status))
                self._session_started = False
            self._experiment.flush()
            self._experiment.close()
            self._experiment = None  # a later run with this logger opens a new event file
        self._upload()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_experiment"] = None  # a SummaryWriter cannot be pickled (spawned processes)
        return state


def _session_end(status: str) -> Any:
    """The HParams plugin's end-of-session record: the run's status (success, failure)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams import api_pb2, metadata
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData, SessionEndInfo

    code = api_pb2.STATUS_SUCCESS if status == "success" else api_pb2.STATUS_FAILURE
    content = HParamsPluginData(session_end_info=SessionEndInfo(status=code), version=metadata.PLUGIN_DATA_VERSION)
    plugin = SummaryMetadata.PluginData(plugin_name=metadata.PLUGIN_NAME, content=content.SerializeToString())
    value = Summary.Value(tag=metadata.SESSION_END_INFO_TAG, metadata=SummaryMetadata(plugin_data=plugin))
    return Summary(value=[value])


def _on_device(model: nn.Module, batch: Any) -> Any:
    """``batch`` through the module's transfer hooks onto its device, as a batch of dataloader 0 would go."""
    device = getattr(model, "device", None)
    if device is None or not hasattr(model, "transfer_batch_to_device"):  # a plain nn.Module
        return batch
    batch = model.on_before_batch_transfer(batch, 0)
    return model.on_after_batch_transfer(model.transfer_batch_to_device(batch, device, 0), 0)


def _tb_value(value: Any) -> bool | int | float | str:
    """TensorBoard's hparams take numbers, bools and strings; anything else is shown as its ``str()``."""
    return value if isinstance(value, (bool, int, float, str)) else str(value)
