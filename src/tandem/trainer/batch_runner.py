"""One training batch: the batch runner (the batch on its device, the batch hooks and publishing around the
optimization's ``run``), a ``training_step(self, dataloader_iter)``'s step, and the rollback past a bad batch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from tandem.trainer.dataloader_iter import DataLoaderIter
from tandem.trainer.nonfinite import loss_is_finite
from tandem.trainer.rollback import skipping
from tandem.trainer.training_data import TrainingData
from tandem.utilities.data import is_empty_batch
from tandem.utilities.exceptions import empty_batch
from tandem.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from tandem.trainer.rollback import RollbackGuard


class BatchRunner(TrainingData):
    """One training batch, around the optimization's ``run`` (a base of ``FitLoop``)."""

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

    def _found_empty_batch(self, batch_idx: int) -> None:
        """Training batch ``batch_idx`` held no samples and was trained on. With one process that is an error now;
        with several, every rank must stop together: the finding travels with the next publishing step's reduction,
        or the epoch end's reduction, and all ranks raise there (no collective of its own)."""
        strategy, loop = self.context.strategy, self.state
        if strategy.world_size == 1:
            raise empty_batch([(0, loop.epoch, batch_idx)], several=False)
        if self.empty_batch is None:
            self.empty_batch = (strategy.global_rank, loop.epoch, batch_idx)


def _ends_epoch(returned: Any) -> bool:
    """``on_train_batch_start`` returned -1 (an int: a tensor is not compared)."""
    return type(returned) is int and returned == -1
