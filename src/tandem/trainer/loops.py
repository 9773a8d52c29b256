"""The loops: fit (epochs), one training epoch, one optimization step, and evaluation.

Each function does one level of work and reads the Trainer's state; none knows which strategy runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from tandem.trainer.logging import to_float
from tandem.trainer.state import EVAL_STAGES
from tandem.utilities.data import find_sampler
from tandem.utilities.exceptions import TandemUserCodeError
from tandem.utilities.rank_zero import rank_zero_warn
from tandem.utilities.seed import capture_rng_state, restore_rng_state

if TYPE_CHECKING:
    from tandem.trainer.trainer import Trainer


def run_fit(trainer: Trainer) -> None:
    """Sanity check, then epochs until max_epochs, max_steps or should_stop."""
    if trainer.val_dataloaders is not None and trainer._config.num_sanity_val_steps != 0:
        run_evaluation(trainer, "validate", sanity=True)
    trainer._call("on_train_start")
    while not _fit_done(trainer):
        run_training_epoch(trainer)
    trainer._call("on_train_end")


def _fit_done(trainer: Trainer) -> bool:
    return (
        trainer.should_stop
        or trainer.current_epoch >= trainer._config.epoch_limit
        or 0 <= trainer.max_steps <= trainer.global_step
    )


def run_training_epoch(trainer: Trainer) -> None:
    progress, metrics, module = trainer._progress, trainer._metrics, trainer.strategy.module
    metrics.stage = trainer.state.stage = "train"
    metrics.reset(trainer._resume_train_metrics)
    trainer._resume_train_metrics = None
    sampler = find_sampler(trainer.train_dataloader) if trainer.train_dataloader is not None else None
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(progress.epoch)
    if trainer._resume_rng is not None and progress.batches_done == 0:  # resumed at an epoch boundary
        restore_rng_state(trainer._resume_rng)
        trainer._resume_rng = None
    module.train()
    trainer._call("on_train_epoch_start")
    batches = _epoch_batches(trainer)
    n = trainer.num_training_batches
    val_every = _val_check_batches(trainer)
    max_steps, one_process = trainer.max_steps, trainer.world_size == 1
    for batch_idx, batch in enumerate(batches, start=progress.batches_done):
        if batch_idx >= n:
            break
        run_training_batch(trainer, batch, batch_idx)
        if val_every and (batch_idx + 1) % val_every == 0 and batch_idx + 1 < n and _val_due_this_epoch(trainer):
            run_evaluation(trainer, "validate")
            metrics.stage = trainer.state.stage = "train"
        if 0 <= max_steps <= progress.global_step or trainer.should_stop and one_process:
            break  # with several processes, should_stop is agreed on at the end of the epoch (below)
    progress.epoch_finished = True
    metrics.stage = trainer.state.stage = "train"
    train_epoch_metrics = metrics.epoch_metrics()
    if _val_due_this_epoch(trainer):
        run_evaluation(trainer, "validate")
        metrics.stage = trainer.state.stage = "train"
    trainer._step_schedulers("epoch")
    trainer._call("on_train_epoch_end")
    # One rank asking to stop stops them all: a rank that left the loop alone would hang the others.
    trainer.should_stop = trainer.strategy.reduce_boolean_decision(trainer.should_stop, all=False)
    train_epoch_metrics.update(metrics.epoch_metrics())  # values logged in on_train_epoch_end hooks
    trainer.log_metrics({**train_epoch_metrics, "epoch": progress.epoch})
    for logger in trainer.loggers:
        logger.save()
    progress.epoch += 1
    progress.batches_done, progress.epoch_finished, progress.epoch_start_rng = 0, False, None


def _epoch_batches(trainer: Trainer) -> Iterator[Any]:
    """The epoch's batches. A mid-epoch resume replays the order from the epoch's recorded RNG state and
    skips the done batches' indices without loading them."""
    progress, loader = trainer._progress, trainer.train_dataloader
    skip = progress.batches_done
    if not skip:
        progress.epoch_start_rng = capture_rng_state()
        return iter(loader)
    skippable = trainer._train_skippable
    if skippable is None:
        rank_zero_warn(
            f"Resuming in the middle of an epoch from a dataloader that cannot skip ahead (an iterable dataset "
            f"or a custom loader): tandem reads and discards its first {skip} batches to continue where the "
            "checkpoint stopped. The order matches only if the dataset yields the same sequence each time."
        )
        iterator = iter(loader)
        for _ in range(skip):
            next(iterator, None)
    else:
        if progress.epoch_start_rng is not None:
            restore_rng_state(progress.epoch_start_rng)
        skippable.skip = skip
        iterator = iter(loader)
        skippable.start()  # draw the epoch's order now, before the checkpoint's RNG state returns
    if trainer._resume_rng is not None:
        restore_rng_state(trainer._resume_rng)
        trainer._resume_rng = None
    return iterator


def _val_check_batches(trainer: Trainer) -> int:
    interval, n = trainer._config.val_check_interval, trainer.num_training_batches
    if isinstance(interval, int):
        return interval
    if n == math.inf:
        return 0  # an unsized epoch is validated at its end
    return max(1, int(n * interval))


def _val_due_this_epoch(trainer: Trainer) -> bool:
    every = trainer._config.check_val_every_n_epoch
    return (
        trainer.val_dataloaders is not None
        and trainer.num_val_batches > 0
        and (every is None or (trainer.current_epoch + 1) % every == 0)
    )


