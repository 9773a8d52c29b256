"""What ``self.log`` collects: step values, epoch aggregates, cross-process reduction, and routing.

One ``MetricCollector`` per Trainer. Values stay tensors on the device (no host sync per step); they are
turned into floats only when a logger or the progress bar needs them. Epoch means are kept as a
weighted sum and a count, reduced across processes as sums and counts, then divided.

Values logged with ``sync_dist=True`` are reduced across processes by name, never by the order they were
logged in. Every rank packs the names it needs reduced, sorted, with their values (read as floats, one
conversion per rank: ``pack``); when every rank packed alike (one small all-reduce of the layout's hash
says so), the values are reduced as packed sums and maxima, whose size does not grow with the ranks. When the
names differ (conditional logging), every rank gathers what each sent and reduces the union of names the same
way, in rank order (``combine_by_name``); a rank without a value counts as absent. Epoch values are reduced
once per epoch end; step values at the steps whose values are published (every ``log_every_n_steps`` steps and
at the epoch's end), never on the steps in between.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, SupportsFloat, cast

import torch

from tandem.trainer.hooks import STEP_HOOKS, current_hook
from tandem.utilities.exceptions import LogCallError, LogValueError, TandemUserCodeError, bad_choice
from tandem.utilities.logged_values import is_metric, replica_logs, to_float
from tandem.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from tandem.loggers.logger import Logger
    from tandem.strategies.strategy import Strategy
    from tandem.trainer.state import LoopState, TrainerState

REDUCE_FX = ("mean", "sum", "max", "min")
#: the functions ``self.log(reduce_fx=...)`` accepts besides the names (Lightning's): torch's reductions, the builtins
_REDUCE_FUNCTIONS = {
    torch.mean: "mean",
    torch.sum: "sum",
    sum: "sum",
    torch.max: "max",
    max: "max",
    torch.min: "min",
    min: "min",
}
#: logged in float32: a 16-bit running sum or count stops counting (bfloat16: 256 + 1 == 256)
_HALF_DTYPES = frozenset((torch.float16, torch.bfloat16))
_FLOAT32_EXACT = _HALF_DTYPES | {torch.float32}  # read exactly through float32


def reduce_fx_name(name: str, reduce_fx: Any) -> str:
    """``self.log(name, reduce_fx=...)`` as one of ``REDUCE_FX``, as Lightning reads it: a name in any case
    (``"avg"`` is ``"mean"``), or ``torch.mean``, ``torch.sum``, ``torch.max``, ``torch.min`` and the builtins
    ``sum``, ``max``, ``min``. Anything else is refused (a custom reduction is a torchmetrics Metric's job)."""
    if isinstance(reduce_fx, str):
        fx: str | None = reduce_fx.lower()
        fx = "mean" if fx == "avg" else fx
    else:
        try:
            fx = _REDUCE_FUNCTIONS.get(reduce_fx)
        except TypeError:  # unhashable: none of them
            fx = None
    if fx in REDUCE_FX:
        return fx
    raise bad_choice(
        f"self.log({name!r}, reduce_fx=...)",
        reduce_fx,
        REDUCE_FX,
        fix="Names are read in any case ('avg' is 'mean'); torch.mean, torch.sum, torch.max, torch.min and the "
        "builtins sum, max and min are accepted too. For a custom reduction, log a torchmetrics.Metric instead.",
        lead="Only `self.log(..., reduce_fx={min,max,mean,sum})` are supported.",
    )


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


@dataclass
class PublishedStep:
    """One publishing round of step values (the loggers' row is read after the batch's ``on_train_batch_end``:
    ``MetricCollector.step_values``): each process's verdict on its loss (finite or not, in rank order), and whether any process asked to stop (``trainer.should_stop``, e.g. ``max_time``). The
    verdicts travel with the names (no collective of their own). When every process's loss was finite and no
    batch was empty, the lists hold one note for all: ``[True]``, ``[None]``, and one window of the processes'
    mean losses."""

    loss_finite: list[bool]
    stop_asked: bool = False
    empty_batches: list[Any] = field(default_factory=list)  # each process's note (rank order), see publish_step
    windows: list[Any] = field(default_factory=list)  # on_nonfinite="rollback": each process's losses since a check


class MetricCollector:
    """Collects ``self.log`` values for one stage at a time and publishes them.

    The stage is the Trainer's (``state.stage``: the sanity check's values are validation values), the hook
    the dispatcher's (``current_hook``); the collector keeps neither.

    Attributes:
        callback_metrics: every latest value (step and epoch), what callbacks monitor.
        logged_metrics: what was last sent to the loggers.
        progress_bar_metrics: the ``prog_bar=True`` values.
    """

    def __init__(self, strategy: Strategy, state: TrainerState) -> None:
        self._strategy = strategy  # its collectives reduce sync_dist values (see combine_by_name)
        self._state = state
        self._stores: dict[str, dict[str, _Entry]] = {}  # per stage: "train", "validate", "test", "predict"
        self._repeats: dict[str, _Entry] = {}  # by the name self.log got: the entry its latest call went to
        #: the self.log calls of a compiled training step, logged after it (CompiledStepLog); None: no run was compiled
        self.deferred: list[tuple[str, Any, tuple[Any, ...]]] | None = None
        # per stage, its last epoch's values by name, each with the evaluation loader it belongs to (None: all)
        self._epoch_values: dict[str, dict[str, tuple[torch.Tensor, int | None]]] = {}
        self.batch: Any = None  # the batch now running, for inferring batch sizes
        self.dataloader_idx: int | None = None  # with several evaluation loaders: the one now running
        self._batch_size: int | None = None
        self.callback_metrics: dict[str, torch.Tensor] = {}
        #: as Lightning's: one-number float tensors (an integer value read as float32), and what callbacks sent
        #: through trainer.log_metrics as they sent it, in the order first logged
        self.logged_metrics: dict[str, Any] = {}
        self.progress_bar_metrics: dict[str, torch.Tensor] = {}
        self._unsynced_warned = False  # epoch values each process aggregated alone were reported (once)
        self.batch_size_required = False  # training_step(self, dataloader_iter): training logs give batch_size

    @property
    def stage(self) -> str:
        """The store the current values belong to: the Trainer's stage ("validate" during the sanity check,
        "train" outside any stage)."""
        stage = self._state.stage
        return _STORE.get(stage, stage) if stage is not None else "train"

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
        reduce_fx: Any,
        batch_size: int | None,
        rank_zero_only: bool = False,
        add_dataloader_idx: bool = True,
        metric_attribute: str | None = None,
    ) -> None:
        call = (
            current_hook(),
            self._state.stage,
            self.dataloader_idx,
            on_step,
            on_epoch,
            prog_bar,
            logger,
            sync_dist,
            reduce_fx,
            batch_size,
            rank_zero_only,
            add_dataloader_idx,
        )
        # A call like the name's previous one (the same hook, stage, loader and arguments) of a one-number tensor:
        # everything _first_call decides was decided for it then; only the value is new.
        entry = self._repeats.get(name)
        if (
            entry is not None
            and entry.repeat[0] == call
            and type(value) is torch.Tensor
            and not value.ndim
            and replica_logs() is None
        ):
            if value.requires_grad:  # no graph kept; one without (evaluation, no_grad) is kept as it is
                value = value.detach()
            if value.dtype in _HALF_DTYPES:
                value = value.float()
        else:
            entry, value = self._first_call(name, value, call, metric_attribute)
            # None: kept elsewhere (a DataParallel replica's buffer), or a torchmetrics object without a value
            if entry is None:
                return
        # Record the value in its entry (and its epoch aggregate), and publish it (see _published_keys)
        _, key, also, bar, unsynced, on_epoch, reduce_fx = entry.repeat
        entry.step_unsynced = unsynced
        if on_epoch:
            weight = batch_size if batch_size is not None else self._current_batch_size()
            entry.accumulate(value, max(weight, 1) if reduce_fx == "mean" else 1)
            entry.dirty = True
        entry.step_value = value
        entry.updated = True
        if also is not None:  # the plain name first, as Lightning's order of first appearance
            self.callback_metrics[also] = value
        if key is not None:  # None: an evaluation step value, not a callback metric (Lightning's)
            self.callback_metrics[key] = value
        if bar is not None:
            self.progress_bar_metrics[bar] = value

    def _first_call(
        self, name: str, value: Any, call: tuple[Any, ...], metric_attribute: str | None = None
    ) -> tuple[_Entry | None, Any]:
        """A ``self.log`` call unlike the name's previous one: check it, find or make its entry, and decide where its
        value goes (``entry.repeat``: the call, then what it resolved to). Returns the entry and the value to record,
        or None where nothing is left to record. ``metric_attribute``: the module attribute holding a logged
        torchmetrics Metric (None: found among the module's submodules)."""
        hook, stage, loader, on_step, on_epoch, prog_bar, logger, sync_dist, reduce_fx, batch_size = call[:10]
        rank_zero_only, add_dataloader_idx = call[10:]
        if batch_size is None and self.batch_size_required and stage == "train":
            raise LogCallError(
                "With `def training_step(self, dataloader_iter)`, `self.log(..., batch_size=...)` should be provided: "
                f"self.log({name!r}, ...) got none, and the Trainer cannot infer it, as the step takes its batches "
                f"itself. Pass it, e.g. self.log({name!r}, value, batch_size=len(batch))."
            )
        raw = name
        reduce_fx = reduce_fx_name(name, reduce_fx)  # once per call unlike the name's previous one, as all here
        buffer = replica_logs()
        if buffer is not None:  # inside a DataParallel replica: the strategy combines and logs once
            options = dict(
                on_step=on_step,
                on_epoch=on_epoch,
                prog_bar=prog_bar,
                logger=logger,
                sync_dist=sync_dist,
                reduce_fx=reduce_fx,
                batch_size=batch_size,
                rank_zero_only=rank_zero_only,
                add_dataloader_idx=add_dataloader_idx,
            )
            buffer.append((name, value if is_metric(value) else self._as_tensor(name, value), options))
            return None, None
        if loader is not None and add_dataloader_idx:  # several evaluation loaders (Lightning's names)
            name = f"{name}{LOADER_SUFFIX}{loader}"
        if rank_zero_only:  # logged on rank 0 alone: a collective would wait for the others forever
            sync_dist = False
        if on_step is None or on_epoch is None:
            in_step_hook = hook in STEP_HOOKS
            on_step = in_step_hook if on_step is None else on_step
            on_epoch = (not in_step_hook) if on_epoch is None else on_epoch
        if isinstance(value, torch.Tensor) and value.ndim == 0:  # the common case, kept cheap
            metric = None
            if value.requires_grad:
                value = value.detach()
            if value.dtype in _HALF_DTYPES:
                value = value.float()
        else:
            metric = value if is_metric(value) else None
            if metric is None:
                value = self._as_tensor(name, value)
        stage = self._state.stage  # self.stage, inline
        stage = _STORE.get(stage, stage) if stage is not None else "train"
        entries = self._stores.get(stage)
        if entries is None:
            entries = self._stores[stage] = {}
        entry = entries.get(name)
        if metric is not None and metric_attribute is None and (entry is None or entry.metric is not metric):
            check_metric_attribute(raw, metric, self._strategy.module)  # once per object, name and epoch
        # The rules are checked once per name and hook (and evaluation loader, for add_dataloader_idx=False):
        # on the steps in between, the repeated call's test is all the checking there is.
        if entry is None or entry.hook != hook or (not add_dataloader_idx and entry.loader != loader):
            check_log_call(name, hook, on_step, on_epoch, add_dataloader_idx, loader, entry, self._state.stage)
            if entry is not None and hook in EPOCH_ONLY_HOOKS and entry.hook != hook:
                # A once-per-epoch hook logging a name another hook logged this epoch: the name's series from here on
                # is this hook's, with its options (Lightning keeps one series per hook and name, and the later
                # hook's value is what the name shows). The steps' epoch values were published before the epoch-end
                # hooks ran, so none is lost.
                entry = None
            if entry is None:
                entry = entries[name] = _Entry(
                    on_step,
                    on_epoch,
                    prog_bar,
                    logger,
                    sync_dist,
                    reduce_fx,
                    metric=metric,
                    loader=loader,
                    rank_zero_only=rank_zero_only,
                )
            elif entry.loader is None:
                entry.loader = loader
            entry.hook, entry.options = hook, (on_step, on_epoch, prog_bar, logger, reduce_fx)
        elif entry.options != (on_step, on_epoch, prog_bar, logger, reduce_fx):
            raise LogCallError(
                f"You called `self.log({raw}, ...)` twice in `{hook}` with different arguments (on_step, on_epoch, "
                "prog_bar, logger or reduce_fx): one name holds one series of values. Log it with the same "
                "arguments each time, or under another name."
            )
        keys = _published_keys(name, on_step, on_epoch, prog_bar, callbacks=stage == "train")
        if metric is not None:  # its step value (forward's); its epoch value is computed at the epoch's end
            entry.metric = metric
            entry.dirty = entry.dirty or on_epoch
            cached = getattr(metric, "_forward_cache", None)
            if not isinstance(cached, torch.Tensor):
                entry.step_value, entry.updated = None, True
                return None, None
            entry.repeat = (call, *keys, entry.step_unsynced, False, reduce_fx)
            self._repeats.pop(raw, None)  # a torchmetrics object is never a repeat
            return entry, cached.detach()
        # A synced step value is reduced when the step's values are published (step_metrics), paired by name.
        # Evaluation ranks run different numbers of batches (every sample exactly once), so evaluation step
        # values stay per rank; their epoch values are reduced.
        entry.repeat = (call, *keys, sync_dist and on_step and stage == "train", on_epoch, reduce_fx)
        self._repeats[raw] = entry  # the next call like this one takes the short way
        return entry, value

    @staticmethod
    def _as_tensor(name: str, value: Any) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise LogValueError(
                    f"self.log({name!r}, ...) got a tensor of shape {tuple(value.shape)}, but the tensor must have a "
                    "single element: log one number per name, e.g. value.mean(), or a torchmetrics Metric."
                )
            value = value.detach()
            value = value if value.ndim == 0 else value.reshape(())
            return value.float() if value.dtype in _HALF_DTYPES else value
        if isinstance(value, numbers.Number) and not isinstance(value, bool):  # float32 under a 16-bit default dtype
            default = torch.get_default_dtype()
            number = float(cast(SupportsFloat, value))  # a Number a user logs converts (numpy's, Fraction, Decimal)
            return torch.tensor(number, dtype=torch.float32 if default in _HALF_DTYPES else default)
        raise LogValueError(
            f"`self.log({name}, {value})` was called, but `{type(value).__name__}` values cannot be logged: expected a "
            "number, a one-element tensor or a torchmetrics Metric. Log each number under its own name (self.log_dict "
            "for several)."
        )

    def _current_batch_size(self) -> int:
        if self._batch_size is None:
            from tandem.utilities.data import extract_batch_size

            self._batch_size = extract_batch_size(self.batch) or 1
        return self._batch_size

    # ------------------------------------------------------------------ publishing
    @property
    def _distributed(self) -> bool:  # several processes, or replica groups (ddp_ft) whose quorum reduces the values
        return self._strategy.world_size > 1 or self._strategy.replica_groups is not None

    def publish_step(
        self, loss_finite: bool = True, stop: bool = False, empty_batch: Any = None, window: Any = None
    ) -> PublishedStep:
        """Publish the step values: reduce the ``sync_dist`` ones across processes (every process calls
        this at the same step), then return those logged with on_step since the last call, for the
        loggers, and clear the 'updated' marks. This process's notes come back from every process, in rank order,
        travelling in the same gathering: ``loss_finite`` (its verdict on the step's loss), ``stop`` (it asks to
        stop), ``empty_batch`` (its note of an empty batch trained on, or None) and ``window`` (under
        on_nonfinite="rollback", its losses since the last check)."""
        entries = self._stores.get(self.stage, {})
        if not self._distributed:  # one process: its own notes
            return PublishedStep([loss_finite], stop, [empty_batch], [window])
        notes = self._sync(entries, epoch=False, note=(loss_finite, stop, empty_batch, window))
        return PublishedStep(
            [finite for finite, _, _, _ in notes],
            any(asked for _, asked, _, _ in notes),
            [empty for _, _, empty, _ in notes],
            [losses for _, _, _, losses in notes],
        )

    def step_values(self) -> dict[str, torch.Tensor]:
        """A publishing step's row for the loggers, read after its ``on_train_batch_end`` hooks (Lightning's order):
        the values ``publish_step`` reduced, and what the hooks logged since. Under several processes a
        ``sync_dist`` value the hooks logged is not reduced yet: it waits for the next publishing step."""
        entries = self._stores.get(self.stage, {})
        return self._updated_step_values(entries, True, skip_unsynced=self._distributed)

    def unwritten_step_values(self) -> dict[str, torch.Tensor]:
        """The logger-bound training step values logged since the loggers' last row (the marks stay)."""
        return self._updated_step_values(self._stores.get("train", {}), False, skip_unsynced=self._distributed)

    def logged(self) -> dict[str, Any]:
        """``trainer.logged_metrics``: what was last sent to the loggers and, as Lightning updates it after every
        training batch, written or not, the training step values logged since (tensors, as Lightning's: no host
        sync)."""
        pending = self.unwritten_step_values()
        if pending:
            self.logged_metrics.update(as_logged(pending))
        return self.logged_metrics

    def evaluation_step_values(self) -> dict[str, torch.Tensor]:
        """The ``on_step`` values the evaluation batch that just ran logged, for the loggers: this process's own
        (never reduced: evaluation ranks run different numbers of batches, so a collective per batch would hang)."""
        return self._updated_step_values(self._stores.get(self.stage, {}), True)

    @staticmethod
    def _updated_step_values(
        entries: dict[str, _Entry], clear: bool, skip_unsynced: bool = False
    ) -> dict[str, torch.Tensor]:
        """The logger-bound step values logged since the marks were last cleared, by the name the loggers get;
        ``clear``: clear the marks of those returned."""
        out = {}
        for name, entry in entries.items():
            if not entry.updated or skip_unsynced and entry.step_unsynced:
                continue
            if entry.on_step and entry.logger and entry.step_value is not None:
                out[_forked(name, "step") if entry.on_epoch else name] = entry.step_value
            if clear:
                entry.updated = False
        return out

    def epoch_metrics(self) -> dict[str, torch.Tensor]:
        """Aggregate every on_epoch value of the stage (reducing across processes where asked; every
        process calls this at the same point), publish them to ``callback_metrics``, and return those
        meant for the loggers. Synced step values not yet reduced are reduced now too."""
        entries = self._stores.get(self.stage, {})
        if self._distributed:
            self._sync(entries, epoch=True)
            if not self._unsynced_warned:
                self._warn_unsynced(entries)
        out, values = {}, {}
        for name, entry in entries.items():
            if not entry.on_epoch:
                continue
            if entry.dirty:
                entry.epoch_value, entry.dirty = self._epoch_value(entry), False
            value = entry.epoch_value
            if value is None:
                continue
            key = _forked(name, "epoch") if entry.on_step else name
            values[key] = (value, _loader_of(name, entry))
            self.callback_metrics[name] = value
            self.callback_metrics[key] = value
            if entry.prog_bar:
                self.progress_bar_metrics[key] = value
            if entry.logger:
                out[key] = value
        self._epoch_values[self.stage] = values
        return out

    def _warn_unsynced(self, entries: dict[str, _Entry]) -> None:
        """Epoch values aggregated by each process alone (no ``sync_dist``): what is published is rank 0's share of
        the data. Said once per Trainer, as Lightning says it (once per name)."""
        names = sorted(
            n
            for n, e in entries.items()
            if e.on_epoch and not e.sync_dist and e.metric is None and not e.rank_zero_only
        )
        if names:
            self._unsynced_warned = True
            rank_zero_warn(
                f"Epoch values logged without sync_dist=True under {self._strategy.world_size} processes: {names}. "
                "Each process aggregates only the batches it saw, and what callbacks, loggers and the results show "
                "is rank 0's share. Log them with self.log(name, value, sync_dist=True) to reduce them across "
                "processes (once per epoch), or use a torchmetrics Metric. (Shown once.)"
            )

    def stage_values(self, dataloader_idx: int | None = None) -> dict[str, torch.Tensor]:
        """Every epoch value of the current stage's last epoch (what ``validate`` / ``test`` return); with
        ``dataloader_idx``, that loader's: those logged from it (``add_dataloader_idx=False`` ones included) and
        those logged outside any loader (the epoch-end hooks'), as Lightning splits the results."""
        values = self._epoch_values.get(self.stage, {})
        return {k: v for k, (v, loader) in values.items() if dataloader_idx is None or loader in (None, dataloader_idx)}

    @staticmethod
    def _epoch_value(entry: _Entry) -> torch.Tensor | None:
        """This process's aggregate (synced entries are aggregated by ``_sync`` before this runs). A torchmetrics
        object keeps its state until ``reset_metric_objects`` (its ``compute()`` stays readable meanwhile)."""
        if entry.metric is not None:
            value = entry.metric.compute()
            return value.detach() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
        total, count = entry.total, entry.count
        if total is None:
            return None
        if entry.reduce_fx != "mean":
            return total
        assert count is not None  # a mean's weights accumulate with its total
        return total / count

    def _sync(self, entries: dict[str, _Entry], epoch: bool, note: Any = None) -> list[Any]:
        """Reduce across processes, by name, every value some process needs reduced now.

        Epoch ends (``epoch=True``): synced epoch aggregates and torchmetrics ``Metric`` objects logged
        since they were last computed on any process, plus synced step values not yet reduced. Publishing
        steps: the synced step values. A process that never logged a name contributes the identity and
        receives the result (its entry is created with the options the other processes used). ``note`` (the
        loss's verdict and an empty-batch note, at publishing steps) travels with the names.

        When every rank wants the same names with the same options and its note is unremarkable (see
        ``pack``), the values travel as packed sums and maxima (``Strategy.reduce_if_agreed``: sizes that do
        not grow with the ranks), and one note comes back for all. Otherwise every rank gathers what each sent
        and reduces the union of names in rank order (``combine_by_name``); every process's note comes back,
        in rank order.
        """
        mine: dict[str, tuple[str, bool, tuple[bool, bool, bool, bool]]] = {}
        local: dict[str, tuple[torch.Tensor | None, torch.Tensor | None]] = {}  # the values and weights sent
        for name, logged in entries.items():
            flags = (logged.on_step, logged.on_epoch, logged.prog_bar, logged.logger)
            if logged.step_unsynced:
                mine[f"step/{name}"] = (logged.reduce_fx, True, flags)
                local[f"step/{name}"] = (logged.step_value, None)
            if not epoch or not logged.on_epoch:
                continue
            if logged.metric is not None:  # torchmetrics syncs inside compute(): every process must call it
                mine[f"metric/{name}"] = ("metric", logged.dirty, flags)
            elif logged.sync_dist and (logged.total is not None or logged.dirty):
                mine[f"epoch/{name}"] = (logged.reduce_fx, logged.dirty, flags)
                local[f"epoch/{name}"] = (logged.total, logged.count)
        floats = as_floats(local)
        agreed = _packed_reduction(self._strategy, mine, floats, note)
        if agreed is not None:
            wanted, results, notes = agreed
        else:
            gathered = self._strategy.all_gather_object((mine, note, floats))
            everyone, notes = [g[0] for g in gathered], [g[1] for g in gathered]
            wanted = _agree(everyone)
            for key in wanted:  # decided from what every process sent: all raise together, none hangs
                if key.startswith("metric/") and not all(key in theirs for theirs in everyone):
                    raise _metric_missing(key.split("/", 1)[1], everyone)
            results = combine_by_name(wanted, [g[2] for g in gathered])
        for key, (op, flags) in wanted.items():
            kind, name = key.split("/", 1)
            entry = entries.get(name)
            if entry is None:  # logged elsewhere only: take the other processes' options
                on_step, on_epoch, prog_bar, logger = flags
                entry = entries[name] = _Entry(on_step, on_epoch, prog_bar, logger, sync_dist=True, reduce_fx=op)
            if kind == "metric":
                entry.epoch_value, entry.dirty = self._epoch_value(entry), False
                continue
            value = _as_local(results[key], op, local.get(key, (None, None))[0])
            if kind == "epoch":
                entry.epoch_value, entry.dirty = value, False
            elif value is not None:
                self._publish_step(name, entry, value)
        return notes

    def _publish_step(self, name: str, entry: _Entry, value: torch.Tensor) -> None:
        entry.step_value, entry.step_unsynced = value, False
        key = _forked(name, "step") if entry.on_step and entry.on_epoch else name
        if entry.on_epoch:
            self.callback_metrics[name] = value
        self.callback_metrics[key] = value
        if entry.prog_bar:
            self.progress_bar_metrics[key] = value

    def reset_metric_objects(self) -> None:
        """Reset the torchmetrics objects logged in the current stage, once their epoch values are published (as
        Lightning: after the epoch-end hooks, so a callback there still reads ``metric.compute()``)."""
        for entry in self._stores.get(self.stage, {}).values():
            if entry.metric is not None:
                entry.metric.reset()

    def reset(self, state: dict[str, Any] | None = None) -> None:
        """Start an epoch of the current stage: forget its entries, or reinstate those saved by ``state_dict``."""
        self._stores[self.stage] = {name: _Entry(**fields) for name, fields in (state or {}).items()}
        self._repeats = {}

    def clear_published(self) -> None:
        """Forget published values (e.g. after the sanity check), and the training step values not published."""
        self.callback_metrics, self.logged_metrics, self.progress_bar_metrics = {}, {}, {}
        for entry in self._stores.get("train", {}).values():
            entry.updated = False

    def log_deferred(self) -> None:
        """Log the calls a compiled training step deferred (``CompiledStepLog``), in their order; called right
        after the step returns, while it is still the hook running."""
        deferred = self.deferred
        if deferred:
            calls = deferred[:]
            deferred.clear()
            for name, value, args in calls:
                self.log(name, value, *args)

    def epoch_sums(self) -> dict[str, tuple[Any, Any, bool]]:
        """The training epoch's aggregates as they stand (references: logging replaces them, never changes them),
        for `restore_epoch_sums` to take back a step that did not count (``ddp_ft``'s, see
        `tandem.trainer.step_retry`)."""
        return {name: (e.total, e.count, e.dirty) for name, e in self._stores.get("train", {}).items()}

    def restore_epoch_sums(self, sums: dict[str, tuple[Any, Any, bool]]) -> None:
        for name, entry in self._stores.get("train", {}).items():
            entry.total, entry.count, entry.dirty = sums.get(name, (None, None, False))

    def state_dict(self) -> dict[str, Any]:
        """The training epoch's partial aggregates (torchmetrics objects keep their own state in the module)."""
        keep = ("on_step", "on_epoch", "prog_bar", "logger", "sync_dist", "reduce_fx", "total", "count", "dirty")
        return {
            name: {k: getattr(e, k) for k in keep}
            for name, e in self._stores.get("train", {}).items()
            if e.metric is None
        }


