"""The training loops: fit (epochs) -> one epoch -> one batch -> the optimizer step.

Each function does one level of work. They read the Trainer's loop state (``trainer._loop``, a
:class:`~tandem.trainer.state.LoopState`), its data records and its :class:`~tandem.trainer.optim.Optimization`;
none knows which strategy runs. How a batch is trained is chosen once per fit (:func:`batch_runner`):
automatic optimization, automatic with the module's own ``optimizer_step``, or manual optimization.
Evaluation is in :mod:`tandem.trainer.evaluation`.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from tandem.trainer import preemption
from tandem.trainer.evaluation import run_evaluation
from tandem.trainer.nonfinite import loss_is_finite, nonfinite_parameters
from tandem.trainer.optim import TrainingOptimizer
from tandem.utilities.data import find_sampler, has_len
from tandem.utilities.exceptions import TandemUserCodeError, missing_metric
from tandem.utilities.preemption import PREEMPTION
from tandem.utilities.rank_zero import rank_zero_warn
from tandem.utilities.seed import capture_rng_state, restore_rng_state

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from tandem.trainer.trainer import Trainer

BatchRunner = Callable[["Trainer", Any, int], None]


def run_fit(trainer: Trainer) -> None:
    """Sanity check, then epochs until max_epochs, max_steps or should_stop."""
    if trainer._val.loaders and trainer._config.num_sanity_val_steps != 0:
        run_evaluation(trainer, "validate", sanity=True)
    run_batch = batch_runner(trainer)
    trainer._call("on_train_start")
    while not _fit_done(trainer):
        run_training_epoch(trainer, run_batch)
        if PREEMPTION.signum is not None and not _fit_done(trainer) and preemption.stop_here(trainer, epoch_end=True):
            preemption.stop(trainer)
    trainer._call("on_train_end")


def batch_runner(trainer: Trainer) -> BatchRunner:
    """How this fit trains a batch, decided once (the per-step path asks nothing)."""
    optimization = trainer._optimization
    if not optimization.automatic:
        return run_manual_batch
    return run_training_batch if optimization.optimizer_step is None else run_training_batch_with_closure


def wrap_optimizers(trainer: Trainer) -> list[TrainingOptimizer]:
    """The optimizers as ``self.optimizers()`` returns them: their ``step()`` is the loop's."""
    step = _manual_step if not trainer._optimization.automatic else _closure_step
    return [TrainingOptimizer(o, _bind(step, trainer)) for o in trainer._optimization.optimizers]


def _fit_done(trainer: Trainer) -> bool:
    loop = trainer._loop
    return (
        (trainer.should_stop and _min_reached(trainer))
        or loop.epoch >= trainer._config.epoch_limit
        or 0 <= trainer.max_steps <= loop.global_step
    )


def _min_reached(trainer: Trainer) -> bool:
    """``min_epochs`` / ``min_steps`` are met, so ``should_stop`` may end the fit."""
    config, loop = trainer._config, trainer._loop
    return loop.epoch >= (config.min_epochs or 0) and loop.global_step >= (config.min_steps or 0)


