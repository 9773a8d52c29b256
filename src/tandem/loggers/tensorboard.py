"""TensorBoard logging: tandem writes the run's event file itself (``EventFile``, synchronous and buffered, no
thread); ``logger.experiment``, torch's ``SummaryWriter``, is created on first use and writes into the same file."""

from __future__ import annotations

import argparse
import itertools
import math
import os
import socket
import struct
import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import torch

from tandem.loggers.logger import HPARAMS_FILE, Logger, NoOpExperiment, flatten_params, require_url_filesystem
from tandem.utilities.cloud_io import is_url
from tandem.utilities.rank_zero import rank_zero_only, rank_zero_warn

if TYPE_CHECKING:
    from torch import nn

    from tandem.module import TrainingModule


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
    ``hparams.yaml`` are uploaded whole at each ``save`` (every epoch end) and at ``finalize`` (also
    of a failed or interrupted run); see ``StagingFolder``.

    Args:
        save_dir: the folder that holds every experiment: a local path or an fsspec URL.
        name: the experiment's folder under ``save_dir``.
        version: an int (``version_<n>``), a folder name, or ``None`` for the next free ``version_<n>``.
        log_graph: add the model's graph (TensorBoard's GRAPHS tab) at the start of ``fit``, traced with
            ``model.example_input_array``, which the module sets (e.g. ``self.example_input_array =
            torch.zeros(1, 28 * 28)`` in ``__init__``). The trace runs ``forward`` on global rank 0 alone, so
            it suits modules that are whole on every rank (not sharded ones).
        default_hp_metric: [`log_hyperparams`][tandem.loggers.TensorBoardLogger.log_hyperparams] without ``metrics``
            logs the placeholder ``hp_metric: -1`` (Lightning's), a value to overwrite with the run's score
            (``self.log("hp_metric", score)``).
        **summary_writer_kwargs: passed to ``SummaryWriter`` (``logger.experiment``); ``flush_secs``,
            ``filename_suffix`` and ``purge_step`` also apply to the event file the logger's own values go to.

    Example:
        ```python
        logger = TensorBoardLogger("runs", name="mnist")
        trainer = Trainer(logger=logger, max_epochs=3)
        logger.experiment.add_histogram("weights", w, step)  # the SummaryWriter itself
        ```
    """

    def __init__(
        self,
        save_dir: str | os.PathLike,
        name: str = "tandem_logs",
        version: int | str | None = None,
        log_graph: bool = False,
        default_hp_metric: bool = True,
        **summary_writer_kwargs: Any,
    ) -> None:
        require_url_filesystem("TensorBoardLogger", save_dir)
        super().__init__(save_dir, name, version)
        self._log_graph = log_graph
        self._default_hp_metric = default_hp_metric
        self._summary_writer_kwargs = summary_writer_kwargs
        self._experiment: Any = None
        self._events: EventFile | None = None  # the run's event file, opened at the first write
        self._session_started = False

    @property
    def log_dir(self) -> str:
        """``<save_dir>/<name>/version_<n>``, or ``<save_dir>/<name>/<version>`` for a str version."""
        log_dir = super().log_dir
        assert log_dir is not None  # its root_dir is always a folder
        return log_dir

    @property
    def experiment(self) -> Any:
        """The ``SummaryWriter`` (created on first use); a no-op object on other ranks. It writes into the run's one
        event file, the one the logger's own values go to (TensorBoard reads a run's files one after the other)."""
        if rank_zero_only.rank != 0:  # type: ignore[attr-defined]  # set by tandem.utilities.rank_zero.set_rank
            return NoOpExperiment()
        if self._experiment is None:
            from torch.utils.tensorboard import SummaryWriter

            events = self._event_file()
            writer = SummaryWriter(log_dir=self._local_log_dir, **self._summary_writer_kwargs)
            events.adopt(writer.file_writer)
            self._experiment = writer
        return self._experiment

    def _event_file(self) -> EventFile:
        """The run's event file, opened (in the run folder) at the first write."""
        if self._events is None:
            kwargs = self._summary_writer_kwargs
            self._events = EventFile(
                self._local_log_dir,
                flush_secs=kwargs.get("flush_secs", 120),
                filename_suffix=kwargs.get("filename_suffix", ""),
                purge_step=kwargs.get("purge_step"),
            )
        return self._events

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """All of the step's values in one event (a ``Summary`` holding a value per name), encoded by tandem and
        written in this thread (``EventFile.add_scalars``): TensorBoard reads it as ``add_scalar`` would have
        written each value."""
        if metrics:
            events = self._events if self._events is not None else self._event_file()
            events.add_scalars(metrics, 0 if step is None else step)

    @rank_zero_only
    def log_hyperparams(
        self,
        params: Mapping[str, Any] | argparse.Namespace,
        metrics: Mapping[str, float] | float | None = None,
        step: int | None = None,
    ) -> None:
        """Record the hyperparameters (the HPARAMS tab and ``hparams.yaml``) and, as Lightning, ``metrics`` at ``step``
        through [`log_metrics`][tandem.loggers.TensorBoardLogger.log_metrics]: ``hp_metric: -1`` when none are given
        under ``default_hp_metric=True``, a number as ``{"hp_metric": number}``. The tab lists every scalar of the run
        as a metric, these among them."""
        from torch.utils.tensorboard.summary import hparams

        if metrics is None:
            metrics = {"hp_metric": -1} if self._default_hp_metric else {}
        elif not isinstance(metrics, Mapping):
            metrics = {"hp_metric": metrics}
        if metrics:
            self.log_metrics(dict(metrics), step)
        merged = self._save_hparams_yaml(params)
        flat = {k: _tb_value(v) for k, v in flatten_params(merged).items()}
        # Only the session start. An experiment summary would fix the metric list (empty here: metrics come
        # later) and TensorBoard would take one run's summary for all of them; without one it lists every
        # run's hyperparameters and every scalar as a metric. (add_hparams would write to a sub-folder.)
        _, session_start, _ = hparams(flat, {})
        self._event_file().add_summary(session_start)
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
        if self._events is not None:
            self._events.flush()
        self._hparams_file_once()
        self._upload()

    def _hparams_file_once(self) -> None:
        """Lightning's: once the run folder exists, it holds ``hparams.yaml``, written with what was logged (empty
        when no hyperparameters were), unless already there. A URL ``save_dir``'s file is written at each log."""
        if is_url(self._save_dir):
            return
        folder = self._local_log_dir
        if os.path.isdir(folder) and not os.path.isfile(os.path.join(folder, HPARAMS_FILE)):
            self._save_hparams_yaml({})

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if status == "success":  # as Lightning's, which saves at a successful end
            self._hparams_file_once()
        if self._events is not None:
            if self._session_started:
                self._events.add_summary(_session_end(status))
                self._session_started = False
            if self._experiment is not None:
                self._experiment.close()  # closes the event file it writes into
            self._events.close()
            self._experiment = self._events = None  # a later run with this logger opens a new event file
        self._upload()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_experiment"] = state["_events"] = None  # open files cannot be pickled (spawned processes)
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
    hooks = cast("TrainingModule", model)  # it has the transfer hooks
    batch = hooks.on_before_batch_transfer(batch, 0)
    return hooks.on_after_batch_transfer(hooks.transfer_batch_to_device(batch, device, 0), 0)