class BarebonesLog:
    """What ``self.log`` writes into under ``Trainer(barebones=True)``: nothing (logging costs speed, and barebones
    measures the Trainer without it); the first call warns, as Lightning's does."""

    deferred = None  # nothing a compiled step could defer (see CompiledStepLog)

    def __init__(self) -> None:
        self._warned = False

    def log_deferred(self) -> None:
        """Nothing to log."""

    def log(self, name: str, *args: Any, **kwargs: Any) -> None:
        if not self._warned:
            self._warned = True
            rank_zero_warn(
                f"self.log({name!r}, ...) does nothing under Trainer(barebones=True): logging can cost speed, so "
                "barebones mode turns it off. Drop barebones=True to log. (Shown once.)"
            )

    def state_dict(self) -> dict[str, Any]:
        return {}  # nothing collected


class CompiledStepLog:
    """What ``self.log`` writes into while the steps run compiled (``trainer.fit(torch.compile(model))``).

    Inside a compiled ``training_step`` a call is kept (name, value, arguments) in ``MetricCollector.deferred``:
    dynamo records that list's appends with the graph and makes them after it, so ``self.log`` breaks no graph,
    and the optimization logs the calls right after the step returns, still inside it
    (``MetricCollector.log_deferred``). Elsewhere (evaluation steps, hooks, eager code) the collector is called
    outside dynamo's graphs: logging is Python bookkeeping, which traced would break the graph inside the collector
    anyway and recompile at each new name, hook or stage until dynamo's recompile limit gives up on it."""

    def __init__(self, collector: MetricCollector | BarebonesLog) -> None:
        self._eager = torch.compiler.disable(collector.log)
        self.state_dict = collector.state_dict
        self._deferred: list[tuple[str, Any, tuple[Any, ...]]] | None = None
        if isinstance(collector, MetricCollector):  # barebones: nothing is collected, nor deferred
            self._state: TrainerState = collector._state
            self._deferred = collector.deferred = []

    def log(self, name: str, value: Any, *args: Any) -> None:
        # traced: is_compiling() is True, and the stage a guard (the training step's graphs are built in "train")
        if torch.compiler.is_compiling() and self._deferred is not None and self._state.stage == "train":
            self._deferred.append((name, value, args))
        else:
            self._eager(name, value, *args)


