"""Elastic resume of two training loaders between 1 and 2 processes, in each CombinedLoader mode: the programs of
``combined_ddp_run.py`` (a dict of two shuffled loaders, ``data_order="global"``, batch 4 on one process and 2 per
rank on two: the same global batch). :func:`two_processes` is the ``elastic`` scenario of the trainer tests' shared
DDP launch (``core_ddp_runs.py``): each mode's uninterrupted run saving mid-epoch, and the resume of the one-process
checkpoint ``<folder>/one-<mode>.ckpt`` (written before the launch by :func:`one_process`).
``tests/trainer/test_elastic_loaders_ddp.py`` resumes the two-process checkpoints on one process and compares.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from combined_ddp_run import MODES, Recording, _trainer, loaders

import tandem
from tandem.callbacks import ModelCheckpoint
from tandem.utilities import CombinedLoader

#: the step each mode's checkpoint is saved at, mid-epoch (min_size: 3 batches an epoch; max_size_cycle: "a" in its
#: second pass)
SAVED_AT = {"max_size_cycle": 4, "min_size": 2, "max_size": 4}


def _fit(world: int, mode: str, sizes: dict[str, int] | None = None, **kwargs: Any) -> Recording:
    """``combined_ddp_run``'s program; ``sizes``: each loader's batch size (else 4 on one process, 2 on two)."""
    tandem.seed_everything(7)
    model = Recording()
    given = loaders(4 // world) if sizes is None else {name: loaders(size)[name] for name, size in sizes.items()}
    ckpt = kwargs.pop("ckpt", None)
    _trainer(world, **kwargs).fit(model, CombinedLoader(given, mode), ckpt_path=ckpt)
    return model


def _saved(world: int, mode: str, folder: Path) -> tuple[dict[str, Any], Path]:
    """The uninterrupted run (2 epochs) and its checkpoint at ``SAVED_AT[mode]``, at ``<folder>/<name>-<mode>.ckpt``."""
    name = "one" if world == 1 else "two"
    saving = ModelCheckpoint(
        dirpath=folder / f"{name}-{mode}", every_n_train_steps=SAVED_AT[mode], filename="{step}", save_top_k=-1
    )
    model = _fit(world, mode, max_epochs=2, callbacks=[saving])
    path = folder / f"{name}-{mode}.ckpt"
    if world == 1 or dist.get_rank() == 0:
        shutil.copy(folder / f"{name}-{mode}" / f"step={SAVED_AT[mode]}.ckpt", path)
    return {"seen": model.seen, "weights": _weights(model)}, path


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def resume(world: int, mode: str, ckpt: Path, sizes: dict[str, int] | None = None) -> dict[str, Any]:
    model = _fit(world, mode, sizes, ckpt=ckpt, max_epochs=2)
    return {"seen": model.seen, "weights": _weights(model)}


def one_process(folder: Path) -> dict[str, Any]:
    """On one process: each mode's uninterrupted run, saving ``<folder>/one-<mode>.ckpt``."""
    return {mode: _saved(1, mode, folder)[0] for mode in MODES}


def two_processes(folder: Path) -> dict[str, Any]:
    """On two: each mode's uninterrupted run (saving ``two-<mode>.ckpt``) and the one-process checkpoint resumed."""
    result: dict[str, Any] = {}
    for mode in MODES:
        result[mode] = {"whole": _saved(2, mode, folder)[0], "resumed": resume(2, mode, folder / f"one-{mode}.ckpt")}
    return result
