"""What ``self.log`` collects: step values, epoch aggregates, cross-process reduction, and routing.

One ``MetricCollector`` per Trainer. Values stay tensors on the device (no host sync per step); they are
turned into floats only when a logger or the progress bar needs them. Epoch means are kept as a
weighted sum and a count, reduced across processes as sums and counts, then divided.
"""

from __future__ import annotations

import contextlib
import contextvars
import numbers
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from tandem.utilities.exceptions import TandemUserCodeError, bad_choice

REDUCE_FX = ("mean", "sum", "max", "min")

# Hooks whose self.log calls default to on_step=True, on_epoch=False (everything else: the reverse).
_STEP_HOOKS = frozenset(
    {
        "training_step",
        "on_train_batch_start",
        "on_train_batch_end",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_before_zero_grad",
    }
)


# Set in a DataParallel replica's thread: self.log calls there are appended to this list (name, value,
# options) instead of being recorded, and the strategy logs each name once, combined across replicas.
_REPLICA_LOGS: contextvars.ContextVar[list[tuple[str, Any, dict[str, Any]]] | None] = contextvars.ContextVar(
    "tandem_replica_logs", default=None
)


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


def _is_metric(value: Any) -> bool:
    """A torchmetrics Metric? (torchmetrics is only imported if the user imported it.)"""
    torchmetrics = sys.modules.get("torchmetrics")
    return torchmetrics is not None and isinstance(value, torchmetrics.Metric)


@dataclass
class _Entry:
    """Everything logged under one name in the current stage."""

    on_step: bool
    on_epoch: bool
    prog_bar: bool
    logger: bool
    sync_dist: bool
    reduce_fx: str
    metric: Any = None  # a torchmetrics.Metric, computed (and synced by itself) at epoch end
    step_value: torch.Tensor | None = None
    total: torch.Tensor | None = None  # weighted sum for "mean"/"sum", running max/min otherwise
    count: torch.Tensor | None = None  # sum of weights, for "mean"
    updated: bool = field(default=False)  # logged since the last step flush
    epoch_value: torch.Tensor | None = None  # the aggregate, once computed
    dirty: bool = field(default=False)  # logged since epoch_value was computed

    def accumulate(self, value: torch.Tensor, weight: int) -> None:
        if self.reduce_fx in ("mean", "sum"):
            contribution = value * weight if self.reduce_fx == "mean" else value
            self.total = contribution if self.total is None else self.total + contribution
            w = torch.as_tensor(float(weight), device=value.device, dtype=value.dtype)
            self.count = w if self.count is None else self.count + w
        else:
            pick = torch.maximum if self.reduce_fx == "max" else torch.minimum
            self.total = value if self.total is None else pick(self.total, value)


