"""``AutomaticOptimization``: the Trainer calls backward and steps (through the module's ``optimizer_step`` override
when there is one), and what a ``training_step`` may return under it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.optim import Optimizer

from tandem.module import changed_too_late
from tandem.strategies.side_channel import SkipAgreement, skip_agreement
from tandem.trainer.hooks import current_hook, enter_hook, leave_hook, running_hook
from tandem.trainer.optimization.base import _TRAINING_STEP, Optimization
from tandem.utilities.exceptions import PossibleUserWarning, TandemUserCodeError, missing_metric
from tandem.utilities.rank_zero import rank_zero_warn


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
