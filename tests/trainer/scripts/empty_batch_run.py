"""An empty training batch on rank 1 only, under ``Trainer(strategy="ddp", devices=2, accelerator="cpu")``: every
rank must stop with the same error naming it, at the same point, without a hang. Run as a script with ``<out>
<case>`` (it starts rank 1 by re-running itself); each rank saves what it saw to ``<out>/empty-rank<r>.pt``. One
case per launch: after an error on rank 0 the launcher ends the other ranks.

    publish    found at the next publishing step (log_every_n_steps=1): in that step's gathering
    epoch_end  found after the epoch's last publishing step (log_every_n_steps=50): in the epoch end's reduction
"""

from __future__ import annotations

import faulthandler
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import manual_modules  # noqa: E402

import tandem  # noqa: E402

EMPTY_AT = 2  # the batch of epoch 0 that is empty on rank 1


class EmptyOnRankOne(tandem.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(manual_modules.FEATURES, 1)
        self.batches = 0

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.batches += 1
        if self.global_rank == 1 and self.batches == EMPTY_AT + 1:
            return [t[:0] for t in batch]  # what a collate_fn that filters every sample out would give
        return batch

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return (self.net(batch[0]) - 1.0).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run(log_every_n_steps: int) -> dict[str, Any]:
    trainer = tandem.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=1,
        limit_train_batches=4,
        log_every_n_steps=log_every_n_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(EmptyOnRankOne(), manual_modules.loader(manual_modules.BATCH))
    except Exception as error:  # noqa: BLE001 - the test checks its type and words
        return {"type": type(error).__name__, "error": str(error), "step": trainer.global_step}
    return {"type": None, "error": None, "step": trainer.global_step}


if __name__ == "__main__":
    faulthandler.dump_traceback_later(60, exit=True)  # a hang fails with its stack shown
    out, case = Path(sys.argv[1]), sys.argv[2]
    result = run({"publish": 1, "epoch_end": 50}[case])  # one failing fit per launch: rank 0's error ends it
    torch.save(result, out / f"empty-rank{dist.get_rank()}.pt")
