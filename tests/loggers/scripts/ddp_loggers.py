"""A fit under ``Trainer(strategy="ddp", devices=2, accelerator="cpu")`` logging to MLflow (a file store in
``<out>/mlruns``) and W&B (offline, in ``<out>``) at once, with ModelCheckpoint and ``log_model="all"``. Run as a
script: it starts rank 1 by re-running itself. Each rank writes what its loggers say their run is to
``<out>/rank<r>.json``; ``tests/loggers/test_ddp_loggers.py`` reads those and the two stores."""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import tandem  # noqa: E402
from helpers import TinyModule, loader  # noqa: E402
from tandem.callbacks import ModelCheckpoint  # noqa: E402
from tandem.loggers import MLFlowLogger, WandbLogger  # noqa: E402

if __name__ == "__main__":
    out = sys.argv[1]
    mlflow_logger = MLFlowLogger(experiment_name="ddp", save_dir=os.path.join(out, "mlruns"), log_model="all")
    wandb_logger = WandbLogger(project="ddp", save_dir=out, log_model="all")
    checkpoint = ModelCheckpoint(save_top_k=-1)
    trainer = tandem.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        log_every_n_steps=1,
        logger=[mlflow_logger, wandb_logger],
        callbacks=[checkpoint],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(TinyModule(), loader(), loader(32))
    seen = {
        "mlflow": mlflow_logger.version,
        "wandb": wandb_logger.version,
        "log_dir": trainer.log_dir,
        "dirpath": checkpoint.dirpath,
        # without a monitor no scores are kept (best_k_models stays empty, as Lightning's): the files kept
        "checkpoints": sorted(p for p in os.listdir(checkpoint.dirpath) if p.endswith(".ckpt")),
    }
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w", encoding="utf-8") as f:
        json.dump(seen, f)
    if trainer.is_global_zero:
        import wandb

        wandb_logger.experiment.finish()
        wandb.teardown()  # the run's last records are in its file once the service stopped