_STORE = {"sanity_check": "validate"}
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


# ---------------------------------------------------------------------- where self.log may be called
#: hooks whose ``self.log`` values would go nowhere (Lightning's ``_FxValidator`` refuses them too): before
#: the first stage starts or after its values were published, in prediction (which publishes nothing), and
#: around checkpoints and exceptions
NO_LOGGING_HOOKS = frozenset(
    {
        "on_fit_start",
        "on_fit_end",
        "on_sanity_check_start",
        "on_sanity_check_end",
        "on_train_end",
        "on_validation_end",
        "on_test_end",
        "on_predict_start",
        "on_predict_end",
        "on_predict_epoch_start",
        "on_predict_epoch_end",
        "on_predict_batch_start",
        "on_predict_batch_end",
        "predict_step",
        "on_save_checkpoint",
        "on_load_checkpoint",
        "on_exception",
    }
)
#: hooks that run once per stage or epoch: they log epoch values only (``on_step=True`` has no step to belong to)
EPOCH_ONLY_HOOKS = frozenset(
    {
        "on_train_start",
        "on_validation_start",
        "on_test_start",
        "on_train_epoch_start",
        "on_train_epoch_end",
        "on_validation_epoch_start",
        "on_validation_epoch_end",
        "on_test_epoch_start",
        "on_test_epoch_end",
    }
)
_SUFFIX = "/dataloader_idx_"


