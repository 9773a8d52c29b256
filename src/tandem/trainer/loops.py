"""The fit loop: epochs -> one epoch -> one batch. The optimization of a batch is the
``Optimization`` object's; evaluation is the
``EvaluationLoop``'s.

The loops own their state and receive a ``LoopContext``, never the Trainer: ``FitLoop`` owns the
``LoopState`` (what checkpoints save as ``"loops"``), the training data record and
the optimization object. None knows which strategy runs.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import torch

from tandem.module import is_overridden
from tandem.strategies.precision import Precision
from tandem.strategies.side_channel import placed, preemption_vote
from tandem.strategies.strategy import moves_batches
from tandem.trainer.combined_batches import TrainingBatches
from tandem.trainer.dataloader_iter import DataLoaderIter, training_source, warn_experimental
from tandem.trainer.elastic import continue_from, data_layout, follow_order, order_sampler
from tandem.trainer.evaluation import call_module_hook
from tandem.trainer.nonfinite import loss_is_finite, nonfinite_parameters
from tandem.trainer.optimization import Optimization
from tandem.trainer.profiling import TRAIN_NEXT_BATCH, timed, timed_batches
from tandem.trainer.replicas import ReplicaCheck
from tandem.trainer.rollback import skipping
from tandem.trainer.state import TRAIN, BatchPlan, LoopState, StageData
from tandem.trainer.step_retry import repeating_uncommitted
from tandem.utilities.data import find_sampler, has_len, is_empty_batch
from tandem.utilities.exceptions import PossibleUserWarning, TandemConfigError, empty_batch
from tandem.utilities.preemption import PREEMPTION
from tandem.utilities.rank_zero import rank_zero_info, rank_zero_warn
from tandem.utilities.seed import capture_rng_state, isolate_rng, restore_rng_state
from tandem.utilities.signature import takes_dataloader_iter

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.profilers import Profiler
    from tandem.strategies.strategy import Strategy
    from tandem.trainer.config import TrainerConfig
    from tandem.trainer.evaluation import EvaluationLoop
    from tandem.trainer.hooks import HookDispatcher
    from tandem.trainer.logging import LogSink, MetricCollector
    from tandem.trainer.nonfinite import NonFiniteGuard
    from tandem.trainer.rollback import RollbackGuard, RollbackRecord
    from tandem.trainer.state import TrainerState


@dataclass
class LoopContext:
    """What the loops work with, and all they see of the Trainer."""

    strategy: Strategy
    hooks: HookDispatcher
    metrics: MetricCollector  # what self.log writes into
    config: TrainerConfig
    state: TrainerState  # fn, stage, status, should_stop
    sink: LogSink  # where logged numbers go
    nonfinite: NonFiniteGuard
    profiler: Profiler | None = None  # the run's profiler; None: no profiling (the loops' plain path)

    @property
    def module(self) -> TrainingModule:
        """The user's module the strategy runs (during a run; ``Strategy.module`` declares it an ``nn.Module``)."""
        return cast("TrainingModule", self.strategy.module)


