"""Logged values outside the Trainer: the DataParallel replicas' ``self.log`` buffer, the hook running now and the
module a callback's ``self.log`` logs through, torchmetrics detection, and turning logged tensors into numbers. Used by
the metric collector, the hook dispatcher, the module, the DataParallel strategy, callbacks and the progress bar, which
sit in different sub-packages; none of them imports another for these."""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator
from typing import Any

import torch

# Set in a DataParallel replica's thread: self.log calls there are appended to this list (name, value,
# options) instead of being recorded, and the strategy logs each name once, combined across replicas.
_REPLICA_LOGS: contextvars.ContextVar[list[tuple[str, Any, dict[str, Any]]] | None] = contextvars.ContextVar(
    "tandem_replica_logs", default=None
)


#: set by the hook dispatcher (``tandem.trainer.hooks``) around each hook and step it runs: the hook's name, which
#: ``self.log`` reads, and which the module's ``automatic_optimization`` setter records (a change that comes too late)
CURRENT_HOOK: contextvars.ContextVar[str | None] = contextvars.ContextVar("tandem_current_hook", default=None)


# Set by the hook dispatcher for the block in which a run's stage runs: the run's module, which a callback's
# self.log (Callback.log) logs through.
_RUNNING_MODULE: contextvars.ContextVar[Any] = contextvars.ContextVar("tandem_running_module", default=None)

#: the module whose run is in a stage now, or None (see ``logging_module``)
running_module = _RUNNING_MODULE.get


@contextlib.contextmanager
def logging_module(module: Any) -> Iterator[None]:
    """``module`` is ``running_module`` inside the block (the hook dispatcher opens one per running stage)."""
    token = _RUNNING_MODULE.set(module)
    try:
        yield
    finally:
        _RUNNING_MODULE.reset(token)


@contextlib.contextmanager
def replica_log_buffer() -> Iterator[list[tuple[str, Any, dict[str, Any]]]]:
    """Collect the ``self.log`` calls made in this thread inside the block into the yielded list.

    Each item is ``(name, value, options)``: the value as a detached scalar tensor (or a torchmetrics
    Metric), the options as given to ``self.log``. Nothing reaches the collector; the caller combines
    and logs. DataParallel opens one buffer in each replica's thread.
    """
    buffer: list[tuple[str, Any, dict[str, Any]]] = []
    token = _REPLICA_LOGS.set(buffer)
    try:
        yield buffer
    finally:
        _REPLICA_LOGS.reset(token)


def is_metric(value: Any) -> bool:
    """A torchmetrics Metric? (torchmetrics is only imported if the user imported it.)"""
    torchmetrics = sys.modules.get("torchmetrics")
    return torchmetrics is not None and isinstance(value, torchmetrics.Metric)


#: the buffer of the ``replica_log_buffer`` open in this thread, or None outside one (the context
#: variable's own ``get``: ``self.log`` asks it on every call)
replica_logs = _REPLICA_LOGS.get


def to_float(metrics: dict[Any, Any], dtype: torch.dtype = torch.float32) -> dict[Any, float]:
    """One host sync for all values at once, only when a logger needs numbers (``dtype``: the precision they are
    read in; float64 for sums that are reduced further)."""
    if not metrics:
        return {}
    if len(metrics) == 1:  # one number (a loss): read it, no stack
        ((name, value),) = metrics.items()
        if isinstance(value, torch.Tensor):
            return {name: (value if value.dtype is dtype else value.to(dtype)).item()}
        return {name: float(value)}
    names = list(metrics)
    values = [metrics[n] for n in names]
    # a one-number tensor of the dtype already (what self.log keeps) is stacked as it is: no copy, no view
    tensors = [
        v if v.dtype is dtype and not v.ndim else v.to(dtype).reshape(()) for v in values if isinstance(v, torch.Tensor)
    ]
    if len(tensors) == len(values) and len({t.device for t in tensors}) == 1:
        return dict(zip(names, torch.stack(tensors).cpu().tolist()))
    return {n: float(v) for n, v in zip(names, values)}
