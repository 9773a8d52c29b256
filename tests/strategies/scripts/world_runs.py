"""tandem's DDP at more than 2 ranks: one launch of ``--devices N`` ranks (tandem's launcher, gloo) plays the scenarios
named, in order, and each rank saves what it saw to ``<out>/<scenario>-<N>-rank<r>.pt``. The module and data are
``ddp_trainer_common.py``'s (as in ``ddp_trainer_runs.py``'s elastic scenario); the global batch is 24 samples, which
1, 3, 4 and 8 ranks all divide. The test process runs ``whole`` and ``rollback`` with ``devices=1`` for its references.

    whole      2 epochs, shuffled, ``data_order="global"``, Adam: the uninterrupted run, saving
               ``elastic-<N>.ckpt`` mid-epoch 1 (after its batch 4): what the test compares with one process
    resume     ``--resume`` (a checkpoint another world size saved mid-epoch) resumed here to the end
    counts     ``benchmarks/scale.py``'s counted fit (2 epochs of 8 steps, a save): this rank's store requests and
               bytes, collectives and their bytes, per step, publishing step, epoch end and save (run with
               ``--count``, which wraps the store and the collectives before the launch's first fit)
    killed_save  (last: it ends the job) ``whole``'s fit with a checkpoint every 4 steps into ``<out>/killed/``; rank
               ``KILLED_RANK`` is SIGKILLed in ``on_save_checkpoint`` of the second save, while rank 0 writes: the
               test resumes the newest file on one process and must end as the uninterrupted run
    rollback   on_nonfinite="rollback", SGD, unshuffled: one sample of global batch 2 is NaN, so one rank's batch 2 of
               each epoch (found at a publishing step, log_every_n_steps=3): every rank rolls back past it, in step
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "benchmarks"))

import scale  # noqa: E402
from ddp_trainer_common import Net, SaveAtStep, dataset, elastic_trainer, weights  # noqa: E402

import tandem  # noqa: E402

GLOBAL_BATCH, SAMPLES = 24, 192  # 8 global batches an epoch
SAVE_STEP = 12  # mid-epoch 1: after its 4th batch
BAD_SAMPLE = 2 * GLOBAL_BATCH + GLOBAL_BATCH - 1  # the last sample of global batch 2
KILLED_RANK = 5


def _trainer(devices: int, out: Path, name: str, **kwargs: Any) -> tandem.Trainer:
    csv = out / f"csv-{name}-{devices}"
    return elastic_trainer(
        strategy=_strategy(devices), devices=devices, csv=csv, data_order="global", limit_val_batches=0, **kwargs
    )


def _strategy(devices: int) -> str:
    return "ddp" if devices > 1 else "auto"  # one process: the test's own reference, no process group


def _loader(devices: int) -> DataLoader:
    return DataLoader(dataset(SAMPLES), batch_size=GLOBAL_BATCH // devices, shuffle=True)


def whole(out: Path, devices: int, resume: str | None) -> dict[str, Any]:
    tandem.seed_everything(11)
    model = Net("adam", lr=0.01)
    saver = SaveAtStep(SAVE_STEP, str(out / f"elastic-{devices}.ckpt"))
    trainer = _trainer(devices, out, "whole", callbacks=[saver])
    trainer.fit(model, _loader(devices))
    return {"final": weights(model), "global_step": trainer.global_step}


def resume(out: Path, devices: int, resume: str | None) -> dict[str, Any]:
    tandem.seed_everything(99)  # the checkpoint decides the order and the weights, whatever this run's seed
    model = Net("adam", lr=0.01)
    trainer = _trainer(devices, out, "resume")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, _loader(devices), ckpt_path=resume)
    return {
        "final": weights(model),
        "global_step": trainer.global_step,
        "epoch": trainer.current_epoch,
        "warnings": [str(w.message) for w in caught],
    }


def rollback(out: Path, devices: int, resume: str | None) -> dict[str, Any]:
    x, y = dataset(SAMPLES).tensors
    x = x.clone()
    x[BAD_SAMPLE] = math.nan  # unshuffled: in global batch 2 of each epoch, on one rank only
    data = DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // devices, shuffle=False)
    tandem.seed_everything(11)
    model = Net("sgd", lr=0.05)
    trainer = tandem.Trainer(
        strategy=_strategy(devices),
        devices=devices,
        accelerator="cpu",
        max_epochs=2,
        log_every_n_steps=3,
        on_nonfinite="rollback",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        data_order="global",
        limit_val_batches=0,  # Net has a validation_step, and no validation data here
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, data)
    return {
        "final": weights(model),
        "global_step": trainer.global_step,
        "rollbacks": [(r.step, r.epoch, r.batch_idx, r.restored_step, r.skipped) for r in trainer.rollbacks],
        "warnings": [str(w.message) for w in caught if "rollback" in str(w.message)],
    }


class KilledAtSecondSave(Net):
    """``Net``, whose rank ``KILLED_RANK`` is killed (SIGKILL: nothing runs after) as the second checkpoint is built."""

    saves = 0

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.saves += 1
        if self.saves == 2 and self.trainer.global_rank == KILLED_RANK:
            os.kill(os.getpid(), signal.SIGKILL)


def killed_save(out: Path, devices: int, resume: str | None) -> dict[str, Any]:
    from tandem.callbacks import ModelCheckpoint

    tandem.seed_everything(11)
    model = KilledAtSecondSave("adam", lr=0.01)
    checkpoints = ModelCheckpoint(dirpath=out / "killed", every_n_train_steps=4, save_top_k=-1)
    trainer = tandem.Trainer(
        strategy=_strategy(devices),
        devices=devices,
        accelerator="cpu",
        max_epochs=2,
        callbacks=[checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        data_order="global",
        limit_val_batches=0,
    )
    trainer.fit(model, _loader(devices))
    return {"final": weights(model)}  # not reached: the job ends at the second save


def counts(out: Path, devices: int, resume: str | None) -> dict[str, Any]:
    return scale.counted_fit(devices, epochs=2, steps=8, log_every=4, folder=str(out / f"counts-{devices}"))


SCENARIOS = {f.__name__: f for f in (whole, resume, rollback, counts, killed_save)}

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--resume", help="the checkpoint the resume scenario starts from")
    parser.add_argument("--count", action="store_true", help="count the coordination (before the first fit)")
    parser.add_argument("--hang-after", type=float, default=100.0, help="print every thread's stack and exit")
    arguments = parser.parse_args()
    faulthandler.dump_traceback_later(arguments.hang_after, exit=True)  # a hang fails with its stack shown
    folder = Path(arguments.out)
    if arguments.count:
        scale.install_counters()
    for name in arguments.scenarios:
        started = time.perf_counter()
        result = SCENARIOS[name](folder, arguments.devices, arguments.resume)
        result["seconds"] = time.perf_counter() - started
        result["world_size"] = dist.get_world_size()
        torch.save(result, folder / f"{name}-{arguments.devices}-rank{dist.get_rank()}.pt")
