"""Steps the replica groups did not commit, run again (``strategy="ddp_ft"``).

Under a strategy with replica groups (`replica_groups`) each step's data
is shared by the groups of its quorum, and a step counts only once every one of them committed it. A group that
leaves in the middle of a step (a killed process) makes the others' step fail: their ``optimizer_step`` raises
`StepNotCommitted` before the optimizer steps and before the loop counts
anything. The batch runner then runs the step again, its batch loaded again under the next quorum (the same items of
the epoch, shared by the groups that take part now): no item is lost or trained twice, and ``global_step``, the
schedulers and the loggers see the step once.

The epoch's sums the failed attempt logged (``self.log(..., on_epoch=True)``) are taken back; its hooks ran and run
again (a torchmetrics object the step updated keeps that update), and the hooks after the step
(``on_train_batch_end``) get the batch as it was loaded again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tandem.utilities.exceptions import StepNotCommitted, TandemConfigError
from tandem.utilities.signature import takes_dataloader_iter

if TYPE_CHECKING:
    from tandem.trainer.loops import LoopContext

Optimize = Callable[[Any, int], Any]


def repeating_uncommitted(optimize: Optimize, context: LoopContext, transfer: Callable[[Any], Any] | None) -> Optimize:
    """``optimize`` (the batch plan's optimization), run again with the batch loaded again for as long as the
    replica groups do not commit the step. Refuses, once per fit, what a repeated step cannot run."""
    groups, metrics = context.strategy.replica_groups, context.metrics
    assert groups is not None
    _check_repeatable(context)

    def run(batch: Any, batch_idx: int) -> Any:
        sums = metrics.epoch_sums()
        while True:
            try:
                return optimize(batch, batch_idx)
            except StepNotCommitted:
                metrics.restore_epoch_sums(sums)
                batch = groups.batch_again()
                if transfer is not None:
                    batch = transfer(batch)
                metrics.set_batch(batch)

    return run


def _check_repeatable(context: LoopContext) -> None:
    name = context.strategy.name
    accumulate = context.config.accumulate_grad_batches
    if accumulate != 1:
        raise TandemConfigError(
            f"strategy={name!r} runs a step again when a replica group leaves during it, but with "
            f"accumulate_grad_batches={accumulate} the gradients of the window's earlier batches would be lost. Use "
            "accumulate_grad_batches=1 and a larger batch (each step's global batch is NUM_REPLICA_GROUPS x "
            "processes x batch_size)."
        )
    if takes_dataloader_iter(context.module.training_step):
        raise TandemConfigError(
            f"strategy={name!r} loads a step's batch again when it runs the step again, which a "
            "training_step(self, dataloader_iter) takes itself. Take the batch as training_step(self, batch, batch_idx)."
        )
    if context.nonfinite.rollback is not None:
        raise TandemConfigError(
            f"Trainer(on_nonfinite='rollback') with strategy={name!r}: a rollback replays steps within one replica "
            "group, which the other groups do not. Use on_nonfinite='raise' or 'warn'."
        )