class FitLoop:
    """Sanity check, then epochs until ``max_epochs``, ``max_steps`` or an agreed ``should_stop``.

    Args:
        context: what the loops work with.
        evaluation: the evaluation loop (validation during the fit).
        preempt: writes ``last.ckpt`` and ends the job; called on every rank at the agreed pre-emption stop.
        state: where training is, owned by this loop from now on.
    """

    def __init__(
        self, context: LoopContext, evaluation: EvaluationLoop, preempt: Callable[[], None], state: LoopState
    ) -> None:
        self.context, self.evaluation, self._preempt = context, evaluation, preempt
        self.state = state  # also read by the log sink (the loggers' step)
        self.data = StageData(TRAIN)
        self.optimization = Optimization()  # the fit's (set when a fit starts)
        self.batch_transfer: Any = None  # the batch-transfer hooks of the module or DataModule, when overridden
        self.replicas = ReplicaCheck()  # DDP: the ranks' parameters alike, their data not
        self._load: Callable[[], StageData] | None = None  # builds the fit's training record (set per fit)
        self.validates = False  # the fit has validation (data, validation_step, limit_val_batches != 0)
        self._loaded_at: float = -math.inf  # the epoch the training loader was built in (-inf: not yet this fit)
        self._pending_layout: tuple[dict[str, Any], bool] | None = None  # a checkpoint's, until the loader is built
        # the training loader's iterator made where Lightning makes it (with the loader), and the RNG state before
        # it: the first epoch reads it (see _epoch_batches)
        self._early: tuple[Iterator[Any], dict[str, Any]] | None = None
        self._stop_agreed = False  # every process knows that one asked to stop (several processes)
        self.plan = BatchPlan.FULL  # the fit's batch path (composed when a fit starts, see _compose)
        self._store_ready = False  # the training values' store was emptied for the coming epoch
        self.empty_batch: tuple[int, int, int] | None = None  # (rank, epoch, batch_idx) not yet acted on (ddp)
        self._bad: RollbackRecord | None = None  # on_nonfinite="rollback": a publishing check found a bad batch
        self.clock: ValidationClock | None = None  # a time-based val_check_interval's (set per fit); None: off
        # training_step(self, dataloader_iter): the steps take the batches (decided once per fit); steps_done counts
        # the epoch's steps, batches_done the batches they took
        self.steps_take_batches = False
        self.steps_done = 0

    def __getstate__(self) -> dict[str, Any]:  # ddp_spawn pickles the Trainer, which binds ``preempt`` again
        return {**self.__dict__, "_preempt": None, "_load": None, "plan": BatchPlan.FULL}

    # ------------------------------------------------------------------ the training data
    def attach(self, load: Callable[[], StageData], validates: bool) -> None:
        """A fit's source of training data (``load`` builds its record, asking for the loader) and whether it
        validates; nothing is asked for yet."""
        self._load, self.validates = load, validates
        self.data, self._loaded_at, self._pending_layout = StageData(TRAIN), -math.inf, None
        seconds = self.context.config.val_check_time
        self.clock = None if seconds is None else ValidationClock(seconds)

    def detach(self) -> None:
        """The run is over: no loader source (it holds the module) outlives it. ``validates`` stays the latest fit's
        (``trainer.enable_validation``)."""
        self._load = None

    @property
    def needs_training_data(self) -> bool:
        """The fit's training loader has not been asked for yet."""
        return self._load is not None and self._loaded_at == -math.inf

    def load_training(self) -> None:
        """Ask for the training loader where Lightning does: once the sanity check is over (or earlier, for
        ``estimated_stepping_batches``), and again at the start of every ``reload_dataloaders_every_n_epochs``-th
        epoch after the one it was built in."""
        every, epoch = self.context.config.reload_dataloaders_every_n_epochs, self.state.epoch
        if self._load is None or not (self.needs_training_data or every and epoch - self._loaded_at >= every):
            return
        self.reload_training()

    def forget_training(self) -> None:
        """The training loader is asked for again where the fit next needs it (after a search built its own)."""
        if self._load is not None:
            self.data, self._loaded_at, self._early = StageData(TRAIN), -math.inf, None

    def reload_training(self) -> None:
        """Build the training record again now; a resumed run's order (the checkpoint's) carries over."""
        assert self._load is not None
        self.data, self._loaded_at, loop = self._load(), self.state.epoch, self.state
        self._warn_short_epoch()
        if self.clock is not None:  # Lightning's: training starts (again) with its loader, and so does the time
            self.clock.restart()
        if self._pending_layout is not None:  # restored before the loader existed: the checkpoint's place in it
            (saved, announce), self._pending_layout = self._pending_layout, None
            now = self._data_layout()
            if now is not None:
                continue_from(saved, now, loop, self.data, announce)
            return
        if loop.order is not None:  # a resumed run keeps the checkpoint's order
            follow_order(self.data, loop.order)
        # As Lightning: the loader's iterator is made with the loader, before the validation loader is asked for
        # and on_train_start, so that the base seed a DataLoader draws comes at Lightning's point in the RNG
        # sequence. Only the first epoch reads it (a reload's is dropped, as Lightning's); a resumed run's RNG
        # comes back from the checkpoint later, so it makes its iterator then.
        self._early = None
        if self.data.loaders and not (
            loop.batches_done or loop.resume_rng is not None or loop.resume_start is not None
        ):
            rng = capture_rng_state()
            self._early = (iter(self.data.loaders[0]), rng)

    def _warn_short_epoch(self) -> None:
        """Lightning's warning when the loggers would get no training row in an epoch: fewer batches than
        ``log_every_n_steps`` (not under ``fast_dev_run``, nor for an epoch with no batches, which is said apart)."""
        config = self.context.config
        batches = self.data.num_batches[0] if self.data.num_batches else 0
        if self.context.sink.loggers and 0 < batches < config.log_every_n_steps and not config.fast_dev_run:
            rank_zero_warn(
                f"The number of training batches ({batches}) is smaller than the logging interval"
                f" Trainer(log_every_n_steps={config.log_every_n_steps}). Set a lower value for log_every_n_steps if"
                " you want to see logs for the training epoch.",
                category=PossibleUserWarning,
            )

    def bind_preemption_stop(self, preempt: Callable[[], None]) -> None:
        """What to call at the agreed pre-emption stop (the Trainer's save and exit)."""
        self._preempt = preempt

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """Where training is (``checkpoint["loops"]``), with the data layout that place is counted in. Saved at an
        epoch's end before its schedulers stepped (a checkpoint in ``on_train_epoch_end``), it also records that step
        and the values of the plateau schedulers' monitors, for the resume to take it."""
        state = self.state.state_dict()
        layout = self._data_layout()
        if layout is not None:
            state["data"] = layout
        if self.state.schedulers_pending:
            state["epoch_schedulers"] = self.optimization.monitored_values()
        if self.steps_take_batches:  # the epoch's steps, where they differ from its batches
            state["steps_done"] = self.steps_done
        return state

    def _data_layout(self) -> dict[str, Any] | None:
        accumulate = self.context.config.accumulate_grad_batches
        return data_layout(self.data, self.context.strategy.world_size, accumulate)

    def load_state_dict(
        self,
        state: dict[str, Any],
        train_metrics: dict[str, Any] | None = None,
        rng: dict[str, Any] | None = None,
        announce: bool = True,
    ) -> None:
        """Continue from ``state``; a mid-epoch one also gets back the epoch's partial metric sums and, where
        the loop reaches the point they belong to, the RNG states. ``announce=False``: a search's trial coming back
        to where it started, not a resume (no lines about another data layout)."""
        loop = self.state
        loop.load_state_dict(state)
        loop.resume_train_metrics = train_metrics if loop.batches_done else None
        loop.resume_rng = rng
        loop.resume_schedulers = state.get("epoch_schedulers")
        self.steps_done = state.get("steps_done", loop.batches_done)
        now = self._data_layout()
        if "data" in state and now is not None:  # another device count or batch size: the same place
            continue_from(state["data"], now, loop, self.data, announce)
        elif "data" in state and self._load is not None:  # the loader is asked for later: its place then
            self._pending_layout = (state["data"], announce)

    @property
    def validates_only_at_epoch_ends(self) -> bool:
        """Validation runs once at the end of every epoch and nowhere else, or there is none, so epoch-end work
        (a checkpoint, an early-stopping check) can run at the training epoch's end (Lightning's rule)."""
        config = self.context.config
        interval = config.val_check_interval
        if config.val_check_time is not None or not isinstance(interval, (int, float)):  # a time-based interval
            return False  # validates whenever its time comes
        return validates_only_at_epoch_ends(
            config.check_val_every_n_epoch, interval, self.evaluation.records["validate"].total_batches
        )

    # ------------------------------------------------------------------ the fit
    def run(self, announce: bool = True) -> None:
        """The fit from where ``state`` is; ``announce``: say why it stopped (a search's trials do not)."""
        state, loop = self.context.state, self.state  # where the fit is, for a hang's report (read once a second)
        with placed(lambda: (state.stage, loop.epoch, loop.batches_done, loop.global_step)):
            self._run(announce)

    def _run(self, announce: bool) -> None:
        context = self.context
        self._stop_agreed = False
        if self._done():  # before any work: a finished Trainer fit again, or max_epochs / max_steps of 0
            if self._limit_reached():  # else should_stop was set (a Timer out of time): who set it says why
                _warn_nothing_to_train(self.state, context.config)
            return
        profiler = context.profiler
        self.plan = self._compose()
        self.optimization.follow_plan(self.plan)
        self.steps_take_batches = self._steps_take_batches()
        loop = self.state
        if self.validates and context.config.num_sanity_val_steps != 0:
            with isolate_rng():  # as Lightning: the check draws no training randomness (a loader's iter seeds)
                ran = self.evaluation.run(
                    "validate", sanity=True, epoch=loop.epoch, counts=self._validates_this_epoch()
                )
            if ran and self.clock is not None:
                self.clock.restart()
        self.load_training()  # Lightning's order: after the sanity check, before on_train_start
        if self._validates_this_epoch():  # the validation loaders too, where no sanity check asked for them
            self.evaluation.load("validate", epoch=loop.epoch)
        if loop.resume_schedulers is not None:  # the checkpoint's epoch ended before its schedulers stepped
            self.optimization.step_schedulers("epoch", plateau=True, count=loop.epoch, values=loop.resume_schedulers)
            loop.resume_schedulers = None
        context.metrics.reset(loop.resume_train_metrics)  # before on_train_start: its values belong to the first epoch
        loop.resume_train_metrics = None
        self._store_ready, self.empty_batch, self._bad = True, None, None
        _warn_if_modules_in_eval_mode(context.strategy.module)
        context.hooks.call("on_train_start")
        context.strategy.follow_module()  # a head added, or layers frozen or unfrozen, since the wrapper was built
        while not self._done():
            if profiler is None:
                self._run_epoch()
            else:
                with profiler.profile("run_training_epoch"):
                    self._run_epoch()
            if PREEMPTION.signum is not None and not self._done():
                self._stop_if_preempted(epoch_end=True)
        context.hooks.call("on_train_end")
        if announce:
            rank_zero_info(f"`Trainer.fit` stopped: {self._stop_reason()}")

    def _stop_reason(self) -> str:
        """Why ``_done`` ended the fit, in Lightning's words and order."""
        config, loop = self.context.config, self.state
        if 0 <= config.max_steps <= loop.global_step:
            return f"`max_steps={config.max_steps}` reached."
        if loop.epoch >= config.epoch_limit:
            return f"`max_epochs={config.max_epochs}` reached."
        return "`trainer.should_stop` was set (by a callback such as EarlyStopping or Timer, or by the module)."

    def _done(self) -> bool:
        context = self.context
        return (context.state.should_stop and self._min_reached()) or self._limit_reached()

    def _limit_reached(self) -> bool:
        """``max_epochs`` or ``max_steps`` is reached."""
        loop, config = self.state, self.context.config
        return loop.epoch >= config.epoch_limit or 0 <= config.max_steps <= loop.global_step

    def _min_reached(self) -> bool:
        """``min_epochs`` / ``min_steps`` are met, so ``should_stop`` may end the fit."""
        config, loop = self.context.config, self.state
        return loop.epoch >= (config.min_epochs or 0) and loop.global_step >= (config.min_steps or 0)

    def _validates_this_epoch(self) -> bool:
        every = self.context.config.check_val_every_n_epoch
        return self.validates and (every is None or (self.state.epoch + 1) % every == 0)

    def _stop_if_preempted(self, epoch_end: bool = False) -> None:
        """After a pre-emption signal: stop here if every rank stops here. Within an epoch, only between
        optimizer steps (gradients accumulated over micro-batches are not in a checkpoint)."""
        loop = self.state
        if not epoch_end and self.optimization.has_gradients:
            return
        here = (loop.epoch, loop.batches_done)
        if here >= preemption_vote().target(here):
            self._preempt()

    def _steps_take_batches(self) -> bool:
        """Whether the module's ``training_step`` takes a ``dataloader_iter`` (see
        ``tandem.trainer.dataloader_iter``); then ``self.log`` in training needs ``batch_size`` (Lightning's
        rule: the Trainer does not see the batches), and rolling back past a bad batch is refused."""
        context = self.context
        takes = takes_dataloader_iter(context.module.training_step)
        context.metrics.batch_size_required = takes
        if not takes:
            return False
        if context.nonfinite.rollback is not None:
            raise TandemConfigError(
                "Trainer(on_nonfinite='rollback') cannot replay the batches of a training_step(self, dataloader_iter): "
                "the step takes its batches itself. Use on_nonfinite='raise' or 'warn', or take the batch as "
                "training_step(self, batch, batch_idx)."
            )
        warn_experimental("training_step")
        return True

    #: compose every fit's plan with every stage on (the equivalence test's reference path; see BatchPlan)
    compose_all = False

    def _compose(self) -> BatchPlan:
        """This fit's batch path: the stages that are on for its module, callbacks, strategy and precision."""
        context, every = self.context, self.compose_all
        strategy, on = context.strategy, context.hooks.registered
        transfer: Callable[[Any], Any] | None = None
        if self.batch_transfer is not None:  # the module's or DataModule's transfer hooks
            transfer = partial(self.batch_transfer, dataloader_idx=0)
        elif every or moves_batches(strategy):  # on the CPU at full precision a batch stays as the loader made it
            transfer = strategy.batch_to_device
        # DDP follows changes of the trainable set at step boundaries; the others have nothing to follow
        follow = strategy.follow_module if every or strategy.follows_module else None
        optimize: Callable[[Any, int], tuple[Any, Any]] = self.optimization.run
        module = context.module  # its backward hook where it overrides it (Lightning's), in every backward of the fit
        strategy.precision.module_backward = module.backward if is_overridden(module, "backward") else None
        if context.profiler is not None:
            optimize = timed(optimize, context.profiler, "run_training_batch")
        if context.nonfinite.rollback is not None:  # each batch's loss recorded on its device (only then)
            optimize = context.nonfinite.rollback.recording(optimize)
        if strategy.replica_groups is not None:  # ddp_ft: a step the replica groups did not commit runs again
            optimize = repeating_uncommitted(optimize, context, transfer)
        return BatchPlan(
            optimize=optimize,
            transfer=transfer,
            follow=follow,
            batch_start=every or "on_train_batch_start" in on,
            batch_end=every or "on_train_batch_end" in on,
            before_backward=every or "on_before_backward" in on,
            after_backward=every or "on_after_backward" in on,
            before_optimizer_step=every or "on_before_optimizer_step" in on,
            before_zero_grad=every or "on_before_zero_grad" in on,
            unscale=every or _unscales(strategy.precision),
            deferred_logs=every or getattr(context.metrics, "deferred", None) is not None,
        )

    # ------------------------------------------------------------------ one epoch
    def _run_epoch(self) -> None:
        context, loop = self.context, self.state
        strategy, metrics, hooks, config = context.strategy, context.metrics, context.hooks, context.config
        module = strategy.module
        if not loop.batches_done:  # reload_dataloaders_every_n_epochs: train_dataloader() again (Lightning's rule)
            self.load_training()
        if not self._store_ready:  # each epoch starts empty; the first one in run(), before on_train_start
            metrics.reset()
        self._store_ready = False
        loader = self.data.loaders[0]
        sampler = find_sampler(loader) if isinstance(loader, torch.utils.data.DataLoader) else None
        if sampler is not None and hasattr(sampler, "set_epoch"):
            sampler.set_epoch(loop.epoch)
        elif isinstance(loader, TrainingBatches):  # several loaders: each its own sampler
            loader.set_epoch(loop.epoch)
        if loop.resume_rng is not None and loop.batches_done == 0:  # resumed at an epoch boundary
            restore_rng_state(loop.resume_rng)
            loop.resume_rng = None
        hooks.call("on_train_epoch_start")
        strategy.follow_module()  # BaseFinetuning unfreezes here
        n = loop.epoch_batches = self.data.num_batches[0]
        batches = self._read_batches(self._epoch_batches(), loader)
        several = strategy.world_size > 1  # only then is there a collective per step
        val_every = self._val_check_batches()
        # check_val_every_n_epoch=None: val_check_interval counts the batches of the whole fit (Lightning's rule)
        offset = loop.batches_in_earlier_epochs if config.check_val_every_n_epoch is None else 0
        max_steps = config.max_steps
        plateau_per_step = self.optimization.has_schedulers("step", plateau=True)
        batches = self.replicas.watch_first_batch(strategy, sampler, batches)
        if n != math.inf:  # as Lightning: the batch past a limit_train_batches count is never read
            batches = itertools.islice(batches, max(0, int(n) - loop.batches_done))
        first_batch, first_step = loop.batches_done, loop.global_step
        rollback = context.nonfinite.rollback
        if rollback is not None:  # a rollback goes back at most to here
            rollback.take(strategy, self.optimization, loop, metrics)
        clock, validated = self.clock, -1  # validated: the batches done when the epoch last validated
        if self.steps_take_batches:  # training_step(self, dataloader_iter): the steps take the batches
            validated, plateau_after_epoch_validation, ended = self._run_iter_steps(batches, offset, val_every)
            indexed: Iterator[tuple[int, Any]] | None = None
        else:
            indexed, plateau_after_epoch_validation, ended = enumerate(batches, start=loop.batches_done), 0, False
        # plateau_after_epoch_validation: the epoch's last batch; its plateau schedulers step after that validation
        while indexed is not None:
            for batch_idx, batch in indexed:
                if batch_idx >= n:
                    break
                if not self._run_batch(batch, batch_idx):
                    break
                # not after the epoch's last batch (known there in an evened epoch too): the epoch-end validation
                due = val_every and (offset + batch_idx + 1) % val_every == 0 and batch_idx + 1 < loop.epoch_batches
                if due and self._validates_this_epoch() and (clock is None or self._time_to_validate(clock)):
                    self._validate()
                    validated = batch_idx + 1
                if plateau_per_step and loop.stepping:  # after the batch's validation, whether it ran or not
                    if batch_idx + 1 == loop.epoch_batches:
                        plateau_after_epoch_validation = batch_idx + 1
                    else:
                        self.optimization.step_schedulers("step", plateau=True, count=batch_idx + 1)
                if PREEMPTION.signum is not None:  # a signal: one read per batch
                    if plateau_after_epoch_validation:  # the checkpoint of the stop records the step
                        self.optimization.step_schedulers("step", plateau=True, count=plateau_after_epoch_validation)
                        plateau_after_epoch_validation = 0
                    self._stop_if_preempted()
                stop = context.state.should_stop and (not several or self._stop_agreed)
                if 0 <= max_steps <= loop.global_step or stop and self._min_reached():
                    break  # several processes: should_stop is agreed at publishing steps and the epoch's end (below)
            indexed = None if rollback is None else self._replay_after_bad_batch(rollback, loader)
        loop.epoch_finished = True
        self.optimization.check_epoch_steps(loop.epoch, loop.batches_done - first_batch, loop.global_step - first_step)
        # Lightning's rule: the epoch's last batch validates when it is a val_check_interval batch (every batch count
        # of a float interval's epoch is), when the epoch's length is unknown, or when the fit stops there
        # (once a batch: not again after a batch that validated and stopped the epoch, max_steps or a stop)
        stopping = context.state.should_stop and (not several or self._stop_agreed) and self._min_reached()
        if self.steps_take_batches:  # counted in steps; the end of the data validates (Lightning's)
            due = ended or stopping or bool(val_every) and (offset + self.steps_done) % val_every == 0
            due = due and validated != self.steps_done and self._validates_this_epoch()
        else:
            due = not val_every or (offset + loop.batches_done) % val_every == 0 or stopping
            due = due and validated != loop.batches_done and self._validates_this_epoch()
        if due and (clock is None or stopping or clock.due()):
            self._validate()
        if plateau_after_epoch_validation:
            self.optimization.step_schedulers("step", plateau=True, count=plateau_after_epoch_validation)
        # Lightning's order: the epoch's values after its validation, the hooks, then the plateau schedulers (the
        # others stepped at the last batch); the values' torchmetrics objects are reset once logged (a callback may
        # read them in the hooks). Under manual optimization the module steps its schedulers.
        loop.schedulers_pending = True  # a checkpoint saved before they step records it
        train_epoch_metrics = metrics.epoch_metrics()
        hooks.call("on_train_epoch_end")
        train_epoch_metrics.update(metrics.epoch_metrics())  # values logged in on_train_epoch_end hooks
        if loop.batches_done == loop.epoch_batches:  # not an epoch cut short (max_steps, a stop): Lightning's rule
            self.optimization.step_schedulers("epoch", plateau=True, count=loop.epoch + 1)
        loop.schedulers_pending = False
        # One reduction, two agreements: one rank asking to stop stops them all (a rank that left the loop alone
        # would hang the others), and NaN / inf in any rank's parameters is acted on by every rank.
        nonfinite = nonfinite_parameters(module)
        flags = torch.tensor([int(context.state.should_stop), int(bool(nonfinite)), int(self.empty_batch is not None)])
        stop, anywhere, empty = strategy.reduce(flags, "sum")
        if empty > 0:  # an empty batch on some rank since the last publishing step: all ranks learn which, and raise
            raise empty_batch([note for note in strategy.all_gather_object(self.empty_batch) if note], several=True)
        context.state.should_stop = bool(stop > 0)
        context.nonfinite.check_epoch_end(nonfinite, bool(anywhere > 0), loop.epoch, loop.global_step)
        self.replicas.check_epoch_end(strategy, loop.epoch, config.on_replica_divergence)
        # the epoch's values, after its validation's, at the step of the epoch's last batch (Lightning's)
        loop.logger_step = max(loop.batches_stepped - 1, 0)
        context.sink.log_metrics(train_epoch_metrics)  # nothing logged for the epoch: no row (not an epoch-only one)
        loop.logger_step = loop.batches_stepped
        metrics.reset_metric_objects()
        context.sink.save()
        loop.finish_epoch()

    def _validate(self) -> None:
        """Validation within the fit. After an optimizer step (not inside an accumulation window) the module's
        ``on_validation_model_zero_grad`` releases the gradients first (Lightning's)."""
        if self.state.stepping:
            call_module_hook(self.context.module, "on_validation_model_zero_grad")
        ran = self.evaluation.run("validate", epoch=self.state.epoch)
        if ran and self.clock is not None:
            self.clock.restart()

    def _time_to_validate(self, clock: ValidationClock) -> bool:
        """A time-based interval's check after a training batch (Lightning's order): a stop that may end the fit
        validates first, else the time since the last validation decides."""
        return self.context.state.should_stop and self._min_reached() or clock.due()

    def _run_iter_steps(self, batches: Iterator[Any], offset: int, val_every: int) -> tuple[int, int, bool]:
        """The epoch of a ``training_step(self, dataloader_iter)``: steps while the epoch's batches last. The loop
        state's ``batches_done`` counts the batches the steps took (where a resume continues), ``steps_done``
        the steps (what ``val_check_interval`` and the accumulation windows count, as Lightning's). Returns the
        steps done when the epoch last validated (-1: not), the steps whose plateau schedulers wait for the
        epoch-end validation (0: none), and whether the epoch's data ended (not a stop or ``max_steps``)."""
        context, loop = self.context, self.state
        start = loop.batches_done
        taken = DataLoaderIter(training_source(batches, start), self.data.num_batches[0] - start)
        if not start:
            self.steps_done = 0
        # which step is the epoch's last is known only once its batches are taken
        loop.epoch_batches = loop.batches_done if taken.done else math.inf
        several, max_steps = context.strategy.world_size > 1, context.config.max_steps
        plateau_per_step = self.optimization.has_schedulers("step", plateau=True)
        clock, validated, plateau_after_epoch_validation, ended = self.clock, -1, 0, taken.done
        while not taken.done:
            ran = self._run_iter_step(taken, start)
            ended = taken.done or ran is None
            if ended:
                loop.epoch_batches = loop.batches_done
            if not ran:
                break
            steps = self.steps_done
            due = val_every and (offset + steps) % val_every == 0 and not ended
            if due and self._validates_this_epoch() and (clock is None or self._time_to_validate(clock)):
                self._validate()
                validated = steps
            if plateau_per_step and loop.stepping:
                if ended:
                    plateau_after_epoch_validation = steps
                else:
                    self.optimization.step_schedulers("step", plateau=True, count=steps)
            if PREEMPTION.signum is not None:
                if plateau_after_epoch_validation:
                    self.optimization.step_schedulers("step", plateau=True, count=plateau_after_epoch_validation)
                    plateau_after_epoch_validation = 0
                self._stop_if_preempted()
            stop = context.state.should_stop and (not several or self._stop_agreed)
            if 0 <= max_steps <= loop.global_step or stop and self._min_reached():
                break
        return validated, plateau_after_epoch_validation, ended

    def _run_iter_step(self, taken: DataLoaderIter, start: int) -> bool | None:
        """One step of a ``training_step(self, dataloader_iter)``: ``_run_batch``'s order, the batch hooks
        getting the last batch taken (before the step: the previous step's last, None at first) and its index.
        False: ``on_train_batch_start`` returned -1 (the epoch ends); None: ``StopIteration`` came out of the step
        (the epoch ends there, as Lightning's)."""
        context, loop, optimization, plan = self.context, self.state, self.optimization, self.plan
        hooks, config = context.hooks, context.config
        context.metrics.set_batch(None)  # self.log in training needs batch_size here
        loop.logger_step = loop.batches_stepped
        loop.plan_batch(
            self.steps_done, config.accumulate_grad_batches, config.log_every_n_steps, optimization.automatic
        )
        if plan.batch_start and _ends_epoch(hooks.call("on_train_batch_start", taken.batch, taken.batch_idx)):
            loop.no_step()
            return False
        if plan.follow is not None:
            plan.follow(only_if_created=not plan.batch_start)
        try:
            output, loss = plan.optimize(taken, taken.batch_idx)
        except StopIteration:  # the step ended the epoch: its epoch schedulers step all the same
            loop.no_step()
            loop.batches_done = start + taken.fetched
            optimization.step_schedulers("epoch", plateau=False, count=loop.epoch + 1)
            return None
        self.steps_done += 1
        if taken.done:  # the epoch's batches are taken: its epoch schedulers step
            optimization.step_schedulers("epoch", plateau=False, count=loop.epoch + 1)
        if loop.log_step:
            self._publish_step(loss)  # no rollback here: True
        loop.batches_done = start + taken.fetched
        if plan.batch_end:
            hooks.call("on_train_batch_end", optimization.hook_outputs(output, loss), taken.batch, taken.batch_idx)
        if loop.log_step:
            context.sink.log_metrics(context.metrics.step_values())
        return True

    # ------------------------------------------------------------------ one batch
    def _run_batch(self, batch: Any, batch_idx: int) -> bool:
        """The batch runner: the batch on its device, the plan, the batch hooks and publishing around the
        optimization's ``run``. False: the module's
        ``on_train_batch_start`` returned -1, which skips the rest of the epoch (every rank must return it)."""
        context, loop, optimization, plan = self.context, self.state, self.optimization, self.plan
        hooks, config = context.hooks, context.config
        if plan.transfer is not None:
            batch = plan.transfer(batch)
        context.metrics.set_batch(batch)
        loop.logger_step = loop.batches_stepped
        empty = is_empty_batch(batch)  # host-side shapes: no device sync
        loop.plan_batch(batch_idx, config.accumulate_grad_batches, config.log_every_n_steps, optimization.automatic)
        # the module's on_train_batch_start returning -1 ends the epoch here (Lightning's)
        if plan.batch_start and _ends_epoch(hooks.call("on_train_batch_start", batch, batch_idx)):
            loop.no_step()
            return False
        if plan.follow is not None:  # one flag read, unless a batch hook someone wrote may have changed the module
            plan.follow(only_if_created=not plan.batch_start)
        steps = loop.global_step
        output, loss = plan.optimize(batch, batch_idx)
        batch = context.metrics.batch  # as loaded again when the step ran again (ddp_ft, see step_retry); else as is
        if batch_idx + 1 == loop.epoch_batches:  # the epoch's last batch steps its epoch schedulers (Lightning's)
            optimization.step_schedulers("epoch", plateau=False, count=loop.epoch + 1)
        # trained on: training_step did not skip it (a step it took by hand counts; the step Lightning takes after a
        # returned None does not)
        if empty and (loss is not None or steps != loop.global_step != optimization.step_without_loss):
            self._found_empty_batch(batch_idx)
        # every logging step publishes, with loggers or without (as Lightning: logged_metrics fills either way): the
        # sync_dist values are reduced and the loss is read (under on_nonfinite="rollback", every loss since the last
        # check) before on_train_batch_end, which sees them; the loggers get the row after it, as in Lightning, so
        # what the batch-end hooks log is in it
        rollback = context.nonfinite.rollback if loop.log_step else None
        if loop.log_step and not self._publish_step(loss):
            return False  # a bad batch since the last check: the epoch loop rolls back and replays
        loop.batches_done = batch_idx + 1
        if plan.batch_end:
            hooks.call("on_train_batch_end", optimization.hook_outputs(output, loss), batch, batch_idx)
        if loop.log_step:
            context.sink.log_metrics(context.metrics.step_values())
        if rollback is not None and rollback.snapshot_due():  # a clean check, the one to copy the state at
            rollback.take(context.strategy, optimization, loop, context.metrics)
        return True

    def _publish_step(self, loss: torch.Tensor | None) -> bool:
        """The step values' sync_dist reduction (the loggers get them after on_train_batch_end). The step's loss is
        read then too (under on_nonfinite="rollback", every loss since the last check), and the processes' verdicts
        on it travel with that reduction. False: a bad batch was found, to roll back past (nothing is logged)."""
        context, rollback = self.context, self.context.nonfinite.rollback
        window = None if rollback is None else rollback.read()
        finite = loss_is_finite(loss) if window is None else True
        published = context.metrics.publish_step(finite, context.state.should_stop, self.empty_batch, window)
        if self.empty_batch is not None or any(published.empty_batches):  # named before its NaN loss is
            raise empty_batch([note for note in published.empty_batches if note], several=True)
        if published.stop_asked:  # every rank learnt it in the same reduction: all stop at this step (max_time)
            context.state.should_stop = self._stop_agreed = True
        if rollback is not None:
            self._bad = rollback.decide(published.windows, self.state.global_step, self.state.epoch)
            if self._bad is not None:
                return False
        step = self.state.global_step
        context.nonfinite.check_loss(published.loss_finite, context.metrics.unwritten_step_values, step)
        return True

    def _replay_after_bad_batch(self, rollback: RollbackGuard, loader: Any) -> Iterator[tuple[int, Any]] | None:
        """on_nonfinite="rollback", where the epoch's batches stopped: the losses not checked yet are checked (one
        gathering); after a bad batch, here or at a publishing step, every rank rolls back to the snapshot and gets
        the batches to replay (without the bad ones). None: all clean, the epoch goes on to its end."""
        context, loop = self.context, self.state
        strategy = context.strategy
        bad, self._bad = self._bad, None
        if bad is None and rollback.unchecked:  # alike on every rank: each recorded every batch
            bad = rollback.decide(strategy.all_gather_object(rollback.read()), loop.global_step, loop.epoch)
        if bad is None:
            return None
        found_at = loop.logger_step  # the loggers' step of the batch that found it
        record, skipped = rollback.roll_back(bad, strategy, self.optimization, loop, context.metrics)
        context.sink.log_metrics({**record.metrics(), "epoch": record.epoch}, found_at)
        rank_zero_warn(f"on_nonfinite='rollback': rolled back: {record}.")
        return skipping(self._read_batches(self._epoch_batches(replay=True), loader), loop.batches_done, skipped)

    def _read_batches(self, batches: Iterator[Any], loader: Any) -> Iterator[Any]:
        """The epoch's batches as the loop reads them: timed when profiling, and, for a loader of unknown length
        whose steps are collectives or accumulate, or whose epoch has no limit, agreed batch by batch, and read one
        batch ahead where the epoch's length is unknown (``_agreed_batches``). That is Lightning's order: it
        reads batch ``i + 1`` before ``training_step`` runs on batch ``i`` when the length is unknown, and never
        reads ahead when it is known (a sized loader, or a ``limit_train_batches`` count), so a dataset whose items
        depend on the training state (episodes played with the current policy) yields the same sequence."""
        context = self.context
        if context.profiler is not None:
            batches = timed_batches(batches, context.profiler, TRAIN_NEXT_BATCH)
        several = context.strategy.world_size > 1  # only then is there a collective per step
        limit = self.data.num_batches[0]
        if (several or context.config.accumulate_grad_batches > 1 or limit == math.inf) and not has_len(loader):
            batches = self._agreed_batches(batches, limit)
        return batches

    def _found_empty_batch(self, batch_idx: int) -> None:
        """Training batch ``batch_idx`` held no samples and was trained on. With one process that is an error now;
        with several, every rank must stop together: the finding travels with the next publishing step's reduction,
        or the epoch end's reduction, and all ranks raise there (no collective of its own)."""
        strategy, loop = self.context.strategy, self.state
        if strategy.world_size == 1:
            raise empty_batch([(0, loop.epoch, batch_idx)], several=False)
        if self.empty_batch is None:
            self.empty_batch = (strategy.global_rank, loop.epoch, batch_idx)

    # ------------------------------------------------------------------ the epoch's batches
    def _epoch_batches(self, replay: bool = False) -> Iterator[Any]:
        """The epoch's batches. A mid-epoch resume replays the order from the epoch's recorded RNG state and
        skips the done batches' indices without loading them; so does a ``replay`` after a rollback (then from
        any point of the epoch, its start included)."""
        loop, loader = self.state, self.data.loaders[0]
        skip = loop.batches_done
        if loop.resume_start is not None and not replay:  # an elastic resume begins inside one of this run's batches
            sampler = order_sampler(self.data)
            assert sampler is not None  # elastic.continue_from starts inside a batch only through a global-order one
            sampler.start, loop.resume_start, skip = loop.resume_start, None, 0
            replay = True  # the epoch's RNG replayed all the same
        early, self._early = self._early, None
        if not skip and not replay:
            if early is not None and loop.epoch == 0:  # made with the loader (Lightning's first epoch)
                iterator, loop.epoch_start_rng = early
                loop.epoch_order_rng = capture_rng_state()  # where the epoch's order is drawn, for a replay
                return iterator
            loop.epoch_start_rng, loop.epoch_order_rng = capture_rng_state(), None
            return iter(loader)
        skippable = self.data.skippable
        if skippable is None:
            if replay:  # read again from the start: the same sequence if the dataset yields it again
                if loop.epoch_start_rng is not None:
                    restore_rng_state(loop.epoch_start_rng)
            else:
                rank_zero_warn(
                    f"Resuming in the middle of an epoch from a dataloader that cannot skip ahead (an iterable "
                    f"dataset or a custom loader): tandem reads and discards its first {skip} batches to continue "
                    "where the checkpoint stopped. The order matches only if the dataset yields the same sequence "
                    "each time."
                )
            iterator = iter(loader)
            if loop.epoch_order_rng is not None:
                restore_rng_state(loop.epoch_order_rng)
            for _ in range(skip):
                next(iterator, None)
        else:
            if loop.epoch_start_rng is not None:
                restore_rng_state(loop.epoch_start_rng)
            skippable.skip = skip
            iterator = iter(loader)
            if loop.epoch_order_rng is not None:  # the iterator was made earlier than the order was drawn
                restore_rng_state(loop.epoch_order_rng)
            skippable.start()  # draw the epoch's order now, before the checkpoint's RNG state returns
        if loop.resume_rng is not None:
            restore_rng_state(loop.resume_rng)
            loop.resume_rng = None
        return iterator

    def _agreed_batches(self, batches: Iterator[Any], limit: int | float) -> Iterator[Any]:
        """An epoch from a loader of unknown length, read a batch ahead so that the loop knows its last batch (an
        accumulation window cut short steps there, as in Lightning); with a ``limit`` count the last batch is known,
        and each batch is read as its step comes (Lightning's order). When the steps are collectives (several processes), the
        ranks agree on each batch that every one of them has it (one small all-reduce; one process asks nobody),
        so every rank ends the epoch at the same batch, at the same ``global_step``. A rank's batches beyond the
        first one another rank lacks are not trained on."""
        loop, strategy = self.state, self.context.strategy

        def agreed(index: int) -> Any:
            """Batch ``index`` of the epoch if every rank has one, else ``_END`` (on every rank)."""
            if index >= limit:  # the same limit on every rank: no need to ask
                return _END
            batch = next(batches, _END)
            have = strategy.ranks_with_batch(batch is not _END)
            if all(have):
                return batch
            if any(have) and not loop.uneven_warned:
                loop.uneven_warned = True
                _warn_uneven(loop.epoch, index, have)
            return _END

        index = loop.batches_done
        if limit != math.inf:  # a known length (a limit_train_batches count): each batch read as its step comes, as
            while (batch := agreed(index)) is not _END:  # Lightning reads them then; the last one is known already
                yield batch
                index += 1
            return
        batch = agreed(index)
        while batch is not _END:
            following = agreed(index + 1)
            if following is _END:
                loop.epoch_batches = index + 1  # the last batch of the epoch, on every rank
            yield batch
            batch, index = following, index + 1

    def _val_check_batches(self) -> int:
        interval, n = self.context.config.val_check_interval, self.data.num_batches[0]
        if self.clock is not None or not isinstance(interval, (int, float)):  # time-based: every batch asks the clock
            return 1
        if isinstance(interval, int):
            return interval
        if n == math.inf:
            return 0  # an unsized epoch is validated at its end
        return max(1, int(n * interval))


