"""Reading a sharded checkpoint (a ``torch.distributed.checkpoint`` directory) without running what it holds.

torch's ``FileSystemReader`` unpickles the directory's ``.metadata`` with ``pickle.load``, and its default load
planner reads every non-tensor item (an optimizer's ``lr``, ``betas``) with ``torch.load(weights_only=False)``:
a directory someone else wrote can run any code on every rank that loads it. tandem's reader unpickles
``.metadata`` allowing only the classes that file is made of (``torch.distributed.checkpoint``'s metadata
records, ``torch.Size``, dtypes, layouts, memory formats, paths), and its planner reads the non-tensor items with
``torch.load(weights_only=True)``. What either refuses is a
[`CheckpointError`][tandem.utilities.exceptions.CheckpointError] naming the file, what it holds and
``weights_only=False``, the way to load a directory one trusts (torch's own reader and planner are used then).
"""

from __future__ import annotations

import io
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

_METADATA_MODULES = ("torch.distributed.checkpoint.metadata",)
_ALLOWED = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # rebuilds a layout from its name ("torch.strided")
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("collections", "OrderedDict"),
    *(("pathlib", name) for name in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath")),
    ("pathlib", "PureWindowsPath"),
    *(("pathlib._local", name) for name in ("Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")),
}
_TORCH_CONSTANTS = (torch.dtype, torch.layout, torch.memory_format)


class Refused(pickle.UnpicklingError):
    """A sharded checkpoint holds something that is not plain data; ``what`` names it."""

    def __init__(self, what: str) -> None:
        self.what = what
        super().__init__(what)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), _TORCH_CONSTANTS):
            return getattr(torch, name)
        if module in _METADATA_MODULES:
            found = super().find_class(module, name)
            if isinstance(found, type) and found.__module__ == module:  # a record class, not a function it imports
                return found
        raise Refused(f"{module}.{name}")


class SafeReader(FileSystemReader):
    """A ``FileSystemReader`` whose ``.metadata`` may hold torch.distributed.checkpoint's records only. What it
    refuses is kept in ``refused`` too: ``dcp.load`` turns a metadata error into the text of another."""

    refused: Refused | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as file:
            try:
                metadata = _MetadataUnpickler(file).load()
            except Refused as refused:
                self.refused = refused
                raise
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """torch's default load planner, reading each non-tensor item weights-only first (refusing what is not plain
    data, kept in ``refused``) before it reads it as it always does."""

    refused: Refused | None = None

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            self.refused = Refused(f"the item {read_item.dest_index.fqn!r} ({_unsafe(err)})")
            raise self.refused from None
        value.seek(0)
        super().load_bytes(read_item, value)


def readers(path: str | os.PathLike, trusted: bool) -> dict[str, Any]:
    """The ``dcp.load`` arguments that read ``path``: tandem's safe reader and planner, or torch's own (and their
    defaults) when the directory is ``trusted``."""
    if trusted:
        return {"checkpoint_id": os.fspath(path)}
    return {"storage_reader": SafeReader(os.fspath(path)), "planner": SafePlanner()}


def refusal(arguments: dict[str, Any]) -> Refused | None:
    """What the safe reader or planner among ``arguments`` (from ``readers``) refused, or None."""
    for part in (arguments.get("storage_reader"), arguments.get("planner")):
        refused: Refused | None = getattr(part, "refused", None)
        if refused is not None:
            return refused
    return None


def _unsafe(error: Exception) -> str:
    """The global torch's weights-only unpickler named in ``error`` ("GLOBAL builtins.exec was not an allowed
    global"), else the last line of its message."""
    found = re.search(r"GLOBAL ([\w.]+)", str(error))
    return found.group(1) if found else str(error).strip().splitlines()[-1][:200]


def refused_message(path: Path, refused: Refused) -> str:
    return (
        f"Sharded checkpoint {str(path)!r} was not loaded: it holds {refused.what}, which is not plain data; "
        "reading it means unpickling it, which runs whatever code the directory names, so tandem reads sharded "
        "checkpoints as tensors and plain data only (tandem's own hold nothing else). If you trust the directory "
        "(you or your team wrote it), load it with weights_only=False: trainer.fit(model, ckpt_path=path, "
        "weights_only=False) (likewise validate, test and predict)."
    )
