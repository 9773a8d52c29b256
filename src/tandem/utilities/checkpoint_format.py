"""What a checkpoint file holds: plain data (``to_plain`` / ``from_plain``) and a checksum of its entries.

A tandem checkpoint (a dict with the ``tandem_version`` key) also stores ``tandem_checksum``, a CRC32 of each
of its entries (every tensor's bytes, dtype and shape, and the plain values and keys around them), checked
when the file is loaded: a changed byte is reported as a damaged file instead of training on wrong weights.

A checkpoint holds plain data only (``to_plain``, ``tandem.utilities.plain_data``), so plain
``torch.load(path)`` (``weights_only=True``, torch's default) reads every tandem checkpoint, and tandem reads every
checkpoint that way: nothing in a file is unpickled (no code in it runs) unless the caller says the file is trusted
(``weights_only=False``). The checksum is for integrity (a damaged file), not authenticity: whoever can write a file
can write its checksum too.
"""

from __future__ import annotations

import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from tandem.utilities.exceptions import CheckpointError
from tandem.utilities.plain_data import BadPlainData, LegacyPickledValue, NotPlainData, decode, encode

try:  # RNG states hold numpy arrays
    import numpy as np
except ImportError:  # pragma: no cover
    np = None  # type: ignore[assignment]  # the optional import's fallback: every use checks `np is not None`


CHECKSUM_KEY = "tandem_checksum"
_CHECKSUM_ALGORITHM = "crc32"
#: checkpoint entries whose values are the user's ``__init__`` arguments: one that cannot be plain data is left out
_HPARAMS_ENTRIES = ("hparams", "datamodule_hparams")


def to_plain(checkpoint: dict[str, Any], warned: set[tuple[str, str]] | None = None) -> dict[str, Any]:
    """``checkpoint`` as plain data (``encode``), for a file that
    ``torch.load(weights_only=True)`` reads. A hyperparameter that cannot be (an ``nn.Module``, a function, an
    arbitrary object) is left out of the file, with a warning naming it and ``save_hyperparameters(ignore=[...])``
    (once per name while the same ``warned`` set is passed: the Trainer keeps one); such a value anywhere else (a
    callback's state, an entry added in ``on_save_checkpoint``) is a
    [`CheckpointError`][tandem.utilities.exceptions.CheckpointError] naming it, before anything is written."""
    warned = set() if warned is None else warned
    plain: dict[str, Any] = {}
    for entry, value in checkpoint.items():
        if entry in _HPARAMS_ENTRIES and isinstance(value, dict):
            plain[entry] = {}
            for name, hparam in value.items():
                try:
                    plain[entry][name] = encode(hparam, f"{entry}[{name!r}]")
                except NotPlainData as err:
                    if (entry, name) not in warned:
                        warned.add((entry, name))
                        _warn_left_out(entry, name, err)
            continue
        try:
            plain[entry] = encode(value, f"checkpoint[{entry!r}]")
        except NotPlainData as err:
            raise CheckpointError(
                f"The checkpoint was not written: {err}. A checkpoint holds plain data only (tensors, numbers, "
                "strings, lists, dicts, paths, enums, numpy arrays), so that loading it never runs code. Return "
                "plain values from the state_dict / on_save_checkpoint that put it there (for an object, its "
                "state_dict() or the arguments that rebuild it)."
            ) from None
    return plain


def _warn_left_out(entry: str, name: str, err: NotPlainData) -> None:
    from tandem.utilities.rank_zero import rank_zero_warn

    owner = "self" if entry == "hparams" else "the DataModule's self"
    rank_zero_warn(
        f"The hyperparameter {name!r} ({err.kind}) is left out of checkpoints: a checkpoint holds plain data only, "
        f"so that loading it never runs code. Leave it out of the hyperparameters, "
        f"{owner}.save_hyperparameters(ignore=[{name!r}]), and pass it again when loading: "
        f"load_from_checkpoint(path, {name}=...)."
    )


