"""A fit under ``Trainer(strategy="ddp", devices=2, accelerator="cpu")`` whose ``ModelCheckpoint(dirpath=...)`` is
built on each rank from the time and the process id, so that the ranks compute different folders (a
``runs/{timestamp}`` dirpath does the same when the ranks start a moment apart); then ``trainer.test`` from the best
checkpoint, on every rank. Run as a script: it starts rank 1 by re-running itself. Each rank writes what it saw to
``<out>/rank<r>.json``; ``tests/callbacks/test_model_checkpoint.py`` reads them."""

from __future__ import annotations

import json
import os
import sys
import time

import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from helpers import TinyModule, loader, quiet_trainer  # noqa: E402
from tandem.callbacks import ModelCheckpoint  # noqa: E402

if __name__ == "__main__":
    out = sys.argv[1]
    given = os.path.join(out, "runs", f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    checkpoint = ModelCheckpoint(dirpath=given, monitor="val_loss")
    trainer = quiet_trainer(strategy="ddp", devices=2, max_epochs=1, enable_checkpointing=True, callbacks=[checkpoint])
    model = TinyModule()
    trainer.fit(model, loader(32), loader(32))
    (result,) = trainer.test(model, loader(32), ckpt_path="best", verbose=False)
    seen = {
        "given": given,
        "dirpath": checkpoint.dirpath,
        "best": checkpoint.best_model_path,
        "found": os.path.isfile(checkpoint.best_model_path),
        "test_loss": result["test_loss"],
    }
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w", encoding="utf-8") as f:
        json.dump(seen, f)