def run_training_epoch(trainer: Trainer, run_batch: BatchRunner) -> None:
    loop, metrics, module = trainer._loop, trainer._metrics, trainer.strategy.module
    metrics.stage = trainer.state.stage = "train"
    metrics.reset(loop.resume_train_metrics)
    loop.resume_train_metrics = None
    loader = trainer._train.loaders[0]
    sampler = find_sampler(loader) if isinstance(loader, torch.utils.data.DataLoader) else None
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(loop.epoch)
    if loop.resume_rng is not None and loop.batches_done == 0:  # resumed at an epoch boundary
        restore_rng_state(loop.resume_rng)
        loop.resume_rng = None
    module.train()
    trainer._call("on_train_epoch_start")
    batches = _epoch_batches(trainer)
    n = loop.epoch_batches = trainer._train.num_batches[0]
    lockstep = trainer.strategy.steps_in_lockstep  # several processes: only here is there a collective per step
    if (lockstep or trainer._config.accumulate_grad_batches > 1) and not has_len(loader):
        batches = _agreed_batches(trainer, batches, n)
    val_every = _val_check_batches(trainer)
    max_steps, one_process = trainer.max_steps, trainer.world_size == 1
    for batch_idx, batch in enumerate(batches, start=loop.batches_done):
        if batch_idx >= n:
            break
        run_batch(trainer, batch, batch_idx)
        # not after the epoch's last batch (known there in an evened epoch too): the epoch-end validation follows
        due = val_every and (batch_idx + 1) % val_every == 0 and batch_idx + 1 < loop.epoch_batches
        if due and _val_due_this_epoch(trainer):
            run_evaluation(trainer, "validate")
            metrics.stage = trainer.state.stage = "train"
        if PREEMPTION.signum is not None and preemption.stop_here(trainer):  # a signal: one read per batch
            preemption.stop(trainer)
        if 0 <= max_steps <= loop.global_step or trainer.should_stop and one_process and _min_reached(trainer):
            break  # with several processes, should_stop is agreed on at the end of the epoch (below)
    loop.epoch_finished = True
    metrics.stage = trainer.state.stage = "train"
    train_epoch_metrics = metrics.epoch_metrics()
    if _val_due_this_epoch(trainer):
        run_evaluation(trainer, "validate")
        metrics.stage = trainer.state.stage = "train"
    if trainer._optimization.automatic:  # under manual optimization the module steps its schedulers
        step_schedulers(trainer, "epoch")
    trainer._call("on_train_epoch_end")
    # One reduction, two agreements: one rank asking to stop stops them all (a rank that left the loop alone
    # would hang the others), and NaN / inf in any rank's parameters is acted on by every rank.
    nonfinite = nonfinite_parameters(module)
    stop, anywhere = trainer.strategy.reduce(torch.tensor([int(trainer.should_stop), int(bool(nonfinite))]), "sum")
    trainer.should_stop = bool(stop > 0)
    trainer._nonfinite.check_epoch_end(trainer, nonfinite, bool(anywhere > 0))
    train_epoch_metrics.update(metrics.epoch_metrics())  # values logged in on_train_epoch_end hooks
    trainer.log_metrics({**train_epoch_metrics, "epoch": loop.epoch})
    for logger in trainer.loggers:
        logger.save()
    # one statement: the collective guard's thread reads these (pre-emption) and must not see half of it
    loop.epoch, loop.batches_done, loop.epoch_finished, loop.epoch_start_rng = loop.epoch + 1, 0, False, None


def _epoch_batches(trainer: Trainer) -> Iterator[Any]:
    """The epoch's batches. A mid-epoch resume replays the order from the epoch's recorded RNG state and
    skips the done batches' indices without loading them."""
    loop, loader = trainer._loop, trainer._train.loaders[0]
    skip = loop.batches_done
    if not skip:
        loop.epoch_start_rng = capture_rng_state()
        return iter(loader)
    skippable = trainer._train.skippable
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
        if loop.epoch_start_rng is not None:
            restore_rng_state(loop.epoch_start_rng)
        skippable.skip = skip
        iterator = iter(loader)
        skippable.start()  # draw the epoch's order now, before the checkpoint's RNG state returns
    if loop.resume_rng is not None:
        restore_rng_state(loop.resume_rng)
        loop.resume_rng = None
    return iterator


_END = object()


def _agreed_batches(trainer: Trainer, batches: Iterator[Any], limit: int | float) -> Iterator[Any]:
    """An epoch of unknown length, read a batch ahead so that the loop knows its last batch (an accumulation
    window cut short steps there, as in Lightning). When the steps are collectives (several processes), the
    ranks agree on each batch that every one of them has it (one small all-reduce; one process asks nobody),
    so every rank ends the epoch at the same batch, at the same ``global_step``. A rank's batches beyond the
    first one another rank lacks are not trained on."""
    loop, strategy = trainer._loop, trainer.strategy

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
    batch = agreed(index)
    while batch is not _END:
        following = agreed(index + 1)
        if following is _END:
            loop.epoch_batches = index + 1  # the last batch of the epoch, on every rank
        yield batch
        batch, index = following, index + 1


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


