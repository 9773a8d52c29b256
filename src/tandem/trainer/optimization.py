"""How a training batch is optimized: ``AutomaticOptimization`` (the Trainer calls backward and steps)
or ``ManualOptimization`` (``training_step`` does, through ``self.optimizers()``).

Each owns the fit's optimizers and schedulers and has one ``run`` for the body of a batch;
the fit loop's batch runner owns what comes before and after it (the batch on its device, the batch hooks,
publishing the logged values). The optimizers ``self.optimizers()`` returns step through
``step`` of the object that wrapped them, then the strategy: never back through the loop.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch.optim import Optimizer

from tandem.module import calls_hook, changed_too_late, is_overridden
from tandem.strategies.side_channel import SkipAgreement, skip_agreement
from tandem.trainer.hooks import current_hook, enter_hook, leave_hook, running_hook
from tandem.trainer.optim import LRSchedulerConfig, TrainingOptimizer, parse_optimizers
from tandem.trainer.profiling import StrategyCalls, module_action, timed
from tandem.trainer.state import BatchPlan, not_composed
from tandem.utilities.exceptions import (
    PossibleUserWarning,
    TandemUserCodeError,
    missing_metric,
    unzeroed_gradients,
)
from tandem.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from tandem.module import TrainingModule
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


class AutomaticOptimization(Optimization):
    """The Trainer steps: forward and backward on each batch, an optimizer step on each stepping batch (see
    ``LoopState.plan_batch``), through the module's ``optimizer_step`` override when there is one (the forward
    and backward then run inside the closure it passes to ``optimizer.step``, as in Lightning).

    Args (beside ``Optimization``'s):
        optimizer_step: the module's ``optimizer_step`` override, or None.
        zero_grad: the module's ``optimizer_zero_grad`` override, or None.
        clip: clipping before each step, or None.
        lr_scheduler_step: the module's ``lr_scheduler_step`` (its own or the default), which steps each scheduler.
    """

    def __init__(
        self,
        *args: Any,
        optimizer_step: Callable[..., Any] | None = None,
        zero_grad: Callable[..., Any] | None = None,
        clip: Callable[[Optimizer], None] | None = None,
        lr_scheduler_step: Callable[[Any, Any], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._optimizer_step, self._zero_grad, self._clip = optimizer_step, zero_grad, clip
        self._lr_scheduler_step = lr_scheduler_step
        self._last_step_taken = False  # the latest step() was not skipped by the float16 scaler
        self._hand_steps = 0  # steps training_step took itself in the current batch (see _hand_step)
        #: several ranks: a batch that training_step skipped must be skipped on every rank (see _agree_to_skip)
        self._skip_agreement = skip_agreement()

    _no_step_advice = (
        "Under automatic optimization the Trainer steps after each batch (each accumulate_grad_batches-th), through "
        "the optimizers configure_optimizers returned."
    )

    def run(self, batch: Any, batch_idx: int) -> tuple[Any, torch.Tensor | None]:
        """Forward and backward for one micro-batch; the optimizer step when the batch plan says so.

        This is the per-step hot path: hooks nobody registered are not dispatched, and nothing here waits
        for the device (no ``.item()``).
        """
        strategy, calls, loop = self.context.strategy, self.calls, self.loop
        if not loop.stepping:  # an accumulation micro-step: gradients stay local (DDP skips its all-reduce)
            with strategy.no_backward_sync(strategy.model, enabled=True):
                output = self._training_step(batch, batch_idx)
                return output, self._backward(output)
        if self._optimizer_step is not None:
            return self._run_in_closure(self._optimizer_step, batch, batch_idx)
        args = (batch, batch_idx) if self.takes_batch_idx else (batch,)
        token = enter_hook(_TRAINING_STEP)  # inline, not _training_step: one frame fewer to the user's step
        try:
            output = calls.run_step(_TRAINING_STEP, *args)
            if self.plan.deferred_logs:  # a compiled step's self.log calls (see CompiledStepLog)
                self.context.metrics.log_deferred()
        finally:
            leave_hook(token)
        loss = self._backward(output)
        if self.has_gradients:
            optimizer = self.optimizers[0]
            if self._prepares:
                self._prepare_step(optimizer)
            self._finish_step(optimizer, batch_idx, calls.optimizer_step(optimizer))
        elif self._hand_steps:
            self._count_hand_steps(batch_idx)
        else:
            self._step_without_loss(batch_idx)
        return output, loss

    def _run_in_closure(
        self, optimizer_step: Callable[..., Any], batch: Any, batch_idx: int
    ) -> tuple[Any, torch.Tensor | None]:
        result: list[tuple[Any, torch.Tensor | None]] = []

        def closure() -> torch.Tensor | None:
            output = self._training_step(batch, batch_idx)
            result.append((output, self._backward(output)))
            return result[-1][1]

        optimizer = self.training_optimizers[0]
        self._last_step_taken = False
        with running_hook("optimizer_step"):
            optimizer_step(self.loop.epoch, batch_idx, optimizer, closure)
        if not result:
            raise TandemUserCodeError(
                f"{type(self.context.strategy.module).__name__}.optimizer_step did not run the closure, so "
                "training_step and backward never ran. Call optimizer.step(closure=optimizer_closure) in your override."
            )
        if self._hand_steps:
            raise TandemUserCodeError(
                "training_step stepped an optimizer itself (self.optimizers().step()) while the module also overrides "
                "optimizer_step, which steps after it: two steps per batch. Step in one place: in optimizer_step "
                "(training_step returns the loss), or set self.automatic_optimization = False and step in "
                "training_step."
            )
        self._finish_step(optimizer.optimizer, batch_idx, self._last_step_taken)
        return result[-1]

    def step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any) -> None:
        """``optimizer.step(closure)`` inside the module's ``optimizer_step`` override (the step is counted when
        the override returns); anywhere else, a step ``training_step`` takes itself (``_hand_step``)."""
        hook = current_hook()
        if hook != "optimizer_step":
            if hook != _TRAINING_STEP:
                late = changed_too_late(self.context.strategy.module, automatic=True)
                raise TandemUserCodeError(
                    f"optimizer.step() was called in {hook or 'code the Trainer does not run'} under automatic "
                    f"optimization, where the Trainer steps after training_step.{late} Step in an optimizer_step override "
                    "(optimizer.step(closure=optimizer_closure)), or set self.automatic_optimization = False and step "
                    "in training_step."
                )
            self._hand_step(optimizer, closure, **kwargs)
            return

        def run_closure() -> Any:
            result = closure() if closure is not None else None
            self._prepare_step(optimizer, backward_ran=result is not None)
            return result

        self._last_step_taken = self.calls.optimizer_step(optimizer, run_closure, **kwargs)

    def _hand_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None, **kwargs: Any) -> None:
        """``self.optimizers().step()`` called by ``training_step`` itself under automatic optimization (after its own
        ``loss.backward()``). Taken through the strategy and counted toward ``global_step``, as under manual
        optimization (Lightning takes it but does not count it, so its ``global_step`` stays at 0); the batch must
        then return None, or the Trainer would step a second time (see ``_backward``)."""
        strategy = self.context.strategy
        if not strategy.supports_manual_optimization:
            raise TandemUserCodeError(
                f"training_step called optimizer.step() itself under strategy={strategy.name!r}, whose steps run in "
                "replicas of the module (once per replica). Return the loss and let the Trainer step, or use "
                "strategy='ddp'."
            )
        if not self.loop.stepping:  # DDP's gradient sync is held back on these batches: the ranks would diverge
            raise TandemUserCodeError(
                "training_step called optimizer.step() itself on an accumulation micro-batch (Trainer("
                f"accumulate_grad_batches={self.context.config.accumulate_grad_batches})): the Trainer accumulates "
                "and steps for you there. Return the loss and remove your step, or remove accumulate_grad_batches "
                "and set self.automatic_optimization = False to step every N batches yourself."
            )

        def run_closure() -> Any:
            with torch.enable_grad():
                result = closure() if closure is not None else None
            self._prepare_step(optimizer)
            return result

        self.calls.optimizer_step(optimizer, run_closure, **kwargs)
        self.loop.global_step += 1
        self._hand_steps += 1

    def _step_without_loss(self, batch_idx: int) -> None:
        """A stepping batch whose ``training_step`` returned None, with no backward in its window: as in Lightning,
        the step is still taken (the optimizer finds no gradient, so nothing moves; under float16 scaling it is
        skipped) and counted, so ``global_step``, ``max_steps``, the per-step schedulers and the pre-step hooks
        advance as they do there. Lightning's warning, once per fit."""
        if not self._none_warned:
            self._none_warned = True
            rank_zero_warn(
                "`training_step` returned `None`. If this was on purpose, ignore this warning... (the batch is "
                "skipped: no backward; the optimizer step is still taken and counted, as in Lightning)",
                category=PossibleUserWarning,
            )
        optimizer = self.optimizers[0]
        self._prepare_step(optimizer, backward_ran=False)
        self._finish_step(optimizer, batch_idx, self.calls.optimizer_step(optimizer, _no_loss))
        self.step_without_loss = self.loop.global_step

    def _count_hand_steps(self, batch_idx: int) -> None:
        """A batch whose ``training_step`` stepped by hand (and returned None): it counts as a stepping batch."""
        self._hand_steps = 0
        self.loop.batches_stepped += 1
        if self.lr_scheduler_configs:
            self.step_schedulers("step", plateau=False, count=batch_idx + 1)

    def _backward(self, output: Any) -> torch.Tensor | None:
        # the common output, a scalar loss with a graph, read without the checks of the others
        loss = (
            output if type(output) is torch.Tensor and output.requires_grad and not output.ndim else _loss_from(output)
        )
        if loss is not None:
            if self._hand_steps:
                raise _double_step(self._hand_steps, changed_too_late(self.context.strategy.module, automatic=True))
            plan = self.plan
            if plan.before_backward:  # hooks nobody overrides are not even called
                self.context.hooks.call("on_before_backward", loss)
            k = self.context.config.accumulate_grad_batches  # a callback may change it between batches
            self.calls.backward(loss / k if k > 1 else loss)
            if plan.after_backward:
                self.context.hooks.call("on_after_backward")
            self.has_gradients = True
        elif self._skip_agreement is not None and self.loop.stepping:  # a skipped batch: never on the loss path
            self._agree_to_skip(self._skip_agreement)
        return loss

    def _agree_to_skip(self, agreement: SkipAgreement) -> None:
        """A stepping batch whose ``training_step`` returned None, with several ranks: every rank must skip it, for
        the others' backward exchanges gradients with this rank, which runs none (the job would wait until a
        timeout names collectives instead). Waits until every rank skipped this batch too, or names the rank
        that ran backward."""
        other = agreement.agree()
        if other is None:
            return
        strategy = self.context.strategy
        rank, batch = strategy.global_rank, self.loop.batches_done
        raise TandemUserCodeError(
            f"rank {rank}'s training_step returned None at batch {batch} while rank {other} ran backward: skip on "
            f"every rank or none. Under strategy={strategy.name!r} each backward pass exchanges the gradients with "
            f"every rank, so rank {other} waits for a backward that rank {rank} never runs (the job would hang). "
            "Decide the skip together (e.g. skip = self.all_gather(torch.tensor(bad)).any(), then return None on "
            "every rank), or, on the rank that has nothing to learn from the batch, return a loss that changes "
            "nothing (loss * 0.0) instead of None."
        )

    def _prepare_step(self, optimizer: Optimizer, backward_ran: bool = True) -> None:
        """Between backward and the step: unscale float16 gradients (not when the step's closure ran no backward,
        its ``training_step`` returning None: nothing was scaled), the hook, clipping."""
        plan = self.plan
        if backward_ran and plan.unscale:
            self.context.strategy.precision.unscale_gradients(optimizer)
        if plan.before_optimizer_step:
            self.context.hooks.call("on_before_optimizer_step", optimizer)
        if self._clip is not None:
            with running_hook("configure_gradient_clipping"):
                self._clip(optimizer)

    def _finish_step(self, optimizer: Optimizer, batch_idx: int, stepped: bool) -> None:
        """After a step: clear the gradients, count the step, step the per-step schedulers."""
        loop = self.loop
        if self.plan.before_zero_grad:
            self.context.hooks.call("on_before_zero_grad", optimizer)
        if self._zero_grad is None:
            optimizer.zero_grad(set_to_none=True)
        else:
            with running_hook("optimizer_zero_grad"):
                self._zero_grad(loop.epoch, batch_idx, optimizer)
        self.has_gradients = False
        loop.global_step += 1  # after the module's optimizer_step returned, as in Lightning
        loop.batches_stepped += 1
        if stepped and self.lr_scheduler_configs:  # a step skipped by the float16 scaler does not count
            self.step_schedulers("step", plateau=False, count=batch_idx + 1)

    def step_schedulers(
        self, interval: str, plateau: bool, count: int, values: Mapping[str, Any] | None = None
    ) -> None:
        """Through the module's ``lr_scheduler_step``; a ``reduce_on_plateau`` one gets rank 0's value of its
        monitor."""
        strategy = self.context.strategy
        metrics = self.context.metrics.callback_metrics if values is None else values
        for config in self.lr_scheduler_configs:
            if config.interval != interval or config.reduce_on_plateau != plateau or count % config.frequency:
                continue
            metric = None
            if config.reduce_on_plateau:
                monitor = config.monitor
                assert monitor is not None  # parse_optimizers refuses a plateau scheduler without one (automatic)
                value = metrics.get(monitor)
                if value is None:
                    if config.strict:
                        lead = (
                            f"ReduceLROnPlateau conditioned on metric {monitor} which is not available. "
                            f"Available metrics are: {sorted(metrics)}."
                        )
                        raise missing_metric("The lr_scheduler config", monitor, metrics, lead)
                    rank_zero_warn(
                        f"ReduceLROnPlateau conditioned on metric {monitor} which is not available but strict "
                        "is set to `False`. Skipping learning rate update: log it with self.log("
                        f"{monitor!r}, value), or set the lr_scheduler dict's monitor to a logged key.",
                        category=RuntimeWarning,
                    )
                    continue
                metric = strategy.broadcast(float(value))  # rank 0's value: equal LRs
            self._lr_scheduler_step(config.scheduler, metric)

    def has_schedulers(self, interval: str, plateau: bool) -> bool:
        return any(c.interval == interval and c.reduce_on_plateau == plateau for c in self.lr_scheduler_configs)

    def monitored_values(self) -> dict[str, float]:
        metrics = self.context.metrics.callback_metrics
        return {
            monitor: float(metrics[monitor])
            for config in self.lr_scheduler_configs
            if config.reduce_on_plateau
            and config.interval == "epoch"
            and (monitor := config.monitor) is not None
            and monitor in metrics
        }

    def hook_outputs(self, output: Any, loss: torch.Tensor | None) -> Any:
        if loss is None:
            return None
        if isinstance(output, Mapping):
            return {**output, "loss": loss.detach()}
        return {"loss": loss.detach()}