def from_plain(checkpoint: dict[str, Any], path: str | os.PathLike, trusted: bool) -> dict[str, Any]:
    """Undo ``to_plain`` for the checkpoint loaded from ``path``. Values that an earlier tandem version stored
    pickled are unpickled only when ``trusted`` (``weights_only=False``); otherwise the error names them and
    that argument."""
    try:
        return decode(checkpoint, trusted)
    except LegacyPickledValue as err:
        raise CheckpointError(
            f"Checkpoint {str(path)!r} was written by an earlier tandem version, which stored {err.where} as "
            "pickled bytes: unpickling runs whatever code the file holds, so tandem does it only for a file you "
            f"trust. If you wrote it (or trust who did), load it with weights_only=False: {_TRUST_FIX} A checkpoint "
            "saved again after that holds plain data and loads without it."
        ) from None
    except BadPlainData as err:
        raise CheckpointError(f"Checkpoint {str(path)!r}: {err}") from None


_TRUST_FIX = (
    "Model.load_from_checkpoint(path, weights_only=False), trainer.fit(model, ckpt_path=path, weights_only=False) "
    "(likewise validate, test and predict), or --weights_only false on the command line."
)


def checksum(obj: dict[str, Any]) -> dict[str, Any]:
    """CRC32s of a checkpoint's entries, as stored under ``tandem_checksum``: ``{"crc32": {entry: hex}}``
    (plain strs in a dict: ``weights_only``-safe).

    One CRC32 per top-level entry (named by its ``repr``), so a damaged file names the damaged entry, and a
    file saved again after an entry was deliberately removed still checks the rest. Each covers every
    tensor's dtype, shape and bytes (read in place, without a copy, for contiguous CPU tensors), numpy
    arrays, and the keys, plain values (None, bool, int, float, complex, str, bytes, dtypes, devices) and
    nesting of dicts, lists, tuples and sets; other objects count by their type name only (tandem's
    checkpoints hold none: ``to_plain`` writes plain data). The ``tandem_checksum`` entry
    itself is left out. The values do not depend on the process (no ``id``, ``hash`` or set order).
    """
    hasher = _Hasher()
    names = []
    for key, value in obj.items():
        if key != CHECKSUM_KEY:
            names.append(repr(key))
            hasher.start_segment()
            hasher.feed(key)
            hasher.feed(value)
    return {_CHECKSUM_ALGORITHM: {name: f"{crc:08x}" for name, crc in zip(names, hasher.values())}}