def run_training_batch(trainer: Trainer, batch: Any, batch_idx: int) -> None:
    """Forward and backward for one micro-batch; an optimizer step every ``accumulate_grad_batches``.

    This is the per-step hot path: hooks nobody registered are not dispatched, and nothing here waits
    for the device (no ``.item()``) unless a logger needs values at this step.
    """
    strategy, metrics, hooks = trainer.strategy, trainer._metrics, trainer._hooks
    batch = strategy.batch_to_device(batch)
    metrics.set_batch(batch)
    if hooks["on_train_batch_start"]:
        trainer._call("on_train_batch_start", batch, batch_idx)
    k = trainer.accumulate_grad_batches
    stepping = k == 1 or (batch_idx + 1) % k == 0 or batch_idx + 1 == trainer.num_training_batches
    if stepping:
        output, loss = _forward_backward(trainer, batch, batch_idx, k)
    else:  # an accumulation micro-step: gradients stay local (DDP skips its all-reduce)
        with strategy.no_backward_sync(strategy.model, enabled=True):
            output, loss = _forward_backward(trainer, batch, batch_idx, k)
    if stepping and trainer._has_gradients:
        run_optimizer_step(trainer)
        # publishing step: loggers get the step values, sync_dist ones reduced across processes first
        if trainer.global_step % trainer.log_every_n_steps == 0 and (trainer.loggers or trainer.world_size > 1):
            trainer.log_metrics(metrics.step_metrics())
    trainer._progress.batches_done = batch_idx + 1
    if hooks["on_train_batch_end"]:
        trainer._call("on_train_batch_end", _detached_outputs(output, loss), batch, batch_idx)


def _forward_backward(trainer: Trainer, batch: Any, batch_idx: int, k: int) -> tuple[Any, torch.Tensor | None]:
    trainer._metrics.hook = "training_step"
    output = trainer.strategy.run_step("training_step", batch, batch_idx)
    loss = _loss_from(output)
    if loss is not None:
        trainer._call("on_before_backward", loss)
        trainer.strategy.backward(loss / k if k > 1 else loss)
        trainer._call("on_after_backward")
        trainer._has_gradients = True
    return output, loss


def run_optimizer_step(trainer: Trainer) -> None:
    strategy, optimizer, config = trainer.strategy, trainer._optimizer, trainer._config
    strategy.unscale_gradients(optimizer)
    trainer._call("on_before_optimizer_step", optimizer)
    if config.gradient_clip_val is not None:
        strategy.clip_gradients(optimizer, config.gradient_clip_val, config.gradient_clip_algorithm)
    stepped = strategy.optimizer_step(optimizer)
    trainer._call("on_before_zero_grad", optimizer)
    optimizer.zero_grad(set_to_none=True)
    trainer._has_gradients = False
    trainer._progress.global_step += 1
    if stepped and trainer._lr_scheduler_configs:  # a step skipped by the float16 scaler does not count
        trainer._step_schedulers("step")


def _loss_from(output: Any) -> torch.Tensor | None:
    if output is None:
        return None
    loss = output.get("loss") if isinstance(output, Mapping) else output
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


def _detached_outputs(output: Any, loss: torch.Tensor | None) -> Any:
    if loss is None:
        return None
    if isinstance(output, Mapping):
        return {**output, "loss": loss.detach()}
    return {"loss": loss.detach()}


def run_evaluation(trainer: Trainer, stage: str, sanity: bool = False) -> Any:
    """One pass over the validation, test or predict data. Returns epoch metrics, or predictions."""
    strategy, metrics = trainer.strategy, trainer._metrics
    names = EVAL_STAGES[stage]
    loader = getattr(trainer, names.loaders_attr)
    n = trainer.num_sanity_val_steps if sanity else getattr(trainer, names.count_attr)
    name = names.name
    module = strategy.module
    was_training = module.training
    module.eval()
    metrics.stage = stage
    trainer.state.stage = "sanity_check" if sanity else stage
    metrics.reset()
    if sanity:
        trainer._call("on_sanity_check_start")
    trainer._call(f"on_{name}_start")
    trainer._call(f"on_{name}_epoch_start")
    predictions: list[Any] = []
    with torch.no_grad():
        for batch_idx, batch in enumerate(strategy.evaluation_batches(loader, n)):
            batch = strategy.batch_to_device(batch)
            metrics.set_batch(batch)
            trainer._call(f"on_{name}_batch_start", batch, batch_idx)
            metrics.hook = f"{name}_step"
            output = strategy.run_step(f"{name}_step", batch, batch_idx)
            if stage == "predict":
                predictions.append(output)
            trainer._call(f"on_{name}_batch_end", output, batch, batch_idx)
    trainer._call(f"on_{name}_epoch_end")
    epoch_metrics = metrics.epoch_metrics() if stage != "predict" else {}
    trainer._call(f"on_{name}_end")
    if sanity:
        trainer._call("on_sanity_check_end")
        metrics.clear_published()
    elif epoch_metrics:
        trainer.log_metrics(epoch_metrics)
    module.train(was_training)
    if stage == "predict":
        return strategy.gather_predictions(predictions, loader)
    return to_float(metrics.stage_values())