_END = object()


class ValidationClock:
    """A time-based ``val_check_interval`` (Lightning's): validation is due after a training batch once ``seconds``
    have passed since the last validation ended, or since training started. One clock read per check."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.last = seconds, 0.0

    def restart(self) -> None:
        self.last = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.seconds


def _unscales(precision: Precision) -> bool:
    """Whether ``precision.unscale_gradients`` does anything: a float16 scaler, or an override of the method."""
    return precision.scaler is not None or type(precision).unscale_gradients is not Precision.unscale_gradients


def _ends_epoch(returned: Any) -> bool:
    """``on_train_batch_start`` returned -1 (an int: a tensor is not compared)."""
    return type(returned) is int and returned == -1


def validates_only_at_epoch_ends(
    check_val_every_n_epoch: int | None, val_check_interval: int | float, val_batches: int | float
) -> bool:
    """See ``FitLoop.validates_only_at_epoch_ends`` (Lightning's ``ModelCheckpoint`` rule)."""
    if check_val_every_n_epoch != 1:
        return False
    return val_batches == 0 or val_check_interval == 1.0


def _warn_nothing_to_train(loop: LoopState, config: TrainerConfig) -> None:
    """``fit`` found training already over before its first batch: say why, and how to train (more)."""
    limits = [f"max_epochs={config.max_epochs}"] if config.max_epochs != -1 else []
    limits += [f"max_steps={config.max_steps}"] if config.max_steps != -1 else []
    if loop.epoch == 0 and loop.global_step == 0:
        rank_zero_warn(
            f"`Trainer.fit` trained nothing: {', '.join(limits)} leaves nothing to train. Set max_epochs (or max_steps) "
            "to at least 1; to only evaluate, call trainer.validate(model, ...) instead."
        )
        return
    rank_zero_warn(
        f"`Trainer.fit` trained nothing: training is already at epoch {loop.epoch}, global step {loop.global_step}, "
        f"so {', '.join(limits)} is reached already (this Trainer finished a fit before, or the checkpoint "
        "resumed from was saved there). To train again from the start, use a new Trainer; to train further, use a "
        "Trainer with a higher max_epochs (or max_steps) and pass ckpt_path=<the last checkpoint> to fit."
    )


def _warn_if_modules_in_eval_mode(module: torch.nn.Module) -> None:
    """Lightning's warning as training starts: the fit keeps each submodule's mode (it never calls ``train()``), so a
    module left in eval mode trains in it."""
    names = [name or type(module).__name__ for name, sub in module.named_modules() if not sub.training]
    if names:
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        rank_zero_warn(
            f"Found {len(names)} module(s) in eval mode at the start of training ({shown}). The fit keeps each "
            "submodule's mode as you set it (it does not call model.train()), so these train in eval mode "
            "(dropout off, BatchNorm running statistics frozen). If this is intentional (a frozen layer), you can "
            "ignore this warning; otherwise call model.train() before fit.",
            category=PossibleUserWarning,
        )


def _warn_uneven(epoch: int, count: int, have: list[bool]) -> None:
    out = [rank for rank, has in enumerate(have) if not has]
    more = [rank for rank, has in enumerate(have) if has]
    rank_zero_warn(
        "The ranks got different numbers of training batches from a dataloader of unknown length: in epoch "
        f"{epoch}, rank(s) {out} had {count} batches and rank(s) {more} had more. Every rank ends each such "
        f"epoch at the first batch one of them lacks (here after {count}), so all stay at the same global_step; "
        "the other ranks' further batches are not trained on. To train on all of them, give every rank the "
        "same number of batches (e.g. the same number of samples per rank in your IterableDataset), or use a "
        "map-style dataset with a sampler that has __len__, which tandem shards evenly. (Shown once.)"
    )
