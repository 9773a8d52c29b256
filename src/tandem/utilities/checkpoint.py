"""A tandem checkpoint file: saved atomically with its checksum, loaded onto the CPU with the checksum checked,
and errors that name the file and say what to do (missing, a folder, damaged, not a checkpoint, holding code).

Its format (plain data, the checksum) is ``tandem.utilities.checkpoint_format``'s; the atomic writes are
``tandem.utilities.atomic``'s. A sharded checkpoint (``FSDPStrategy(state_dict_type="sharded")``) is a folder
holding ``SHARDED_META_FILE`` and one ``.distcp`` file per rank.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tandem.utilities.atomic import atomic_write
from tandem.utilities.checkpoint_format import _CHECKSUM_ALGORITHM, _TRUST_FIX, CHECKSUM_KEY, checksum, from_plain
from tandem.utilities.cloud_io import is_url, url_filesystem
from tandem.utilities.exceptions import CheckpointError, no_checkpoint_path

CHECKPOINT_MARKER = "tandem_version"
#: a sharded checkpoint (a directory written by torch.distributed.checkpoint) holds its other state in this file
SHARDED_META_FILE = "meta.pt"
_SAFE_MAPPINGS = (dict, OrderedDict)
_HEAD_BYTES = 64  # what is read of a file torch could not load, to tell a damaged checkpoint from another file


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` through ``atomic_write``; a tandem checkpoint gets its checksum first."""
    if isinstance(obj, dict) and CHECKPOINT_MARKER in obj:
        obj = {**{k: v for k, v in obj.items() if k != CHECKSUM_KEY}, CHECKSUM_KEY: checksum(obj)}
    atomic_write(path, lambda f: torch.save(obj, f), what="checkpoint")


def host_copy(obj: Any) -> Any:
    """A copy of ``obj`` that later changes to the training state cannot reach: every tensor copied to host
    memory (a CPU tensor cloned, a GPU tensor copied over), and the dicts, lists, tuples and sets around them
    built again. What a background write saves ([`AsyncCheckpointIO`][tandem.strategies.AsyncCheckpointIO]) while the
    next steps change the parameters and optimizer states in place. A tensor that appears twice is copied once."""
    copies: dict[int, torch.Tensor] = {}

    def copy(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) not in copies:
                value_ = value.detach()
                copies[id(value)] = value_.clone() if value_.device.type == "cpu" else value_.cpu()
            return copies[id(value)]
        kind = type(value)
        if kind in _SAFE_MAPPINGS:
            return kind((k, copy(v)) for k, v in value.items())
        if isinstance(value, dict):  # a dict subclass: its own copy, with the values copied
            copied = value.copy()
            copied.update((k, copy(v)) for k, v in value.items())
            return copied
        if kind in (list, tuple, set, frozenset):
            return kind(copy(v) for v in value)
        return value  # numbers, strings and the other immutable leaves a checkpoint holds

    return copy(obj)