class ManualOptimization(Optimization):
    """``training_step`` does the backward and the steps (``self.manual_backward``, ``opt.step()``); each step
    counts toward ``global_step``, each batch toward the loggers' step (as in Lightning)."""

    automatic = False
    _no_step_advice = (
        "Under manual optimization (automatic_optimization = False) training_step steps the optimizers itself: "
        "opt = self.optimizers(); opt.zero_grad(); self.manual_backward(loss); opt.step()."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: optimizers stepped whose gradients no zero_grad has cleared since (see ``_Stepped``); emptied for
        #: good once the mistake was reported (once per fit)
        self._stepped: dict[Optimizer, _Stepped] = {}
        self._unzeroed_warned = False

    def run(self, batch: Any, batch_idx: int) -> tuple[Any, torch.Tensor | None]:
        output = self._training_step(batch, batch_idx)
        self.loop.batches_stepped += 1
        loss = output.get("loss") if isinstance(output, Mapping) else output
        return output, loss if isinstance(loss, torch.Tensor) else None

    def step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any) -> None:
        """``opt.step()`` in a manual ``training_step``: through the strategy's precision, then counted."""
        step = self.calls.optimizer_step
        if closure is None:
            if optimizer in self._stepped:
                self._check_zeroed(optimizer)
            self._prepare(optimizer)
            step(optimizer, **kwargs)
        else:  # the closure zeroes and runs backward inside the step: not checked

            def run_closure() -> Any:  # a closure of the user's (e.g. LBFGS), which the optimizer may call again
                with torch.enable_grad():
                    result = closure()
                self._prepare(optimizer)
                return result

            step(optimizer, run_closure, **kwargs)
        self.loop.global_step += 1
        if not self._unzeroed_warned:
            stepped = _Stepped.on(optimizer)
            if stepped is not None:
                self._stepped[optimizer] = stepped

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``self.manual_backward(loss)``: the strategy's backward. Stepped optimizers whose gradients a zero_grad
        cleared since their step are forgotten first, and the others note what this backward added, so that
        their next step can tell a missing zero_grad (``_check_zeroed``) from a zeroing in place."""
        stepped = self._stepped
        if stepped:
            for optimizer in [o for o, s in stepped.items() if not s.unchanged()]:
                del stepped[optimizer]
        self.calls.backward(loss, *args, **kwargs)
        for entry in stepped.values():
            entry.added()

    def zeroed(self, optimizer: Optimizer) -> None:
        """``zero_grad()`` of an optimizer from ``self.optimizers()``."""
        self._stepped.pop(optimizer, None)

    def gradients_changed(self, optimizer: Optimizer) -> None:
        """tandem changed ``optimizer``'s gradients in place (``self.clip_gradients``: unscaled, clipped): not a
        zero_grad."""
        entry = self._stepped.get(optimizer)
        if entry is not None:
            entry.added()

    def _check_zeroed(self, optimizer: Optimizer) -> None:
        """Before a step: warn (once per fit) when ``optimizer``'s gradients are the ones of its previous step, with
        at most manual_backward's additions: no zero_grad ran in between."""
        if self._stepped.pop(optimizer).unchanged():
            self._unzeroed_warned = True
            self._stepped.clear()
            index = self.optimizers.index(optimizer)
            where = f"self.optimizers()[{index}]" if len(self.optimizers) > 1 else "self.optimizers()"
            rank_zero_warn(unzeroed_gradients(f"Optimizer {where} ({type(optimizer).__name__})"))

    def _prepare(self, optimizer: Optimizer) -> None:
        self.context.strategy.precision.unscale_gradients(optimizer)
        self.context.hooks.call("on_before_optimizer_step", optimizer)

    def hook_outputs(self, output: Any, loss: torch.Tensor | None) -> Any:
        """Under manual optimization ``training_step`` may return nothing, a tensor or a dict (Lightning's rule)."""
        if output is None:
            return None
        if isinstance(output, torch.Tensor):
            return {"loss": output.detach()}
        if isinstance(output, Mapping):
            value = output.get("loss")
            return {**output, "loss": value.detach()} if isinstance(value, torch.Tensor) else dict(output)
        raise TandemUserCodeError(
            f"training_step returned {type(output).__name__}; under manual optimization it returns nothing, a "
            "tensor or a dict."
        )