def _tb_value(value: Any) -> bool | int | float | str:
    """TensorBoard's hparams take numbers, bools and strings; anything else is shown as its ``str()``."""
    return value if isinstance(value, (bool, int, float, str)) else str(value)


# ---------------------------------------------------------------------- the event file
_FILE_IDS = itertools.count()
_BYTES = [bytes((i,)) for i in range(128)]
_CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _CRC32C_POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """The TFRecord format's checksum of ``data``: CRC-32C, rotated and offset (TensorFlow's ``MaskedCrc``)."""
    table, crc = _CRC32C_TABLE, 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _BYTES[value]
    if 0 < value < 0x4000:  # two bytes (the steps of most runs)
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    value &= 0xFFFFFFFFFFFFFFFF  # a negative int64 as protobuf writes it (ten bytes)
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _float32(value: float) -> float:
    """``value``, or infinity where it is beyond float32 (as protobuf stores it)."""
    return value if abs(value) <= _FLOAT32_MAX or math.isnan(value) else math.copysign(math.inf, value)


_FLOAT32_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]


class EventFile:
    """A TensorBoard event file (TFRecord framing of ``Event`` protos) written in the calling thread through a
    buffered file: no writer thread takes the interpreter from the training loop after a publishing step.
    Events are kept as they are added and framed (the length and data checksums, CRC-32C in Python) when they are
    written, at a flush: a publishing step only encodes.

    Scalars are encoded here, without protobuf objects (``add_scalars``: ``Event{wall_time, step,
    summary{value{tag, simple_value}...}}``, the bytes protobuf writes); other events (hyperparameters, a
    ``SummaryWriter``'s histograms and graphs) are serialized by protobuf (``add_event``). They reach the disk
    at ``flush`` (every epoch end, through the logger's ``save``), at the first event added ``flush_secs``
    after the last flush, and at ``close``.

    Args:
        log_dir: the folder of the file (created if missing).
        flush_secs: the longest a written event waits in the buffer while writes go on.
        filename_suffix: appended to the file's name (``SummaryWriter``'s argument).
        purge_step: ``SummaryWriter``'s argument: TensorBoard drops this run's events from that step on.
    """

    def __init__(
        self, log_dir: str, flush_secs: float = 120, filename_suffix: str = "", purge_step: int | None = None
    ) -> None:
        os.makedirs(log_dir, exist_ok=True)
        self._log_dir, self._flush_secs = log_dir, flush_secs
        # TensorBoard's name pattern; "tandem" before the counter keeps it apart from a SummaryWriter's own files
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.tandem{next(_FILE_IDS)}"
        )
        self.path = os.path.join(log_dir, name + filename_suffix)
        self._file: Any = open(self.path, "xb")  # noqa: SIM115 - held open for the run, closed by close()
        self._flushed_at = time.monotonic()
        self._layouts: dict[tuple[str, ...], _SummaryLayout] = {}  # by the names of add_scalars
        self._headers: dict[int, bytes] = {}  # record length -> its framing header
        self._pending: list[bytes] = []  # events added since the last flush, not framed yet
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self.add_event(Event(file_version="brain.Event:2"))
        if purge_step is not None:  # as SummaryWriter writes them
            self.add_event(Event(step=purge_step, file_version="brain.Event:2"))
            self.add_event(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))
        self.flush()

    def add_scalars(self, values: Mapping[str, float], step: int) -> None:
        """One event at ``step`` holding a simple value per name (``float32``, as ``add_scalar`` stores it)."""
        names = tuple(values)
        layout = self._layouts.get(names)
        if layout is None:
            layout = self._layouts[names] = _SummaryLayout(names)
        try:
            summary = layout.pack(*itertools.chain.from_iterable(zip(layout.prefixes, values.values())))
        except OverflowError:  # a value beyond float32: protobuf stores infinity
            floats = [_float32(v) for v in values.values()]
            summary = layout.pack(*itertools.chain.from_iterable(zip(layout.prefixes, floats)))
        # a zero int64 is not written (proto3); framed (two checksums) at the next flush, not on the training step
        step_part = (b"\x10" + _varint(step)) if step else b""
        self._pending.append(_WALL_TIME.pack(0x09, time.time()) + step_part + layout.field + summary)
        if time.monotonic() - self._flushed_at > self._flush_secs:
            self.flush()

    def add_event(self, event: Any) -> None:
        """An ``Event`` proto, with the wall time now unless it has one (``FileWriter``'s ``event_writer`` API)."""
        if not event.wall_time:
            event.wall_time = time.time()
        self._pending.append(event.SerializeToString())
        if time.monotonic() - self._flushed_at > self._flush_secs:
            self.flush()

    def add_summary(self, summary: Any, step: int | None = None) -> None:
        """A ``Summary`` proto in an event of its own."""
        from tensorboard.compat.proto.event_pb2 import Event

        event = Event(summary=summary)
        if step is not None:
            event.step = int(step)
        self.add_event(event)

    def _frame(self, data: bytes) -> bytes:
        """One TFRecord: the length, its checksum, the data, its checksum."""
        header = self._headers.get(len(data))
        if header is None:
            length = struct.pack("<Q", len(data))
            header = self._headers[len(data)] = length + struct.pack("<I", masked_crc32c(length))
        return header + data + struct.pack("<I", masked_crc32c(data))

    def adopt(self, file_writer: Any) -> None:
        """Take over a ``SummaryWriter``'s ``FileWriter``: its events go into this file from now on, and the file it
        opened (holding only its version record) is removed, so that the run has one event file."""
        own = file_writer.event_writer
        own.close()
        path = getattr(own, "_file_name", None)
        if path is not None and os.path.exists(path):
            os.remove(path)
        file_writer.event_writer = self

    def get_logdir(self) -> str:
        return self._log_dir

    def flush(self) -> None:
        """Write the events added since the last flush, and flush the file."""
        pending, self._pending = self._pending, []
        if not self._file.closed:
            self._file.write(b"".join([self._frame(data) for data in pending]))
            self._file.flush()
        self._flushed_at = time.monotonic()

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()

    def reopen(self) -> None:
        """``FileWriter.reopen``: nothing to do (a closed logger opens a new file at its next write)."""


class _SummaryLayout:
    """A ``Summary`` of simple values under fixed names, as one ``struct``: each ``Summary.value`` field with its
    ``Value{tag}`` and the key of ``simple_value`` (``prefixes``), then the float."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.prefixes = []
        for name in names:
            tag = name.encode()
            value = b"\x0a" + _varint(len(tag)) + tag + b"\x15"
            self.prefixes.append(b"\x0a" + _varint(len(value) + 4) + value)
        packer = struct.Struct("<" + "".join(f"{len(prefix)}sf" for prefix in self.prefixes))
        self.pack = packer.pack
        self.field = b"\x2a" + _varint(packer.size)  # the Event's summary field, up to the Summary


_WALL_TIME = struct.Struct("<Bd")  # the Event's wall_time field
