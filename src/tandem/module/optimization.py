"""A TrainingModule's optimization front (``OptimizationMixin``): ``automatic_optimization``, what a
``training_step`` steps by hand (``self.optimizers()``, ``self.lr_schedulers()``, ``manual_backward``, the toggles,
``clip_gradients``), and the overridable parts of an optimizer step (``configure_gradient_clipping``,
``optimizer_step``, ``optimizer_zero_grad``, ``lr_scheduler_step``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, cast, overload

import torch
from torch import nn

from tandem.module.hooks import logs_per_step
from tandem.strategies.strategy import CLIP_ALGORITHMS
from tandem.utilities.exceptions import TandemConfigError, TandemUserCodeError, bad_choice
from tandem.utilities.logged_values import CURRENT_HOOK

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from tandem.trainer.optim import LRSchedulerTypeUnion, TrainingOptimizer
    from tandem.trainer.trainer import Trainer


def changed_too_late(module: object, automatic: bool) -> str:
    """The sentence an error about the optimization mode adds when the fit runs in mode ``automatic`` but the
    module's ``automatic_optimization`` says the other now: it was changed after the fit chose its mode (and in which
    hook); else ""."""
    if not isinstance(module, OptimizationMixin) or module.automatic_optimization == automatic:
        return ""
    where = module.__dict__.get("_mode_set_in")
    return (
        f" self.automatic_optimization was set to {module.automatic_optimization}"
        + (f" in {where}" if where else "")
        + f", after this fit had started in {'automatic' if automatic else 'manual'} optimization: the Trainer "
        "reads it once, when the fit starts (before configure_optimizers), so the change came too late."
    )


class OptimizationMixin:
    """How a [`TrainingModule`][tandem.TrainingModule] optimizes: automatic (the Trainer steps) or manual
    (``training_step`` steps), and the hooks of each optimizer step. Part of every TrainingModule, as Lightning's
    ``LightningModule`` holds these itself."""

    if TYPE_CHECKING:  # what these methods read of the TrainingModule they are part of
        trainer: Trainer
        _trainer: Trainer | None
        _param_requires_grad_state: dict[nn.Parameter, bool]

    @property
    def automatic_optimization(self) -> bool:
        """False: ``training_step`` steps the optimizers itself (``self.optimizers()``, ``manual_backward``)."""
        return self.__dict__.get("_automatic_optimization", True)

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        self.__dict__["_automatic_optimization"] = bool(value)
        if self._trainer is not None:  # set while a Trainer runs the module: remember in which hook (a late change)
            self._note_mode_set_in(CURRENT_HOOK.get())

    def _note_mode_set_in(self, where: str | None) -> None:
        """Record where ``automatic_optimization`` was last set while a Trainer ran this module (a hook; the Trainer
        names ``configure_optimizers``, which it calls outside the hooks), for the errors of a change that came
        after the fit chose its mode."""
        self.__dict__["_mode_set_in"] = where

    @overload
    def optimizers(self, use_pl_optimizer: Literal[True] = True) -> TrainingOptimizer | list[TrainingOptimizer]: ...
    @overload
    def optimizers(self, use_pl_optimizer: Literal[False]) -> Optimizer | list[Optimizer]: ...
    @overload
    def optimizers(
        self, use_pl_optimizer: bool
    ) -> TrainingOptimizer | list[TrainingOptimizer] | Optimizer | list[Optimizer]: ...
    def optimizers(
        self, use_pl_optimizer: bool = True
    ) -> TrainingOptimizer | list[TrainingOptimizer] | Optimizer | list[Optimizer]:
        """The optimizers from ``configure_optimizers``: one, or a list when there are several.

        Each is wrapped so that ``step()`` goes through the strategy's precision (the float16 scaler) and
        counts toward ``trainer.global_step``; ``use_pl_optimizer=False`` gives the torch optimizers.

        Example:
            ```python
            opt = self.optimizers()  # manual optimization, one optimizer
            assert not isinstance(opt, list)  # a type checker then knows it is one optimizer
            ```
        """
        optimization = self.trainer.fit_loop.optimization
        if use_pl_optimizer:
            wrapped = optimization.training_optimizers
            return wrapped[0] if len(wrapped) == 1 else list(wrapped)
        found = optimization.optimizers
        return found[0] if len(found) == 1 else list(found)

    def lr_schedulers(self) -> LRSchedulerTypeUnion | list[LRSchedulerTypeUnion] | None:
        """The schedulers from ``configure_optimizers``: None, one, or a list. Step them yourself under manual
        optimization."""
        schedulers = [config.scheduler for config in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``loss.backward(*args, **kwargs)`` through the strategy: float16 loss scaling and DDP's gradient
        all-reduce, with the ``on_before_backward`` / ``on_after_backward`` hooks. Manual optimization only."""
        trainer = self.trainer
        if trainer.fit_loop.optimization.automatic:
            raise TandemUserCodeError(
                "manual_backward is for manual optimization, and this fit runs automatic optimization."
                f"{changed_too_late(self, automatic=True)} Set self.automatic_optimization = False in __init__, "
                "or return the loss from training_step and let the Trainer call backward."
            )
        trainer.call_hook("on_before_backward", loss)
        trainer.fit_loop.optimization.backward(loss, *args, **kwargs)  # the strategy's (timed when profiling)
        trainer.call_hook("on_after_backward")

    def toggle_optimizer(self, optimizer: Optimizer | TrainingOptimizer) -> None:
        """Let only ``optimizer``'s parameters take gradients (the others' ``requires_grad`` is set False until
        [`untoggle_optimizer`][tandem.TrainingModule.untoggle_optimizer]), so each loss of a GAN reaches only the
        network it trains."""
        state: dict[nn.Parameter, bool] = {}
        for opt in self.trainer.optimizers:
            for group in opt.param_groups:
                for param in group["params"]:
                    if param not in state:
                        state[param] = param.requires_grad
                        param.requires_grad = False
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.requires_grad = state[param]
        self._param_requires_grad_state = state

    def untoggle_optimizer(self, optimizer: Optimizer | TrainingOptimizer) -> None:
        """Restore the ``requires_grad`` flags that [`toggle_optimizer`][tandem.TrainingModule.toggle_optimizer]
        changed."""
        inner = getattr(optimizer, "optimizer", optimizer)
        for opt in self.trainer.optimizers:
            if opt is inner:
                continue
            for group in opt.param_groups:
                for param in group["params"]:
                    if param in self._param_requires_grad_state:
                        param.requires_grad = self._param_requires_grad_state[param]
        self._param_requires_grad_state = {}

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Optimizer | TrainingOptimizer) -> Iterator[None]:
        """[`toggle_optimizer`][tandem.TrainingModule.toggle_optimizer] for the block,
        [`untoggle_optimizer`][tandem.TrainingModule.untoggle_optimizer] after it (even on error)."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def clip_gradients(
        self,
        optimizer: Optimizer | TrainingOptimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip ``optimizer``'s gradients by total norm (``"norm"``) or elementwise (``"value"``).

        Float16 gradients are unscaled first. Without arguments, the Trainer's ``gradient_clip_val`` and
        ``gradient_clip_algorithm`` apply; giving a different value than the Trainer's is an error.
        """
        trainer = self.trainer
        value, algorithm = _resolve_clipping(
            gradient_clip_val, gradient_clip_algorithm, trainer.gradient_clip_val, trainer.gradient_clip_algorithm
        )
        if not value:
            return
        inner = cast("Optimizer", getattr(optimizer, "optimizer", optimizer))  # a TrainingOptimizer's torch optimizer
        trainer.strategy.precision.unscale_gradients(inner)
        trainer.strategy.clip_gradients(inner, value, algorithm)
        optimization = trainer.fit_loop.optimization
        if not optimization.automatic:  # changed in place, not zeroed: a later missing zero_grad is still seen
            optimization.gradients_changed(inner)

    @logs_per_step
    def configure_gradient_clipping(
        self, optimizer: Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> None:
        """Called before each optimizer step (automatic optimization) with the Trainer's clipping settings.
        Override to clip your own way; the default calls [`clip_gradients`][tandem.TrainingModule.clip_gradients]."""
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    @logs_per_step
    def optimizer_step(
        self,
        epoch: int,
        batch_idx: int,
        optimizer: Optimizer | TrainingOptimizer,
        optimizer_closure: Callable[[], Any] | None = None,
    ) -> None:
        """Step ``optimizer`` (automatic optimization). ``optimizer_closure`` runs ``training_step`` and
        backward: call ``optimizer.step(closure=optimizer_closure)``. Override to add warm-up or a schedule
        of your own (tandem calls the override only when there is one)."""
        optimizer.step(closure=optimizer_closure)

    @logs_per_step
    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Optimizer) -> None:
        """Clear the gradients after each optimizer step (automatic optimization)."""
        optimizer.zero_grad()

    def lr_scheduler_step(self, scheduler: Any, metric: Any | None) -> None:
        """Step one scheduler: ``scheduler.step()``, or ``scheduler.step(metric)`` for a monitored one. (``scheduler``
        is typed ``Any``: an override steps a scheduler that is not torch's, e.g. timm's, in its own way.)"""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)


def _resolve_clipping(
    value: float | None, algorithm: str | None, trainer_value: float | None, trainer_algorithm: str | None
) -> tuple[float, str]:
    """The clipping ``self.clip_gradients`` applies: its arguments, else the Trainer's; both set and
    different is an error (as in Lightning)."""
    if value is None:
        value = trainer_value or 0.0
    elif trainer_value is not None and trainer_value != value:
        raise TandemConfigError(
            f"Trainer(gradient_clip_val={trainer_value!r}) and clip_gradients(gradient_clip_val={value!r}) disagree; "
            "set clipping in one place only."
        )
    if algorithm is None:
        algorithm = trainer_algorithm or "norm"
    elif trainer_algorithm is not None and trainer_algorithm != algorithm:
        raise TandemConfigError(
            f"Trainer(gradient_clip_algorithm={trainer_algorithm!r}) and clip_gradients(gradient_clip_algorithm="
            f"{algorithm!r}) disagree; set clipping in one place only."
        )
    if algorithm not in CLIP_ALGORITHMS:
        raise bad_choice("gradient_clip_algorithm", algorithm, CLIP_ALGORITHMS)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise TandemConfigError(f"gradient_clip_val={value!r} must be a number >= 0.")
    return float(value), algorithm