class _Hasher:
    """Feeds nested structures to zlib.crc32, one CRC per segment.

    Small items go into a stream in order. Large buffers (tensor and array bytes, read in place) are cut
    into fixed 16 MB pieces whose CRC32s are computed on a thread pool (zlib releases the GIL), and each
    piece's CRC and length join the stream where the buffer was: the values do not depend on the threads.
    """

    _PIECE = 16 << 20
    _PARALLEL_FROM = 64 << 20  # below this in all, threads cost more than they save

    def __init__(self) -> None:
        self._stream: list[bytes | Any] = []  # bytes, or a buffer to cut into pieces
        self._segments: list[int] = [0]  # where each segment starts in the stream
        self._buffer = bytearray()
        self._large = 0

    def start_segment(self) -> None:
        self._flush()
        if self._stream:
            self._segments.append(len(self._stream))
        else:
            self._segments = [0]

    def values(self) -> list[int]:
        """The CRC32 of each segment."""
        self._flush()
        pieces = [
            part[start : start + self._PIECE]
            for part in self._stream
            if not isinstance(part, bytes)
            for start in range(0, max(len(part), 1), self._PIECE)
        ]
        workers = min(8, os.cpu_count() or 1)
        if workers > 1 and self._large >= self._PARALLEL_FROM:
            with ThreadPoolExecutor(workers, thread_name_prefix="tandem-checksum") as pool:
                piece_crcs = iter(list(pool.map(zlib.crc32, pieces)))
        else:
            piece_crcs = iter([zlib.crc32(piece) for piece in pieces])
        crcs = []
        for first, end in zip(self._segments, [*self._segments[1:], len(self._stream)]):
            crc = 0
            for part in self._stream[first:end]:
                if isinstance(part, bytes):
                    crc = zlib.crc32(part, crc)
                else:
                    for start in range(0, max(len(part), 1), self._PIECE):
                        length = min(self._PIECE, len(part) - start)
                        crc = zlib.crc32(struct.pack("<IQ", next(piece_crcs), length), crc)
            crcs.append(crc)
        return crcs

    def _flush(self) -> None:
        if self._buffer:
            self._stream.append(bytes(self._buffer))
            self._buffer.clear()

    def _add(self, data: bytes) -> None:
        self._buffer += data

    def _add_large(self, data: Any, now: bool = False) -> None:
        """``data``: a 1-d uint8 numpy array (sliced without copies). ``now``: hash it at once rather than
        keep it (a copy of a GPU tensor), with the same result."""
        if now:
            for start in range(0, max(len(data), 1), self._PIECE):
                piece = data[start : start + self._PIECE]
                self._add(struct.pack("<IQ", zlib.crc32(piece), len(piece)))
            return
        self._flush()
        self._stream.append(data)
        self._large += len(data)

    def feed(self, obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            self._tensor(obj)
        elif isinstance(obj, dict):
            self._add(b"{%d" % len(obj))
            for key, value in obj.items():
                self.feed(key)
                self.feed(value)
        elif isinstance(obj, (list, tuple)):
            self._add(b"[%d" % len(obj))
            for value in obj:
                self.feed(value)
        elif obj is None or isinstance(obj, bool):
            self._add(b"N" if obj is None else b"b%d" % obj)
        elif isinstance(obj, int):
            self._add(b"i%d;" % obj)
        elif isinstance(obj, float):
            self._add(b"f" + struct.pack("<d", obj))
        elif isinstance(obj, str):
            data = obj.encode("utf-8", "surrogatepass")
            self._add(b"s%d;" % len(data) + data)
        elif isinstance(obj, (bytes, bytearray)):
            self._add(b"y%d;" % len(obj) + bytes(obj))
        elif isinstance(obj, complex):
            self._add(b"c" + struct.pack("<dd", obj.real, obj.imag))
        elif isinstance(obj, (torch.dtype, torch.device)):
            self.feed(str(obj))
        elif isinstance(obj, (set, frozenset)):  # in an order that does not depend on the process's hashing
            self._add(b"<%d" % len(obj))
            for value in sorted(obj, key=repr):
                self.feed(value)
        elif np is not None and isinstance(obj, (np.ndarray, np.generic)):
            array = np.ascontiguousarray(obj)
            self._add(f"a{array.dtype.str}{array.shape}".encode())
            if array.dtype.hasobject:
                for value in array.reshape(-1).tolist():
                    self.feed(value)
            else:
                self._add_large(array.reshape(-1).view(np.uint8))
        else:
            self._add(f"o{type(obj).__module__}.{type(obj).__qualname__};".encode())

    def _tensor(self, tensor: torch.Tensor) -> None:
        tensor = tensor.detach()
        self._add(f"t{tensor.dtype}{tuple(tensor.shape)}".encode())
        if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_meta:
            self._add(f"{tensor.layout}".encode())  # rare in checkpoints: counted by kind and shape only
            return
        copied = tensor.device.type != "cpu"
        if copied:
            tensor = tensor.cpu()
        tensor = tensor.resolve_conj().resolve_neg().contiguous()  # no copy for a contiguous CPU tensor
        self._add_large(tensor.reshape(-1).view(torch.uint8).numpy(), now=copied)