def configure_optimization(
    module: TrainingModule, context: LoopContext, loop: LoopState, takes_batch_idx: bool
) -> Optimization:
    """The fit's optimization object: ``configure_optimizers`` parsed, the optimizers set up by the strategy,
    and the module's overrides the batches will call (None where the module keeps the default)."""
    strategy, config = context.strategy, context.config
    automatic = module.automatic_optimization
    steps_schedulers = calls_hook(module, "lr_scheduler_step")
    returned = module.configure_optimizers()
    if module.automatic_optimization != automatic:  # set in configure_optimizers: after the mode was chosen
        module._note_mode_set_in("configure_optimizers")
    optimizers, schedulers = parse_optimizers(
        returned, automatic, steps_schedulers, late=changed_too_late(module, automatic)
    )
    optimizers = strategy.setup_optimizers(optimizers)
    if not automatic:
        return ManualOptimization(context, loop, optimizers, schedulers, takes_batch_idx)
    clip = None
    if is_overridden(module, "configure_gradient_clipping"):

        def clip(optimizer: Optimizer) -> None:
            module.configure_gradient_clipping(optimizer, config.gradient_clip_val, config.gradient_clip_algorithm)

    elif config.gradient_clip_val is not None:
        value, algorithm = config.gradient_clip_val, config.gradient_clip_algorithm or "norm"

        def clip(optimizer: Optimizer) -> None:
            strategy.clip_gradients(optimizer, value, algorithm)

    optimizer_step = module.optimizer_step if is_overridden(module, "optimizer_step") else None
    zero_grad = module.optimizer_zero_grad if is_overridden(module, "optimizer_zero_grad") else None
    profiler = context.profiler
    if profiler is not None:  # the profiling variant: the module's overrides timed (the plain path is unchanged)
        if optimizer_step is not None:
            optimizer_step = timed(optimizer_step, profiler, module_action(module, "optimizer_step"))
        if zero_grad is None:

            def zero_grad(epoch: int, batch_idx: int, optimizer: Optimizer) -> None:  # the hook's default
                optimizer.zero_grad(set_to_none=True)

        zero_grad = timed(zero_grad, profiler, module_action(module, "optimizer_zero_grad"))
        if clip is not None:
            clip = timed(clip, profiler, module_action(module, "configure_gradient_clipping"))
    return AutomaticOptimization(
        context,
        loop,
        optimizers,
        schedulers,
        takes_batch_idx,
        optimizer_step=optimizer_step,
        zero_grad=zero_grad,
        clip=clip,
        lr_scheduler_step=module.lr_scheduler_step,
    )