def check_log_call(
    name: str,
    hook: str | None,
    on_step: bool,
    on_epoch: bool,
    add_dataloader_idx: bool,
    loader: int | None,
    entry: _Entry | None,
    stage: str | None,
) -> None:
    """Refuse a ``self.log`` call whose value would be lost or mixed up (Lightning's rules, its ``_FxValidator``
    table included). Called for a name's first value in a stage's epoch, and again when the hook or (with
    ``add_dataloader_idx=False``) the evaluation loader changes."""
    shown = name.rsplit(_SUFFIX, 1)[0] if add_dataloader_idx and loader is not None else name  # as the user wrote it
    if hook is None or hook in NO_LOGGING_HOOKS:
        where = (
            f"inside {hook}"
            if hook is not None
            else "outside the hooks the Trainer runs (e.g. in setup, teardown, configure_model, configure_optimizers, "
            "prepare_data, lr_scheduler_step, a dataloader or batch-transfer hook, or after the run)"
        )
        why = (
            "prediction publishes no logged values"
            if stage == "predict" or (hook or "").startswith(("on_predict", "predict"))
            else "the value would never reach callback_metrics or the loggers"
        )
        raise LogCallError(
            f"self.log({shown!r}, ...) was called {where}, where logging is not supported: {why}. Log from the "
            "training / validation / test steps or their batch and epoch hooks, or write to the logger directly "
            "(self.logger.log_metrics({...}, step=...) or self.logger.experiment)."
        )
    if hook in EPOCH_ONLY_HOOKS and (on_step or not on_epoch):
        raise LogCallError(
            f"self.log({shown!r}, ..., on_step={on_step}, on_epoch={on_epoch}) inside {hook}: this hook runs once, not "
            "per step, so it logs epoch values only. Leave on_step and on_epoch at their defaults there (or pass "
            "on_step=False, on_epoch=True), or log per-step values from training_step or on_train_batch_end."
        )
    if not on_step and not on_epoch:
        raise LogCallError(
            f"`self.log({shown}, ..., on_step=False, on_epoch=False)` in {hook} is not useful: the value would be "
            "published neither per step nor per epoch. Drop one of them (or both, for the hook's defaults)."
        )
    user_suffixes = shown.count(_SUFFIX)
    if user_suffixes:
        raise LogCallError(
            f"You called `self.log` with the key `{shown}`, but the name holds {_SUFFIX!r}, which tandem adds itself when there are several "
            f"evaluation loaders (and splits results by). Log the plain name ({shown.split(_SUFFIX)[0]!r}), or with "
            "add_dataloader_idx=False a name of your own without that part."
        )
    if entry is not None and not add_dataloader_idx and loader is not None and entry.loader not in (None, loader):
        raise LogCallError(
            f"self.log({name!r}, ..., add_dataloader_idx=False) in {hook} for dataloader {loader}, but {name!r} was "
            f"already logged from dataloader {entry.loader} in this {_STAGE_WORDS.get(stage or '', stage)} run: the loaders' "
            "values would be averaged into one number, reported for each. Give each loader its own name (e.g. "
            f'f"{name}_{{dataloader_idx}}"), or drop add_dataloader_idx=False (tandem then names them '
            f"'{name}/dataloader_idx_N')."
        )


