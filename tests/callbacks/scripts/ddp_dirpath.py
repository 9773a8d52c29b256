"""A fit under ``Trainer(strategy="ddp", devices=2, accelerator="cpu")`` whose ``ModelCheckpoint(dirpath=...)`` is
built on each rank from the time and the process id, so that the ranks compute different folders (a
``runs/{timestamp}`` dirpath does the same when the ranks start a moment apart); then ``trainer.test`` from the best
checkpoint, on every rank. :func:`run` is the ``dirpath`` scenario of ``tests/strategies/scripts/ddp_trainer_runs.py``
(the shared launch: ``tests/conftest.py``); ``tests/callbacks/test_model_checkpoint.py`` reads what each rank saw."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from helpers import TinyModule, loader, quiet_trainer  # noqa: E402
from tandem.callbacks import ModelCheckpoint  # noqa: E402


def run(out: Path) -> dict[str, Any]:
    """This rank's dirpath (the one it built, and the one the callback uses), its best checkpoint, and the test."""
    given = os.path.join(out, "runs", f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    checkpoint = ModelCheckpoint(dirpath=given, monitor="val_loss")
    trainer = quiet_trainer(strategy="ddp", devices=2, max_epochs=1, enable_checkpointing=True, callbacks=[checkpoint])
    model = TinyModule()
    trainer.fit(model, loader(32), loader(32))
    (result,) = trainer.test(model, loader(32), ckpt_path="best", verbose=False)
    return {
        "given": given,
        "dirpath": checkpoint.dirpath,
        "best": checkpoint.best_model_path,
        "found": os.path.isfile(checkpoint.best_model_path),
        "test_loss": result["test_loss"],
    }