class _Stepped:
    """An optimizer's gradients as its latest ``step()`` left them, read from one of its parameters (no scan of the
    others). While that parameter holds the same gradient tensor, changed only by ``manual_backward`` (which this
    records), no zero_grad ran: ``zero_grad()`` and ``module.zero_grad()`` (``set_to_none=True``) and ``p.grad =
    None`` leave None or, after a backward, a new tensor; ``set_to_none=False`` zeroes the tensor in place, which
    advances its version counter."""

    __slots__ = ("grad", "param", "version")

    def __init__(self, param: torch.Tensor, grad: torch.Tensor) -> None:
        self.param, self.grad, self.version = param, weakref.ref(grad), grad._version

    @classmethod
    def on(cls, optimizer: Optimizer) -> _Stepped | None:
        """The first of ``optimizer``'s parameters that has a gradient (nearly always its first), or None."""
        for group in optimizer.param_groups:
            for param in group["params"]:
                grad = param.grad
                if grad is not None:
                    return cls(param, grad)
        return None

    def unchanged(self) -> bool:
        """The gradient is the stepped one, changed by nothing but what ``added`` recorded."""
        grad = self.param.grad
        return grad is not None and grad is self.grad() and grad._version == self.version

    def added(self) -> None:
        """A backward (or tandem's unscaling and clipping) changed the gradient in place: not a zero_grad."""
        grad = self.param.grad
        if grad is not None and grad is self.grad():
            self.version = grad._version