def check_metric_attribute(name: str, metric: Any, module: Any) -> None:
    """Refuse a logged torchmetrics Metric that is not a submodule of ``module`` (Lightning's rule): the module
    moves it to the device, saves its state in checkpoints and restores it; a Metric created in the step, or kept
    in a plain list or dict, has none of that."""
    if module is None or not isinstance(module, torch.nn.Module):
        return
    found = {id(m): attribute for attribute, m in module.named_modules() if is_metric(m)}
    if id(metric) in found:
        return
    if not found:
        raise LogCallError(
            "Could not find the `LightningModule` attribute for the `torchmetrics.Metric` logged. You can fix this "
            f"by setting an attribute for the metric in your `LightningModule`: self.log({name!r}, metric) got a "
            "Metric that is not a submodule of the module (created in the step, or kept in a plain list or dict), "
            "which the module neither moves to its device nor saves in checkpoints. Create it in __init__ as an "
            "attribute (self.acc = Accuracy(...)), or in an nn.ModuleList / nn.ModuleDict."
        )
    raise LogCallError(
        "Could not find the `LightningModule` attribute for the `torchmetrics.Metric` logged. You can fix this by "
        f"calling `self.log({name}, ..., metric_attribute=name)` where `name` is one of {list(found.values())}: "
        f"self.log({name!r}, metric) got a Metric that is not one of the module's own. Log the module's Metric "
        "attribute itself, or name it with metric_attribute."
    )


