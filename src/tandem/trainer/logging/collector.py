"""``MetricCollector``: what ``self.log`` writes into, one stage at a time, and what it publishes (the step values
at publishing steps, the epoch aggregates at epoch ends, reduced across processes by name where asked)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, SupportsFloat, cast

import torch

from tandem.trainer.hooks import STEP_HOOKS, current_hook
from tandem.trainer.logging.checks import EPOCH_ONLY_HOOKS, check_log_call, check_metric_attribute, reduce_fx_name
from tandem.trainer.logging.entry import _HALF_DTYPES, LOADER_SUFFIX, _Entry, _forked, _loader_of, _published_keys
from tandem.trainer.logging.reduction import (
    _agree,
    _as_local,
    _metric_missing,
    _packed_reduction,
    as_floats,
    combine_by_name,
)
from tandem.trainer.logging.sink import as_logged
from tandem.utilities.exceptions import LogCallError, LogValueError
from tandem.utilities.logged_values import is_metric, replica_logs
from tandem.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from tandem.strategies.strategy import Strategy
    from tandem.trainer.state import TrainerState


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


_STORE = {"sanity_check": "validate"}
