"""``configure_optimization``: the fit's optimization object, built from the module's ``configure_optimizers`` and
overrides."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch.optim import Optimizer

from tandem.module import calls_hook, changed_too_late, is_overridden
from tandem.trainer.optim import parse_optimizers
from tandem.trainer.optimization.automatic import AutomaticOptimization
from tandem.trainer.optimization.base import Optimization
from tandem.trainer.optimization.manual import ManualOptimization
from tandem.trainer.profiling import module_action, timed

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.loops import LoopContext
    from tandem.trainer.state import LoopState


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