class MetricCollector:
    """Collects ``self.log`` values for one stage at a time and publishes them.

    Attributes:
        callback_metrics: every latest value (step and epoch), what callbacks monitor.
        logged_metrics: what was last sent to the loggers.
        progress_bar_metrics: the ``prog_bar=True`` values.
    """

    def __init__(self, reduce: Callable[[torch.Tensor, str], torch.Tensor]) -> None:
        self._reduce = reduce  # the strategy's collective: (tensor, "sum" | "max" | "min" | "mean") -> tensor
        self._stores: dict[str, dict[str, _Entry]] = {}  # per stage: "train", "validate", "test", "predict"
        self.stage = "train"
        self._epoch_values: dict[str, dict[str, torch.Tensor]] = {}
        self.hook: str | None = None  # the hook now running, which sets the on_step / on_epoch defaults
        self.batch: Any = None  # the batch now running, for inferring batch sizes
        self._batch_size: int | None = None
        self.callback_metrics: dict[str, torch.Tensor] = {}
        self.logged_metrics: dict[str, float] = {}
        self.progress_bar_metrics: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ collecting
    def set_batch(self, batch: Any) -> None:
        self.batch, self._batch_size = batch, None

    def log(
        self,
        name: str,
        value: Any,
        on_step: bool | None,
        on_epoch: bool | None,
        prog_bar: bool,
        logger: bool,
        sync_dist: bool,
        reduce_fx: str,
        batch_size: int | None,
    ) -> None:
        if reduce_fx not in REDUCE_FX:
            raise bad_choice(f"self.log({name!r}, reduce_fx=...)", reduce_fx, REDUCE_FX)
        buffer = _REPLICA_LOGS.get()
        if buffer is not None:  # inside a DataParallel replica: the strategy combines and logs once
            options = dict(
                on_step=on_step,
                on_epoch=on_epoch,
                prog_bar=prog_bar,
                logger=logger,
                sync_dist=sync_dist,
                reduce_fx=reduce_fx,
                batch_size=batch_size,
            )
            buffer.append((name, value if _is_metric(value) else self._as_tensor(name, value), options))
            return
        if on_step is None or on_epoch is None:
            in_step_hook = self.hook in _STEP_HOOKS
            on_step = in_step_hook if on_step is None else on_step
            on_epoch = (not in_step_hook) if on_epoch is None else on_epoch
        if isinstance(value, torch.Tensor) and value.ndim == 0:  # the common case, kept cheap
            value, metric = value.detach(), None
        else:
            metric = value if _is_metric(value) else None
            if metric is None:
                value = self._as_tensor(name, value)
        entries = self._stores.get(self.stage)
        if entries is None:
            entries = self._stores[self.stage] = {}
        entry = entries.get(name)
        if entry is None:
            entry = entries[name] = _Entry(on_step, on_epoch, prog_bar, logger, sync_dist, reduce_fx, metric=metric)
        if metric is not None:
            entry.metric = metric
            entry.dirty = entry.dirty or on_epoch
            cached = getattr(metric, "_forward_cache", None)
            step_value = cached.detach() if isinstance(cached, torch.Tensor) else None
        else:
            step_value = value
            # Evaluation ranks run different numbers of batches (every sample exactly once), so a
            # per-step collective there would wait forever: evaluation step values stay per rank.
            if sync_dist and on_step and self.stage == "train":
                step_value = self._reduce(value, reduce_fx)
            if on_epoch:
                weight = batch_size if batch_size is not None else self._current_batch_size()
                entry.accumulate(value, max(weight, 1) if reduce_fx == "mean" else 1)
                entry.dirty = True
        entry.step_value = step_value
        entry.updated = True
        if step_value is not None:
            key = f"{name}_step" if on_step and on_epoch else name
            self.callback_metrics[key] = step_value
            if on_step and on_epoch:
                self.callback_metrics[name] = step_value
            if prog_bar and on_step:
                self.progress_bar_metrics[key] = step_value

    @staticmethod
    def _as_tensor(name: str, value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise TandemUserCodeError(
                    f"self.log({name!r}, ...) got a tensor of shape {tuple(value.shape)}; log one number per "
                    "name, e.g. value.mean(), or a torchmetrics Metric."
                )
            value = value.detach()
            return value if value.ndim == 0 else value.reshape(())
        if isinstance(value, numbers.Number) and not isinstance(value, bool):
            return torch.tensor(float(value))
        raise TandemUserCodeError(
            f"self.log({name!r}, ...) got {type(value).__name__}; expected a number, a one-element tensor or a "
            "torchmetrics Metric. Log each number under its own name (self.log_dict for several)."
        )

    def _current_batch_size(self) -> int:
        if self._batch_size is None:
            from tandem.utilities.data import extract_batch_size

            self._batch_size = extract_batch_size(self.batch) or 1
        return self._batch_size

    # ------------------------------------------------------------------ publishing
    def step_metrics(self) -> dict[str, torch.Tensor]:
        """Values logged with on_step since the last call, for the loggers; clears the 'updated' marks."""
        out = {}
        for name, entry in self._stores.get(self.stage, {}).items():
            if entry.updated and entry.on_step and entry.logger and entry.step_value is not None:
                out[f"{name}_step" if entry.on_epoch else name] = entry.step_value
            entry.updated = False
        return out

    def epoch_metrics(self) -> dict[str, torch.Tensor]:
        """Aggregate every on_epoch value of the stage (reducing across processes where asked),
        publish them to ``callback_metrics``, and return those meant for the loggers."""
        out, values = {}, {}
        for name, entry in self._stores.get(self.stage, {}).items():
            if not entry.on_epoch:
                continue
            if entry.dirty:
                entry.epoch_value, entry.dirty = self._epoch_value(entry), False
            value = entry.epoch_value
            if value is None:
                continue
            key = f"{name}_epoch" if entry.on_step else name
            values[key] = value
            self.callback_metrics[key] = value
            self.callback_metrics[name] = value
            if entry.prog_bar:
                self.progress_bar_metrics[key] = value
            if entry.logger:
                out[key] = value
        self._epoch_values[self.stage] = values
        return out

    def stage_values(self) -> dict[str, torch.Tensor]:
        """Every epoch value of the current stage's last epoch (what ``validate`` / ``test`` return)."""
        return dict(self._epoch_values.get(self.stage, {}))

    def _epoch_value(self, entry: _Entry) -> torch.Tensor | None:
        if entry.metric is not None:
            value = entry.metric.compute()  # torchmetrics syncs across processes itself
            entry.metric.reset()
            return value.detach() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
        if entry.total is None:
            return None
        total = entry.total
        if entry.reduce_fx == "mean":
            count = entry.count
            if entry.sync_dist:
                total, count = self._reduce(total, "sum"), self._reduce(count, "sum")
            return total / count
        return self._reduce(total, entry.reduce_fx) if entry.sync_dist else total

    def reset(self, state: dict[str, Any] | None = None) -> None:
        """Start an epoch of the current stage: forget its entries, or reinstate those saved by :meth:`state_dict`."""
        self._stores[self.stage] = {name: _Entry(**fields) for name, fields in (state or {}).items()}

    def clear_published(self) -> None:
        """Forget published values (e.g. after the sanity check)."""
        self.callback_metrics, self.logged_metrics, self.progress_bar_metrics = {}, {}, {}

    def state_dict(self) -> dict[str, Any]:
        """The training epoch's partial aggregates (torchmetrics objects keep their own state in the module)."""
        keep = ("on_step", "on_epoch", "prog_bar", "logger", "sync_dist", "reduce_fx", "total", "count", "dirty")
        return {
            name: {k: getattr(e, k) for k in keep}
            for name, e in self._stores.get("train", {}).items()
            if e.metric is None
        }


def to_float(metrics: dict[str, Any]) -> dict[str, float]:
    """One host sync for all values at once, only when a logger needs numbers."""
    if not metrics:
        return {}
    names = list(metrics)
    values = [metrics[n] for n in names]
    tensors = [v.float().reshape(()) for v in values if isinstance(v, torch.Tensor)]
    if len(tensors) == len(values) and len({t.device for t in tensors}) == 1:
        return dict(zip(names, torch.stack(tensors).cpu().tolist()))
    return {n: float(v) for n, v in zip(names, values)}