def _double_step(steps: int, late: str = "") -> TandemUserCodeError:
    return TandemUserCodeError(
        f"training_step stepped an optimizer itself ({steps} x self.optimizers().step()) and also returned a loss, "
        "under automatic optimization: the Trainer would run backward on that loss and step again, two steps per "
        f"batch.{late} Step in one place: return the loss and remove your backward / step / zero_grad calls (the Trainer "
        "does them); or set self.automatic_optimization = False in __init__ and use self.manual_backward(loss) and "
        "opt.step() (training_step may then return the loss, for the loggers); or return None after stepping."
    )


def _no_loss() -> None:
    """The closure of a step whose ``training_step`` returned None: no loss, no backward (Lightning's)."""
    return None


def _loss_from(output: Any) -> torch.Tensor | None:
    if output is None:
        return None
    loss = output
    if not isinstance(output, torch.Tensor) and isinstance(output, Mapping):  # a tensor first: Mapping is an ABC check
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        if not loss.requires_grad:
            raise TandemUserCodeError(
                "training_step returned a loss that does not require grad, so backward cannot run. Compute the "
                "loss from the module's outputs (not under torch.no_grad() and without .detach() / .item())."
            )
        return loss
    got = (
        f"a dict without a scalar tensor under 'loss' (keys: {sorted(output)})"
        if isinstance(output, Mapping)
        else f"{type(output).__name__}"
        + (f" of shape {tuple(output.shape)}" if isinstance(output, torch.Tensor) else "")
    )
    raise TandemUserCodeError(
        f"training_step returned {got}; expected the loss as a scalar tensor, a dict with a 'loss' tensor, "
        "or None to skip the batch."
    )