def _val_check_batches(trainer: Trainer) -> int:
    interval, n = trainer._config.val_check_interval, trainer._train.num_batches[0]
    if isinstance(interval, int):
        return interval
    if n == math.inf:
        return 0  # an unsized epoch is validated at its end
    return max(1, int(n * interval))


def _val_due_this_epoch(trainer: Trainer) -> bool:
    every = trainer._config.check_val_every_n_epoch
    return trainer._val.total_batches > 0 and (every is None or (trainer._loop.epoch + 1) % every == 0)


# ---------------------------------------------------------------------- one batch: automatic optimization
def run_training_batch(trainer: Trainer, batch: Any, batch_idx: int) -> None:
    """Forward and backward for one micro-batch; an optimizer step every ``accumulate_grad_batches``.

    This is the per-step hot path: hooks nobody registered are not dispatched, and nothing here waits
    for the device (no ``.item()``) unless a logger needs values at this step.
    """
    strategy, metrics, hooks, transfer = trainer.strategy, trainer._metrics, trainer._hooks, trainer._batch_transfer
    batch = strategy.batch_to_device(batch) if transfer is None else transfer(batch, 0)
    metrics.set_batch(batch)
    if hooks["on_train_batch_start"]:
        trainer._call("on_train_batch_start", batch, batch_idx)
    k = trainer._config.accumulate_grad_batches
    stepping = k == 1 or (batch_idx + 1) % k == 0 or batch_idx + 1 == trainer._loop.epoch_batches
    if stepping:
        output, loss = _forward_backward(trainer, batch, batch_idx, k)
    else:  # an accumulation micro-step: gradients stay local (DDP skips its all-reduce)
        with strategy.no_backward_sync(strategy.model, enabled=True):
            output, loss = _forward_backward(trainer, batch, batch_idx, k)
    if stepping and trainer._optimization.has_gradients:
        optimizer = trainer._optimization.optimizers[0]
        _prepare_step(trainer, optimizer)
        stepped = strategy.optimizer_step(optimizer)
        _finish_step(trainer, optimizer, batch_idx, stepped, loss)
    trainer._loop.batches_done = batch_idx + 1
    if hooks["on_train_batch_end"]:
        trainer._call("on_train_batch_end", _detached_outputs(output, loss), batch, batch_idx)


def run_training_batch_with_closure(trainer: Trainer, batch: Any, batch_idx: int) -> None:
    """Automatic optimization through the module's ``optimizer_step(epoch, batch_idx, optimizer, closure)``
    override: on stepping batches the forward and backward run inside the closure the override passes to
    ``optimizer.step``, as in Lightning (so warm-up code around the step sees each step)."""
    strategy, hooks, optimization = trainer.strategy, trainer._hooks, trainer._optimization
    transfer = trainer._batch_transfer
    batch = strategy.batch_to_device(batch) if transfer is None else transfer(batch, 0)
    trainer._metrics.set_batch(batch)
    if hooks["on_train_batch_start"]:
        trainer._call("on_train_batch_start", batch, batch_idx)
    k = trainer._config.accumulate_grad_batches
    if not (k == 1 or (batch_idx + 1) % k == 0 or batch_idx + 1 == trainer._loop.epoch_batches):
        with strategy.no_backward_sync(strategy.model, enabled=True):
            output, loss = _forward_backward(trainer, batch, batch_idx, k)
    else:
        result: list[tuple[Any, torch.Tensor | None]] = []

        def closure() -> torch.Tensor | None:
            result.append(_forward_backward(trainer, batch, batch_idx, k))
            return result[-1][1]

        optimizer = optimization.wrapped[0]
        optimization.last_step_taken = False
        optimization.optimizer_step(trainer._loop.epoch, batch_idx, optimizer, closure)
        if not result:
            raise TandemUserCodeError(
                f"{type(strategy.module).__name__}.optimizer_step did not run the closure, so training_step and "
                "backward never ran. Call optimizer.step(closure=optimizer_closure) in your override."
            )
        output, loss = result[-1]
        _finish_step(trainer, optimizer.optimizer, batch_idx, optimization.last_step_taken, loss)
    trainer._loop.batches_done = batch_idx + 1
    if hooks["on_train_batch_end"]:
        trainer._call("on_train_batch_end", _detached_outputs(output, loss), batch, batch_idx)