def verify_checksum(checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
    """Raise [`CheckpointError`][tandem.utilities.exceptions.CheckpointError] if an entry of ``checkpoint`` (loaded from
    ``path``) does not match the checksum stored when it was written.

    Checkpoints written before tandem stored checksums have none and pass. Entries removed since are not
    missed (the file was edited on purpose); an entry that changed, or that replaced one (a damaged name),
    is damage.
    """
    stored = checkpoint.get(CHECKSUM_KEY)
    expected = stored.get(_CHECKSUM_ALGORITHM) if isinstance(stored, dict) else None
    if not isinstance(expected, dict):
        return
    actual = checksum(checkpoint)[_CHECKSUM_ALGORITHM]
    damaged = [name for name, value in expected.items() if name in actual and actual[name] != value]
    if set(actual) - set(expected) and set(expected) - set(actual):
        damaged += sorted(set(actual) - set(expected))
    if damaged:
        raise CheckpointError(
            f"Checkpoint {str(path)!r} is damaged: its {', '.join(damaged)} entr{'ies do' if len(damaged) > 1 else 'y does'} "
            "not match the checksum stored when it was written; a byte changed on the disk or in a copy. Do not "
            f"resume from it; {_earlier_checkpoints(path)} (If you changed the file on purpose and saved it again "
            f"with torch.save, delete its {CHECKSUM_KEY!r} entry first.)"
        )


def load_checkpoint_file(path: str | os.PathLike, weights_only: bool | None = None) -> dict[str, Any]:
    """Read a tandem checkpoint onto the CPU and check its checksum, or raise
    [`CheckpointError`][tandem.utilities.exceptions.CheckpointError] naming the file (missing, a folder, unreadable,
    damaged, not a tandem checkpoint, or holding code).

    The file is read with ``torch.load(weights_only=True)``: tensors and plain data only, so nothing in it runs.
    ``weights_only=False`` (Lightning's spelling) says the file is trusted: it is unpickled in full (an object
    of any class is rebuilt, which can run any code), and values an earlier tandem version stored pickled are
    unpickled too. ``None`` is ``True``. ``path`` may be an fsspec URL (``memory://``, ``s3://``).
    """
    trusted = weights_only is False
    if is_url(path):
        url = os.fspath(path)
        fs, inner = url_filesystem(url)
        if not fs.isfile(inner):
            raise CheckpointError(f"Checkpoint {url!r} does not exist. Check ckpt_path.")
        with fs.open(inner, "rb") as f:
            checkpoint = _torch_load(f, url, trusted, lambda: _head(inner, fs), "")
    else:
        if not os.fspath(path):  # Path("") would be the working directory
            raise CheckpointError(no_checkpoint_path("checkpoint_path=''"))
        path = Path(path)
        if path.is_dir():
            raise CheckpointError(_folder_message(path))
        if not path.is_file():
            raise CheckpointError(
                f"Checkpoint {str(path)!r} does not exist. Check ckpt_path, or pass "
                "ckpt_path='last' to resume from the newest last.ckpt of this run."
            )
        checkpoint = _torch_load(path, str(path), trusted, lambda: _head(path), f" {_earlier_checkpoints(path)}")
    if not isinstance(checkpoint, dict) or CHECKPOINT_MARKER not in checkpoint:
        raise CheckpointError(
            f"{str(path)!r} is not a tandem checkpoint (no {CHECKPOINT_MARKER!r} key). {_foreign_file_advice(checkpoint)}"
        )
    verify_checksum(checkpoint, path)  # over what was saved: before the values are decoded
    return from_plain(checkpoint, path, trusted)


def _torch_load(source: Any, name: str, trusted: bool, head: Callable[[], bytes], advice: str) -> Any:
    """``torch.load`` of ``source`` (a path or an open file) onto the CPU, weights-only unless ``trusted``; a file it
    refuses or cannot read is a [`CheckpointError`][tandem.utilities.exceptions.CheckpointError] naming ``name``
    (``head()``: the file's first bytes, read only then)."""
    try:
        return torch.load(source, map_location="cpu", weights_only=not trusted)
    except Exception as err:  # torch raises many types for a damaged file
        first = head()
        if not _written_by_torch_save(first):
            raise CheckpointError(_not_a_checkpoint(name, first)) from None
        if not trusted and "Weights only load failed" in str(err):
            raise CheckpointError(_refused(source, name, err)) from None
        raise CheckpointError(
            f"Checkpoint {name!r} could not be read ({type(err).__name__}: {err}). The file is truncated, "
            f"damaged or not a torch checkpoint.{advice}"
        ) from None


def _refused(source: Any, name: str, err: Exception) -> str:
    """The message for a file ``torch.load(weights_only=True)`` refused: the types it holds, why, and the fix."""
    try:
        if hasattr(source, "seek"):
            source.seek(0)
        names = torch.serialization.get_unsafe_globals_in_checkpoint(source)
    except Exception:  # a legacy-format file: torch's own message names the first one
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        names = [found.group(1)] if found else []
    held = f"objects of {', '.join(sorted(names)[:6])}" if names else "objects that are not plain data"
    return (
        f"Checkpoint {name!r} was not loaded: it holds {held}. Loading those means unpickling them, which runs "
        "whatever code the file names, so tandem reads checkpoints with torch.load(weights_only=True): tensors "
        "and plain data only (tandem's own checkpoints hold nothing else). If you trust the file (you or your "
        f"team wrote it), load it with weights_only=False: {_TRUST_FIX} Never do so for a file from an unknown "
        "source."
    )


def _head(path: str | os.PathLike, fs: Any = None) -> bytes:
    """The first bytes of a file torch could not load (local, or ``path`` in the fsspec filesystem ``fs``); none
    when it cannot be read either."""
    try:
        if fs is not None:
            with fs.open(path, "rb") as f:
                return f.read(_HEAD_BYTES)
        with open(path, "rb") as f:
            return f.read(_HEAD_BYTES)
    except Exception:  # unreadable: the load error says why
        return b""


def _written_by_torch_save(head: bytes) -> bool:
    """Whether a file starting with ``head`` can be one ``torch.save`` wrote: a zip archive (its format since torch
    1.6), or a pickle (the legacy format); an empty file may be one cut short. Anything else (text, an image) is
    no checkpoint, however damaged."""
    return not head or head.startswith((b"PK\x03\x04", b"\x80"))


def _not_a_checkpoint(path: str, head: bytes) -> str:
    text = head.decode("utf-8", errors="replace").rstrip("\ufffd")  # the last character may be cut
    if all(c.isprintable() or c in "\t\r\n" for c in text):
        holds = f"it holds text: {text.strip()[:40]!r}"
    else:
        holds = f"it starts with the bytes {head[:8]!r}"
    return (
        f"{path!r} is not a checkpoint: torch.save did not write it ({holds}). Pass a checkpoint written by "
        "Trainer.save_checkpoint or ModelCheckpoint, or ckpt_path='last' for the newest last.ckpt of this run."
    )


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


def is_sharded_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` is (or claims to be) a sharded checkpoint's directory: named ``*.ckpt`` and not empty, or
    holding tandem's meta file or torch.distributed.checkpoint's ``.metadata``; any other folder (a run's
    ``version_0``, its ``checkpoints``, an empty ``x.ckpt``) is a plain folder."""
    path = Path(path)
    if not path.is_dir():
        return False
    if (path / SHARDED_META_FILE).is_file() or (path / ".metadata").is_file():
        return True
    return path.suffix == ".ckpt" and not _is_empty(path)


def _is_empty(folder: Path) -> bool:
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _checkpoints_in(folder: Path) -> list[Path]:
    """``*.ckpt`` files in ``folder`` and in its ``checkpoints`` sub-folder, newest first."""
    found = [p for sub in (folder, folder / "checkpoints") for p in sub.glob("*.ckpt") if p.is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _earlier_checkpoints(path: str | os.PathLike) -> str:
    """Advice naming the other checkpoints in ``path``'s folder (last.ckpt first), for a file that failed."""
    path = Path(path)
    others = [p for p in _checkpoints_in(path.parent) if p.parent == path.parent and p.name != path.name]
    others.sort(key=lambda p: not p.name.startswith("last"))  # last.ckpt first, then newest first
    if not others:
        return "no other checkpoint is in its folder: restore the file from a copy, or start from an earlier run."
    shown = ", ".join(repr(p.name) for p in others[:4])
    return f"use the previous checkpoint in {str(path.parent)!r}: {shown}."


def _folder_message(folder: Path) -> str:
    if _is_empty(folder):
        return (
            f"ckpt_path {str(folder)!r} is an empty folder, not a checkpoint: a checkpoint is a file, or (saved "
            f"with FSDPStrategy(state_dict_type='sharded')) a folder holding {SHARDED_META_FILE} and one .distcp "
            "file per rank. Pass a checkpoint written by Trainer.save_checkpoint or ModelCheckpoint, or "
            "ckpt_path='last' for the newest last.ckpt of this run; remove the empty folder."
        )
    found = _checkpoints_in(folder)
    if not found:
        return (
            f"ckpt_path {str(folder)!r} is a folder, not a checkpoint file, and holds no .ckpt file. Pass a "
            "checkpoint file, or ckpt_path='last' for the newest last.ckpt of this run."
        )
    last = [p for p in found if p.name == "last.ckpt"]
    suggestion = (last or found)[0]
    return f"ckpt_path {str(folder)!r} is a folder, not a checkpoint file. Pass the file inside it: ckpt_path={str(suggestion)!r}."
