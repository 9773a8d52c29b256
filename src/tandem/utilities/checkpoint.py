"""Checkpoint files: atomic writes, and reads that fail with a message naming the file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from tandem.utilities.exceptions import CheckpointError

CHECKPOINT_MARKER = "tandem_version"


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> None:
    """Call ``write`` on a temporary file in the same folder, then ``os.replace`` it onto ``path``.

    A process killed while writing leaves the previous file at ``path`` intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` through :func:`atomic_write`."""
    atomic_write(path, lambda f: torch.save(obj, f))


def load_checkpoint_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a tandem checkpoint onto the CPU, or raise :class:`CheckpointError` naming the file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"Checkpoint {str(path)!r} does not exist. Check ckpt_path, or pass "
            "ckpt_path='last' to resume from the newest last.ckpt of this run."
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # torch raises many types for a damaged file
        raise CheckpointError(
            f"Checkpoint {str(path)!r} could not be read ({type(err).__name__}: {err}). The file is truncated "
            "or is not a torch checkpoint; use an earlier checkpoint, e.g. last.ckpt, which is written atomically."
        ) from None
    if not isinstance(checkpoint, dict) or CHECKPOINT_MARKER not in checkpoint:
        found = sorted(checkpoint)[:8] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise CheckpointError(
            f"{str(path)!r} is not a tandem checkpoint (no {CHECKPOINT_MARKER!r} key; found {found}). "
            "Pass a file written by Trainer.save_checkpoint or ModelCheckpoint; to load bare weights use "
            "module.load_state_dict(torch.load(path))."
        )
    return checkpoint