_STAGE_WORDS = {"sanity_check": "sanity-check validation", "validate": "validation"}


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


# ---------------------------------------------------------------------- reduction across processes, by name


def _agree(everyone: Sequence[Mapping[str, tuple[str, bool, Any]]]) -> dict[str, tuple[str, Any]]:
    """The keys some process wants reduced, sorted, with their operation and options; the same on every
    process. One name logged with different ``reduce_fx`` on different processes is an error on all."""
    wanted: dict[str, tuple[str, Any]] = {}
    seen: dict[str, tuple[str, int]] = {}
    for rank, mine in enumerate(everyone):
        for key, (op, want, flags) in mine.items():
            if key in seen and seen[key][0] != op:
                other_op, other_rank = seen[key]
                name = key.split("/", 1)[1]
                raise TandemUserCodeError(
                    f"self.log({name!r}, ..., sync_dist=True) used reduce_fx={other_op!r} on rank {other_rank} "
                    f"and reduce_fx={op!r} on rank {rank}; the ranks cannot combine it. Log it with the same "
                    "reduce_fx on every rank."
                )
            seen.setdefault(key, (op, rank))
            if want and key not in wanted:
                wanted[key] = (op, flags)
    return dict(sorted(wanted.items()))


def as_floats(values: Mapping[str, tuple[torch.Tensor | None, torch.Tensor | None]]) -> dict[str, tuple[Any, Any]]:
    """``values`` (name -> value, weight: 0-dim tensors or None) as float64 Python numbers, in one conversion
    (one device sync when they live on an accelerator)."""
    present = {(name, i): t for name, pair in values.items() for i, t in enumerate(pair) if t is not None}
    # read in float32 when every value is a float of at most 32 bits (exact: a Python float holds each one), which
    # stacks them as they are; float64 for the rest (a float64 sum, an integer count)
    narrow = all(t.dtype in _FLOAT32_EXACT for t in present.values())
    floats = to_float(present, torch.float32 if narrow else torch.float64)
    return {name: (floats.get((name, 0)), floats.get((name, 1))) for name in values}