def _forward_backward(trainer: Trainer, batch: Any, batch_idx: int, k: int) -> tuple[Any, torch.Tensor | None]:
    trainer._metrics.hook = "training_step"
    if trainer._step_takes_batch_idx:
        output = trainer.strategy.run_step("training_step", batch, batch_idx)
    else:
        output = trainer.strategy.run_step("training_step", batch)
    loss = _loss_from(output)
    if loss is not None:
        hooks = trainer._hooks  # hooks nobody overrides are not even called (the per-step path)
        if hooks["on_before_backward"]:
            trainer._call("on_before_backward", loss)
        trainer.strategy.backward(loss / k if k > 1 else loss)
        if hooks["on_after_backward"]:
            trainer._call("on_after_backward")
        trainer._optimization.has_gradients = True
    return output, loss


def _prepare_step(trainer: Trainer, optimizer: Optimizer) -> None:
    """Between backward and the step: unscale float16 gradients, the hook, clipping (automatic)."""
    trainer.strategy.unscale_gradients(optimizer)
    if trainer._hooks["on_before_optimizer_step"]:
        trainer._call("on_before_optimizer_step", optimizer)
    clip = trainer._optimization.clip
    if clip is not None:
        clip(optimizer)


def _finish_step(
    trainer: Trainer, optimizer: Optimizer, batch_idx: int, stepped: bool, loss: torch.Tensor | None
) -> None:
    """After an automatic step: clear the gradients, count the step, step the per-step schedulers, and
    publish the step's logged values when a logger wants them (``loss`` is checked for NaN / inf then)."""
    optimization, loop = trainer._optimization, trainer._loop
    if trainer._hooks["on_before_zero_grad"]:
        trainer._call("on_before_zero_grad", optimizer)
    if optimization.zero_grad is None:
        optimizer.zero_grad(set_to_none=True)
    else:
        optimization.zero_grad(loop.epoch, batch_idx, optimizer)
    optimization.has_gradients = False
    loop.global_step += 1  # after the module's optimizer_step returned, as in Lightning
    loop.batches_stepped += 1
    if stepped and optimization.lr_scheduler_configs:  # a step skipped by the float16 scaler does not count
        step_schedulers(trainer, "step")
    _publish_step(trainer, loss)


def _publish_step(trainer: Trainer, loss: torch.Tensor | None) -> None:
    """Every ``log_every_n_steps`` stepping batches: loggers get the step values, sync_dist ones reduced first.
    The step's loss is read then too, and the processes' verdicts on it travel with that reduction."""
    if trainer._loop.batches_stepped % trainer._config.log_every_n_steps == 0 and (
        trainer.loggers or trainer.world_size > 1
    ):
        values, finite = trainer._metrics.step_metrics(loss_is_finite(loss))
        trainer.log_metrics(values)
        trainer._nonfinite.check_loss(trainer, finite, values)


def step_schedulers(trainer: Trainer, interval: str) -> None:
    """Step the schedulers of ``interval`` ("step" or "epoch") that are due (automatic optimization), through
    the module's ``lr_scheduler_step``; a ``reduce_on_plateau`` one gets rank 0's value of its monitor."""
    count = trainer._loop.global_step if interval == "step" else trainer._loop.epoch + 1
    module, metrics = trainer.strategy.module, trainer.callback_metrics
    for config in trainer._optimization.lr_scheduler_configs:
        if config.interval != interval or count % config.frequency:
            continue
        metric = None
        if config.reduce_on_plateau:
            value = metrics.get(config.monitor)
            if value is None:
                if config.strict:
                    raise missing_metric("The lr_scheduler config", config.monitor, metrics)
                rank_zero_warn(f"lr_scheduler monitor {config.monitor!r} was not logged; the scheduler did not step.")
                continue
            metric = trainer.strategy.broadcast(float(value))  # rank 0's value: equal LRs
        module.lr_scheduler_step(config.scheduler, metric)


