"""The fit loop: epochs -> one epoch -> one batch. The optimization of a batch is the
``Optimization`` object's; evaluation is the
``EvaluationLoop``'s.

The loops own their state and receive a ``LoopContext``, never the Trainer: ``FitLoop`` owns the
``LoopState`` (what checkpoints save as ``"loops"``), the training data record and
the optimization object. None knows which strategy runs.

``FitLoop`` is one class whose phases live in files of their own, each the base of the next: ``training_data``
(its constructor and state, the training loader, the place checkpoints save, each epoch's batches),
``batch_runner`` (one batch), ``epoch_loop`` (one epoch, and the rules the epoch and the fit share) and this file
(the fit: ``run``, its stop rules, and the batch plan composed when a fit starts). Base classes rather than
components: the per-batch path keeps its plain ``self`` calls, with no object in between.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import torch

from tandem.module import is_overridden
from tandem.strategies.precision import Precision
from tandem.strategies.side_channel import placed
from tandem.strategies.strategy import moves_batches
from tandem.trainer.dataloader_iter import warn_experimental
from tandem.trainer.epoch_loop import TrainingEpochLoop
from tandem.trainer.profiling import timed
from tandem.trainer.state import BatchPlan, LoopState
from tandem.trainer.step_retry import repeating_uncommitted
from tandem.utilities.exceptions import PossibleUserWarning, TandemConfigError
from tandem.utilities.preemption import PREEMPTION
from tandem.utilities.rank_zero import rank_zero_info, rank_zero_warn
from tandem.utilities.seed import isolate_rng
from tandem.utilities.signature import takes_dataloader_iter

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.profilers import Profiler
    from tandem.strategies.strategy import Strategy
    from tandem.trainer.config import TrainerConfig
    from tandem.trainer.hooks import HookDispatcher
    from tandem.trainer.logging.collector import MetricCollector
    from tandem.trainer.logging.sink import LogSink
    from tandem.trainer.nonfinite import NonFiniteGuard
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


class FitLoop(TrainingEpochLoop):
    """Sanity check, then epochs until ``max_epochs``, ``max_steps`` or an agreed ``should_stop``.

    Args:
        context: what the loops work with.
        evaluation: the evaluation loop (validation during the fit).
        preempt: writes ``last.ckpt`` and ends the job; called on every rank at the agreed pre-emption stop.
        state: where training is, owned by this loop from now on.
    """

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


def _unscales(precision: Precision) -> bool:
    """Whether ``precision.unscale_gradients`` does anything: a float16 scaler, or an override of the method."""
    return precision.scaler is not None or type(precision).unscale_gradients is not Precision.unscale_gradients


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
