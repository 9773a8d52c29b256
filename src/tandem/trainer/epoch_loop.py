"""One training epoch: its batches through the batch runner, validation within it and at its end
(``val_check_interval`` counted or timed, ``check_val_every_n_epoch``), the schedulers' epoch moments, and the
epoch end's agreement across processes (a stop, non-finite parameters, an empty batch)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import torch

from tandem.strategies.side_channel import preemption_vote
from tandem.trainer.batch_runner import BatchRunner
from tandem.trainer.combined_batches import TrainingBatches
from tandem.trainer.dataloader_iter import DataLoaderIter, training_source
from tandem.trainer.evaluation import call_module_hook
from tandem.trainer.nonfinite import nonfinite_parameters
from tandem.trainer.validation_clock import ValidationClock
from tandem.utilities.data import find_sampler
from tandem.utilities.exceptions import empty_batch
from tandem.utilities.preemption import PREEMPTION
from tandem.utilities.seed import restore_rng_state


class TrainingEpochLoop(BatchRunner):
    """One training epoch, and the rules the epoch and the fit share (a base of ``FitLoop``)."""

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

    def _val_check_batches(self) -> int:
        interval, n = self.context.config.val_check_interval, self.data.num_batches[0]
        if self.clock is not None or not isinstance(interval, (int, float)):  # time-based: every batch asks the clock
            return 1
        if isinstance(interval, int):
            return interval
        if n == math.inf:
            return 0  # an unsized epoch is validated at its end
        return max(1, int(n * interval))


def validates_only_at_epoch_ends(
    check_val_every_n_epoch: int | None, val_check_interval: int | float, val_batches: int | float
) -> bool:
    """See ``FitLoop.validates_only_at_epoch_ends`` (Lightning's ``ModelCheckpoint`` rule)."""
    if check_val_every_n_epoch != 1:
        return False
    return val_batches == 0 or val_check_interval == 1.0