def _closure_step(trainer: Trainer, optimizer: Optimizer, closure: Callable[[], Any] | None, **kwargs: Any) -> None:
    """``optimizer.step(closure)`` inside the module's ``optimizer_step`` override (automatic; the step is
    counted when the override returns)."""

    def run_closure() -> Any:
        result = closure() if closure is not None else None
        _prepare_step(trainer, optimizer)
        return result

    trainer._optimization.last_step_taken = trainer.strategy.optimizer_step(optimizer, run_closure, **kwargs)


# ---------------------------------------------------------------------- one batch: manual optimization
def run_manual_batch(trainer: Trainer, batch: Any, batch_idx: int) -> None:
    """``training_step`` does the backward and the steps (``self.manual_backward``, ``opt.step()``); each
    step counts toward ``global_step``. The loggers' step counts batches, as in Lightning."""
    hooks, loop, transfer = trainer._hooks, trainer._loop, trainer._batch_transfer
    batch = trainer.strategy.batch_to_device(batch) if transfer is None else transfer(batch, 0)
    trainer._metrics.set_batch(batch)
    if hooks["on_train_batch_start"]:
        trainer._call("on_train_batch_start", batch, batch_idx)
    trainer._metrics.hook = "training_step"
    step_args = (batch, batch_idx) if trainer._step_takes_batch_idx else (batch,)
    output = trainer.strategy.run_step("training_step", *step_args)
    loop.batches_stepped += 1
    _publish_step(trainer, _manual_loss(output))
    loop.batches_done = batch_idx + 1
    if hooks["on_train_batch_end"]:
        trainer._call("on_train_batch_end", _manual_outputs(output), batch, batch_idx)


def _manual_step(trainer: Trainer, optimizer: Optimizer, closure: Callable[[], Any] | None, **kwargs: Any) -> None:
    """``opt.step()`` in a manual ``training_step``: through the strategy's precision, then counted."""

    def prepare() -> None:
        trainer.strategy.unscale_gradients(optimizer)
        trainer._call("on_before_optimizer_step", optimizer)

    def run_closure() -> Any:  # a closure of the user's (e.g. LBFGS), which the optimizer may call again
        with torch.enable_grad():
            result = closure()
        prepare()
        return result

    if closure is None:
        prepare()
        trainer.strategy.optimizer_step(optimizer, **kwargs)
    else:
        trainer.strategy.optimizer_step(optimizer, run_closure, **kwargs)
    trainer._loop.global_step += 1


def _bind(step: Callable[..., None], trainer: Trainer) -> Callable[..., None]:
    # The Trainer holds these optimizers: a strong reference back would be a cycle keeping a finished fit alive.
    trainer_ref = weakref.ref(trainer)

    def bound(optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any) -> None:
        trainer = trainer_ref()
        if trainer is None:
            raise RuntimeError("optimizer.step(): the Trainer that wrapped this optimizer no longer exists.")
        step(trainer, optimizer, closure, **kwargs)

    return bound


# ---------------------------------------------------------------------- what training_step returned
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


def _manual_loss(output: Any) -> torch.Tensor | None:
    """The loss a manual ``training_step`` returned (a tensor, or a dict's ``"loss"``), if any."""
    loss = output.get("loss") if isinstance(output, Mapping) else output
    return loss if isinstance(loss, torch.Tensor) else None


def _manual_outputs(output: Any) -> Any:
    """Under manual optimization ``training_step`` may return nothing, a tensor or a dict (Lightning's rule)."""
    if output is None:
        return None
    if isinstance(output, torch.Tensor):
        return {"loss": output.detach()}
    if isinstance(output, Mapping):
        loss = output.get("loss")
        return {**output, "loss": loss.detach()} if isinstance(loss, torch.Tensor) else dict(output)
    raise TandemUserCodeError(
        f"training_step returned {type(output).__name__}; under manual optimization it returns nothing, a tensor "
        "or a dict."
    )
