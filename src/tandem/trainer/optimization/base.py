"""``Optimization``: what the two modes share (the fit's optimizers and schedulers, the call of ``training_step``,
the warning of an epoch without a step), and the no-op object a fit loop holds before its first fit."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer

from tandem.trainer.hooks import enter_hook, leave_hook
from tandem.trainer.optim import LRSchedulerConfig, TrainingOptimizer
from tandem.trainer.profiling import StrategyCalls
from tandem.trainer.state import BatchPlan, not_composed
from tandem.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from tandem.trainer.loops import LoopContext
    from tandem.trainer.state import LoopState

_TRAINING_STEP = "training_step"


class Optimization:
    """The fit's optimizers and schedulers (none before a fit), and what a batch does with them.

    Args:
        context: what the loops work with (strategy, hooks, collector, config, ...).
        loop: the fit loop's state, whose counters the steps advance.
        optimizers: the optimizers, set up by the strategy.
        lr_scheduler_configs: their schedulers.
        takes_batch_idx: ``training_step`` takes ``batch_idx`` (else only the batch).
    """

    automatic = True
    #: the stages that are on for the fit (set with ``follow_plan`` when a fit starts; every stage outside one)
    plan: BatchPlan = BatchPlan.FULL
    _prepares = True  # something runs between backward and the step (unscaling, a hook, clipping)
    # Set for a fit. The empty object a fit loop holds before its first fit has none of them; it runs no batch.
    context: LoopContext
    loop: LoopState
    #: the strategy's run_step / backward / optimizer_step, bound once per fit (timed when profiling)
    calls: StrategyCalls

    def __init__(
        self,
        context: LoopContext | None = None,
        loop: LoopState | None = None,
        optimizers: list[Optimizer] | None = None,
        lr_scheduler_configs: list[LRSchedulerConfig] | None = None,
        takes_batch_idx: bool = True,
    ) -> None:
        if context is not None:
            self.context = context
            self.calls = StrategyCalls(context.strategy, context.profiler)
        if loop is not None:
            self.loop = loop
        self.optimizers: list[Optimizer] = list(optimizers or [])
        self.lr_scheduler_configs: list[LRSchedulerConfig] = list(lr_scheduler_configs or [])
        self.takes_batch_idx = takes_batch_idx
        # Held weakly: this object holds them, and a reference back would be a cycle keeping a finished fit alive.
        step = weakref.WeakMethod(self.step)
        zeroed = None if self.automatic else weakref.WeakMethod(self.zeroed)
        self.training_optimizers = [TrainingOptimizer(o, step, zeroed) for o in self.optimizers]  # self.optimizers()
        self.has_gradients = False  # backward ran since the last optimizer step (automatic)
        self._no_step_warned = False  # an epoch without an optimizer step was reported (once per fit)
        self._none_warned = False  # a training_step returning None was reported (once per fit)
        self.step_without_loss = -1  # the global_step that the latest step after a returned None counted

    def follow_plan(self, plan: BatchPlan) -> None:
        """Run the stages ``plan`` has on (the fit loop's, composed when a fit starts)."""
        self.plan = replace(plan, optimize=not_composed)  # not this object's own run: no reference cycle to free
        self._prepares = plan.unscale or plan.before_optimizer_step or getattr(self, "_clip", None) is not None

    def run(self, batch: Any, batch_idx: int) -> tuple[Any, torch.Tensor | None]:
        """The body of one training batch: returns what ``training_step`` returned and its loss (or None)."""
        raise NotImplementedError

    def step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any) -> None:
        """``step()`` of an optimizer from ``self.optimizers()``."""
        raise NotImplementedError

    def hook_outputs(self, output: Any, loss: torch.Tensor | None) -> Any:
        """What ``on_train_batch_end`` gets as ``outputs``."""
        raise NotImplementedError

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``self.manual_backward(loss)``: manual optimization's (the module refuses the call under automatic)."""
        raise NotImplementedError

    def zeroed(self, optimizer: Optimizer) -> None:
        """``zero_grad()`` of an optimizer from ``self.optimizers()`` (manual optimization follows it)."""

    def gradients_changed(self, optimizer: Optimizer) -> None:
        """tandem changed ``optimizer``'s gradients in place (``self.clip_gradients``: unscaled, clipped), not a
        zero_grad (manual optimization follows it)."""

    def step_schedulers(
        self, interval: str, plateau: bool, count: int, values: Mapping[str, Any] | None = None
    ) -> None:
        """Step the schedulers of ``interval`` ("step" or "epoch") that are due at ``count`` (the epoch's batch, or
        the epoch, counted from 1: due when ``count % frequency == 0``), the ``ReduceLROnPlateau`` ones or the others
        (``plateau``); manual optimization's module steps its own. Lightning's moments, which the loops keep: the
        others after the optimizer step (``"epoch"``: at the epoch's last batch, before its validation); the plateau
        ones after the batch's validation (``"step"``) or after ``on_train_epoch_end`` (``"epoch"``), reading their
        monitor from ``values`` (default: the published values)."""

    def monitored_values(self) -> dict[str, float]:
        """The published values of the plateau schedulers' monitors (what their epoch step would read now)."""
        return {}

    def has_schedulers(self, interval: str, plateau: bool) -> bool:
        """Whether ``step_schedulers`` would find any of ``interval`` and kind (decided once per epoch)."""
        return False

    def check_epoch_steps(self, epoch: int, batches: int, steps: int) -> None:
        """At the end of training epoch ``epoch``: ``batches`` batches ran and took ``steps`` optimizer steps. None
        at all is nearly always a mistake that trains nothing, or trains without the Trainer knowing (``global_step``
        stays, so ``max_steps``, step-based checkpoints and the loggers' steps do not advance): warn once per fit."""
        if steps or not batches or self._no_step_warned or not self.optimizers:
            return
        self._no_step_warned = True
        with_grads = any(p.grad is not None for o in self.optimizers for g in o.param_groups for p in g["params"])
        rank_zero_warn(
            f"No optimizer step was counted in training epoch {epoch} ({batches} batches; global_step stays at "
            f"{self.loop.global_step}), although {'backward ran' if with_grads else 'the batches ran'}. "
            f"{self._no_step_advice} A step of the torch optimizer itself (self.optimizers(use_pl_optimizer=False), "
            "trainer.optimizers, or an optimizer kept from configure_optimizers) is not seen by the Trainer: step the "
            "ones self.optimizers() returns. (Shown once.)"
        )

    _no_step_advice = ""

    def _training_step(self, batch: Any, batch_idx: int) -> Any:
        args = (batch, batch_idx) if self.takes_batch_idx else (batch,)
        token = enter_hook(_TRAINING_STEP)
        try:
            output = self.calls.run_step(_TRAINING_STEP, *args)
            if self.plan.deferred_logs:  # a compiled step's self.log calls (see CompiledStepLog)
                self.context.metrics.log_deferred()
            return output
        finally:
            leave_hook(token)