def combine_by_name(
    wanted: Mapping[str, tuple[str, Any]], everyone: list[dict[str, tuple[Any, Any]]]
) -> dict[str, float | None]:
    """Reduce the ``wanted`` names (name -> operation, options) over what each rank sent (``everyone``, in rank
    order: name -> value, weight as floats), the same way on every rank. ``"mean"``: the sum of the values over the
    sum of the weights (a step value weighs 1); ``"sum"``, ``"max"``, ``"min"``: of the values. A rank that did
    not send a name is absent from it; None for a name no rank had. NaN propagates."""
    out: dict[str, float | None] = {}
    for key, (op, _) in wanted.items():
        if key.startswith("metric/"):
            continue
        sent = [theirs[key] for theirs in everyone if key in theirs and theirs[key][0] is not None]
        values = [value for value, _ in sent]
        if not sent:
            out[key] = None
        elif op == "mean":
            weight = sum(1.0 if w is None else w for _, w in sent)
            out[key] = sum(values) / weight if weight > 0 else None
        elif op == "sum":
            out[key] = sum(values)
        else:
            nan = next((v for v in values if math.isnan(v)), None)
            out[key] = nan if nan is not None else (max if op == "max" else min)(values)
    return out


def _as_local(result: float | None, op: str, value: torch.Tensor | None) -> torch.Tensor | None:
    """A reduced number as a tensor in this rank's dtype (``value``: what it sent, or None; float32 where it sent
    nothing; an integer sum, max or min stays an integer) on its device."""
    if result is None:
        return None
    keep_integer = value is not None and not value.is_floating_point() and op != "mean"
    dtype = value.dtype if value is not None and (value.is_floating_point() or keep_integer) else torch.float32
    return torch.tensor(result, dtype=dtype, device=value.device if value is not None else "cpu")


