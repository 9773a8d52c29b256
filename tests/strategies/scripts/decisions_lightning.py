"""The ``decisions`` scenario of ``ddp_trainer_runs.py`` on Lightning, to record what Lightning keeps (not run by the
suite; tandem never imports Lightning). Two CPU processes (gloo); prints rank 0's results as JSON:

    cd /tmp && OMP_NUM_THREADS=1 /root/lightning_suite_work/lvenv/bin/python \
        /work/wt-b/tests/strategies/scripts/decisions_lightning.py /tmp/decisions_lightning

Only what the checkpoint and stopping decisions read matters (the values logged, without sync_dist, at each
training epoch's end); the model is Lightning's BoringModel.
"""

import json
import os
import sys

import lightning.pytorch as L
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

RANK0 = (5.0, 4.0, 4.5, 4.6, 4.7, 4.8, 4.9, 5.0)  # as RankScore in ddp_trainer_runs.py


class RankScore(BoringModel):
    def on_train_epoch_end(self) -> None:
        epoch, rank = self.current_epoch, self.trainer.global_rank
        self.log("score", RANK0[epoch] if rank == 0 else 3.0 - 0.25 * epoch)
        self.log("drift", 5.0 - epoch if rank == 0 else 1.0 + epoch)


if __name__ == "__main__":
    folder = sys.argv[1]
    score = ModelCheckpoint(dirpath=folder, monitor="score", mode="min", save_top_k=2, filename="{epoch}-{score:.2f}")
    drift = ModelCheckpoint(
        dirpath=os.path.join(folder, "drift"), monitor="drift", save_top_k=2, filename="{epoch}-{drift:.2f}"
    )
    stopping = EarlyStopping("score", patience=2, mode="min")
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=8,
        callbacks=[score, drift, stopping],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_train_batches=2,
        limit_val_batches=0,
    )
    trainer.fit(RankScore())
    if trainer.global_rank == 0:
        print(
            json.dumps(
                {
                    "epochs": trainer.current_epoch,
                    "stopped_epoch": stopping.stopped_epoch,
                    "files": sorted(n for n in os.listdir(folder) if n.endswith(".ckpt")),
                    "drift_files": sorted(os.listdir(os.path.join(folder, "drift"))),
                    "best": [os.path.basename(c.best_model_path) for c in (score, drift)],
                    "best_score": [repr(c.best_model_score) for c in (score, drift)],
                    "best_k": [
                        {os.path.basename(k): repr(v) for k, v in c.best_k_models.items()} for c in (score, drift)
                    ],
                    "kth": [repr(c.kth_value) for c in (score, drift)],
                }
            )
        )
