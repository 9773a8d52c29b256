"""Checkpoint files: atomic writes, reads that fail with a message naming the file, and the encoding that
lets plain ``torch.load(path)`` (``weights_only=True``, torch's default) read every tandem checkpoint."""

from __future__ import annotations

import os
import pickle
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from tandem.utilities.exceptions import CheckpointError

CHECKPOINT_MARKER = "tandem_version"
#: a value ``torch.load(weights_only=True)`` would refuse is stored as ``{PICKLED_KEY: uint8 tensor}``
PICKLED_KEY = "__tandem_pickled__"
_SAFE_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype, torch.device, torch.Size)
_SAFE_MAPPINGS = (dict, OrderedDict)


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


def to_weights_only(obj: Any, where: str = "checkpoint") -> Any:
    """``obj`` in a form ``torch.load(weights_only=True)`` reads: tensors, numbers, strings, None, dtypes,
    devices and dicts / lists / tuples / sets of them stay as they are; any other value (a ``Path``, an
    enum, a numpy number, an ``nn.Module`` in the hyperparameters, ...) becomes ``{PICKLED_KEY: its pickle
    as a uint8 tensor}``, which :func:`from_weights_only` turns back into the value."""
    kind = type(obj)
    if isinstance(obj, torch.Tensor) or kind in _SAFE_LEAVES:
        return obj
    if kind in _SAFE_MAPPINGS and all(_safe_key(k) for k in obj):
        return kind((k, to_weights_only(v, f"{where}[{k!r}]")) for k, v in obj.items())
    if kind in (list, tuple):
        return kind(to_weights_only(v, f"{where}[{i}]") for i, v in enumerate(obj))
    if kind is set and all(type(v) in _SAFE_LEAVES for v in obj):
        return obj
    try:
        data = pickle.dumps(obj)
    except Exception as err:
        raise CheckpointError(
            f"{where} holds a {kind.__name__} that cannot be saved ({type(err).__name__}: {err}). Store plain "
            "values (numbers, strings, tensors, lists, dicts) there, or leave it out (e.g. "
            "save_hyperparameters(ignore=[...]))."
        ) from None
    return {PICKLED_KEY: torch.frombuffer(bytearray(data), dtype=torch.uint8)}


def from_weights_only(obj: Any) -> Any:
    """Undo :func:`to_weights_only` (values pickled there are unpickled: load only files you trust)."""
    kind = type(obj)
    if kind in _SAFE_MAPPINGS:
        if len(obj) == 1 and isinstance(obj.get(PICKLED_KEY), torch.Tensor):
            return pickle.loads(obj[PICKLED_KEY].numpy().tobytes())
        return kind((k, from_weights_only(v)) for k, v in obj.items())
    if kind in (list, tuple):
        return kind(from_weights_only(v) for v in obj)
    return obj


def _safe_key(key: Any) -> bool:
    return type(key) in _SAFE_LEAVES or type(key) is tuple and all(type(k) in _SAFE_LEAVES for k in key)


def load_checkpoint_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a tandem checkpoint onto the CPU, or raise :class:`CheckpointError` naming the file.

    Checkpoints of earlier tandem versions (with numpy arrays in the RNG state) load too.
    """
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
        raise CheckpointError(
            f"{str(path)!r} is not a tandem checkpoint (no {CHECKPOINT_MARKER!r} key). {_foreign_file_advice(checkpoint)}"
        )
    return from_weights_only(checkpoint)


def _foreign_file_advice(obj: Any) -> str:
    """What the file holds, and a load recipe that works for it."""
    if not isinstance(obj, dict):
        return f"It holds a {type(obj).__name__}. Pass a file written by Trainer.save_checkpoint or ModelCheckpoint."
    if isinstance(obj.get("state_dict"), dict):  # e.g. a Lightning checkpoint
        return (
            f"It holds the keys {sorted(map(str, obj))[:8]}. Pass a file written by Trainer.save_checkpoint or "
            "ModelCheckpoint; to take only its weights (from a file you trust), use "
            "module.load_state_dict(torch.load(path, weights_only=False)['state_dict'])."
        )
    if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return (
            "It holds bare weights (a state dict): load them with module.load_state_dict(torch.load(path)), then "
            "pass the module without ckpt_path."
        )
    return f"It holds the keys {sorted(map(str, obj))[:8]}. Pass a file written by Trainer.save_checkpoint or ModelCheckpoint."