# ---------------------------------------------------------------------- the same, when every rank sends the same names


def pack(
    mine: Mapping[str, tuple[str, bool, Any]], floats: Mapping[str, tuple[Any, Any]], note: Any = None
) -> tuple[int, dict[str, tuple[str, Any]], torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's side of a reduction by agreement: the layout (a 63-bit hash of the sorted names, options and the
    note's shape: equal on every rank exactly when they pack alike), the names wanted (sorted), the note's flags
    (int64), the sums and the maxima (float64).

    Each ``"mean"`` or ``"sum"`` name takes three sums (value, weight, present: 0 for a rank without the value); each
    ``"max"`` or ``"min"`` name three maxima (the value, negated for ``"min"``, -inf for NaN or none; NaN; present);
    each loss since the last check (``note``'s window, under on_nonfinite="rollback") two sums (the loss where
    finite; 1 where it was). The sums are rank-order free: on two ranks they equal ``combine_by_name``'s bit for
    bit; on more, the backend's order of summing, as Lightning's ``sync_dist`` reduction.
    """
    wanted = _agree([mine])
    finite, stop, empty, window = note if note is not None else (True, False, None, None)
    sums: list[float] = []
    maxes: list[float] = []
    for key, (op, _) in wanted.items():
        if key.startswith("metric/"):
            continue
        value, weight = floats.get(key, (None, None))
        present = value is not None
        if op in ("mean", "sum"):
            sums += [value, 1.0 if weight is None else weight, 1.0] if present else [0.0, 0.0, 0.0]
        elif not present:
            maxes += [-math.inf, 0.0, 0.0]
        elif math.isnan(value):
            maxes += [-math.inf, 1.0, 1.0]
        else:
            maxes += [value if op == "max" else -value, 0.0, 1.0]
    bad_window = False
    for _, loss in window or ():
        clean = loss is not None and math.isfinite(loss)
        bad_window |= loss is not None and not clean
        sums += [loss if clean else 0.0, float(clean)]
    shape = (sorted(mine.items()), note is None, None if window is None else [batch_idx for batch_idx, _ in window])
    layout = int.from_bytes(hashlib.blake2b(repr(shape).encode(), digest_size=8).digest(), "little") >> 1
    # the note's flags, reduced by max: any but the stop sends every rank to the gathering, which names the ranks
    flags = torch.tensor([not finite, bool(stop), empty is not None, bad_window], dtype=torch.int64)
    return layout, wanted, flags, torch.tensor(sums, dtype=torch.float64), torch.tensor(maxes, dtype=torch.float64)


def unpack(
    wanted: Mapping[str, tuple[str, Any]], sums: list[float], maxes: list[float], window: Any = None
) -> tuple[dict[str, float | None], Any]:
    """The reduced numbers of ``pack``'s layout: each wanted name's result (as ``combine_by_name``), and the
    window of the ranks' mean losses (batch index, mean; None where no rank's loss was finite), or None."""
    out: dict[str, float | None] = {}
    i = j = 0
    for key, (op, _) in wanted.items():
        if key.startswith("metric/"):
            continue
        if op in ("mean", "sum"):
            total, weight, present = sums[i : i + 3]
            i += 3
            if op == "sum":
                out[key] = total if present else None
            else:
                out[key] = total / weight if present and weight > 0 else None
        else:
            value, nan, present = maxes[j : j + 3]
            j += 3
            out[key] = None if not present else math.nan if nan else value if op == "max" else -value
    if window is None:
        return out, None
    pairs = sums[i:]
    means = [(batch_idx, s / c if c else None) for (batch_idx, _), s, c in zip(window, pairs[::2], pairs[1::2])]
    return out, means


def _packed_reduction(
    strategy: Strategy, mine: Mapping[str, tuple[str, bool, Any]], floats: Mapping[str, Any], note: Any
) -> tuple[dict[str, tuple[str, Any]], dict[str, float | None], list[Any]] | None:
    """The names wanted, their results and the one note for all ranks, when every rank packed alike and no note
    asks for the gathering (``pack``); None otherwise, on every rank."""
    layout, wanted, flags, sums, maxes = pack(mine, floats, note)
    reduced = strategy.reduce_if_agreed(layout, flags, sums, maxes)
    if reduced is None:
        return None
    not_finite, stop, empty, bad_window = (bool(f) for f in reduced[0].tolist())
    if not_finite or empty or bad_window:  # the gathering names the ranks (the same verdict on every rank)
        return None
    window = note[3] if note is not None else None
    results, means = unpack(wanted, reduced[1].tolist(), reduced[2].tolist(), window)
    return wanted, results, [(True, stop, None, means)]


def _metric_missing(name: str, everyone: list[dict[str, Any]]) -> TandemUserCodeError:
    key = f"metric/{name}"
    having = [r for r, mine in enumerate(everyone) if key in mine]
    lacking = [r for r, mine in enumerate(everyone) if key not in mine]
    return TandemUserCodeError(
        f"The torchmetrics Metric {name!r} was logged on rank(s) {having} but not on rank(s) {lacking} in this "
        "epoch (a rank with no batches, e.g. fewer evaluation samples than processes, or a conditional "
        "self.log). torchmetrics reduces inside compute(), which every rank must call. Log the metric on every "
        "rank, or give every rank data."
    )
