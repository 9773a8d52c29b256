"""One logged name's record in a stage (``_Entry``: its options, step value and epoch aggregate), and the keys its
values are published under (Lightning's ``loss_step`` / ``loss_epoch`` and ``/dataloader_idx_N`` names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

#: logged in float32: a 16-bit running sum or count stops counting (bfloat16: 256 + 1 == 256)
_HALF_DTYPES = frozenset((torch.float16, torch.bfloat16))


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
    step_unsynced: bool = field(default=False)  # a sync_dist step value not yet reduced across processes
    hook: str | None = None  # the hook of the latest call, whose logging rule was checked (see check_log_call)
    options: tuple[Any, ...] = ()  # that hook's first call's (on_step, on_epoch, prog_bar, logger, reduce_fx)
    loader: int | None = None  # the evaluation loader it was first logged from (None: training, epoch hooks)
    rank_zero_only: bool = False  # logged on rank 0 alone (never reduced, on purpose)
    # the latest call's (hook, stage, loader, arguments) and what they resolved to (see MetricCollector.log)
    repeat: tuple[Any, ...] = field(default=(), repr=False, compare=False)

    def accumulate(self, value: torch.Tensor, weight: int) -> None:
        if self.reduce_fx in ("mean", "sum"):
            contribution = value * weight if self.reduce_fx == "mean" else value
            self.total = contribution if self.total is None else self.total + contribution
            w = torch.as_tensor(float(weight), device=value.device, dtype=value.dtype)
            self.count = w if self.count is None else self.count + w
        else:
            pick = torch.maximum if self.reduce_fx == "max" else torch.minimum
            self.total = value if self.total is None else pick(self.total, value)


#: what names logged from one of several evaluation loaders end with (then the loader's index; Lightning's)
LOADER_SUFFIX = "/dataloader_idx_"


def _published_keys(
    name: str, on_step: bool, on_epoch: bool, prog_bar: bool, callbacks: bool = True
) -> tuple[str | None, str | None, str | None]:
    """Where a logged step value is published: its ``callback_metrics`` key (``loss_step`` when logged per step and
    per epoch), the plain name too in that case (else None), and its progress bar key (None: not shown). Evaluation
    step values (``callbacks=False``) are not callback metrics, as in Lightning: only their epoch values are."""
    key = _forked(name, "step") if on_step and on_epoch else name
    bar = key if prog_bar and on_step else None
    if not callbacks and on_step:
        return None, None, bar
    return key, name if on_step and on_epoch else None, bar


def _loader_of(name: str, entry: _Entry) -> int | None:
    """The evaluation loader a value belongs to: the one it was logged from, else the one its name says (an entry
    another rank made, see ``MetricCollector._sync``); None: logged outside any loader."""
    if entry.loader is not None:
        return entry.loader
    _, suffix, index = name.rpartition(LOADER_SUFFIX)
    return int(index) if suffix and index.isdigit() else None


def _forked(name: str, kind: str) -> str:
    """The name of a value logged both per step and per epoch, Lightning's: ``loss_step``, and with several evaluation
    loaders ``loss_step/dataloader_idx_1`` (the loader's suffix stays last)."""
    base, suffix, index = name.partition(LOADER_SUFFIX)
    return f"{base}_{kind}{suffix}{index}"
