"""Checkpoint and log files: atomic writes, a checksum verified on load, and errors that name the file.

Writes go to a temporary file in the target's folder, then ``os.replace`` puts it in place, so a process
killed while writing leaves the previous file intact. The temporary is named
``.<target>.<host>-<pid>-<random>.tmp``, created with the mode a new file gets from ``open()``
(``0o666`` less the umask) and locked (``flock``) while it is written; a later write to the same target
removes the temporaries that a killed writer left behind (the writer's process is gone and nobody holds
the lock), and never one that a live writer is still writing.

A tandem checkpoint (a dict with the ``tandem_version`` key) also stores ``tandem_checksum``, a CRC32 of its
contents (every tensor's bytes, dtype and shape, and the plain values and keys around them), checked when
the file is loaded: a changed byte is reported as a damaged file instead of training on wrong weights.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
import struct
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import torch

from tandem.utilities.exceptions import CheckpointError, FileWriteError, write_failed

try:  # advisory locks on the temporary files; absent on Windows
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

try:  # RNG states hold numpy arrays
    import numpy as np
except ImportError:  # pragma: no cover
    np = None

CHECKPOINT_MARKER = "tandem_version"
CHECKSUM_KEY = "tandem_checksum"
_CHECKSUM_ALGORITHM = "crc32"
_FOREIGN_IDLE_S = 120.0  # a temporary of another host, unlocked and unchanged this long, is stale
_TEMPORARY = re.compile(r"^\.(?P<target>.+)\.(?P<host>[A-Za-z0-9-]+)-(?P<pid>\d+)-[0-9a-f]{8}\.tmp$")


# ---------------------------------------------------------------------------------------------- writing


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None], what: str = "") -> None:
    """Call ``write`` on a temporary file in the same folder, then ``os.replace`` it onto ``path``.

    A process killed while writing leaves the previous file at ``path`` intact; the next write to ``path``
    removes the temporary it left. The new file gets the mode ``open()`` would give it (``0o666`` less the
    umask). An operating-system error (disk full, no permission) becomes a :class:`FileWriteError` that
    names ``path`` and the cause.

    Args:
        path: the file to write.
        write: writes the contents to the open binary file it is given.
        what: the file's role for error messages, e.g. "checkpoint".
    """
    path = Path(path)
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        tmp, fd = _create_temporary(path)
    except OSError as err:
        raise write_failed(path, err, what, kept=existed) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        cause = _os_error(err) if isinstance(err, Exception) else None
        if cause is None or isinstance(err, FileWriteError):
            raise
        raise write_failed(path, cause, what, kept=existed) from None
    _sync_folder(path.parent)


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` through :func:`atomic_write`; a tandem checkpoint gets its checksum first."""
    if isinstance(obj, dict) and CHECKPOINT_MARKER in obj:
        obj = {**{k: v for k, v in obj.items() if k != CHECKSUM_KEY}, CHECKSUM_KEY: checksum(obj)}
    atomic_write(path, lambda f: torch.save(obj, f), what="checkpoint")


def check_writable_folder(folder: str | os.PathLike, what: str = "") -> None:
    """Raise :class:`FileWriteError` now if files cannot be created in ``folder`` (or where it would be made).

    Probes the folder, or its nearest existing parent, by creating and removing an empty file: this sees
    permissions, ACLs and read-only mounts alike, and leaves nothing behind.
    """
    folder = Path(folder).absolute()
    probe_in = folder
    try:
        while not probe_in.exists() and probe_in.parent != probe_in:
            probe_in = probe_in.parent
        if not probe_in.is_dir():
            raise NotADirectoryError(20, f"{str(probe_in)!r} is a file, not a folder")
        name = probe_in / f".tandem-write-check-{os.getpid()}-{secrets.token_hex(4)}"
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.remove(name)
    except OSError as err:
        raise write_failed(folder, err, what) from None


def remove_stale_temporaries(path: str | os.PathLike) -> list[str]:
    """Remove the temporaries of ``path`` that killed writers left; returns their names.

    Only tandem's temporaries of exactly this target are considered, and one is removed only when its
    writer is gone: on this host its process no longer exists and nobody holds its lock; from another
    host (a shared filesystem) nobody holds its lock and it has not changed for two minutes.
    """
    path = Path(path)
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    prefix = f".{path.name}."
    for entry in entries:
        if not entry.name.startswith(prefix) or not entry.name.endswith(".tmp"):
            continue
        match = _TEMPORARY.match(entry.name)
        if match is None or match["target"] != path.name:
            continue
        if _remove_if_stale(entry.path, match["host"], int(match["pid"])):
            removed.append(entry.name)
    return removed


def _writer_host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname().split(".")[0])[:40] or "host"


def _create_temporary(path: Path) -> tuple[str, int]:
    """A new, locked temporary file next to ``path``, with the mode a new file gets from ``open()``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = str(path.parent / f".{path.name}.{_writer_host()}-{os.getpid()}-{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)  # the umask applies, as for open() and torch.save(obj, path)
        except FileExistsError:
            continue
        if fcntl is not None:
            with contextlib.suppress(OSError):  # a filesystem without locks: the process check still holds
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return tmp, fd


def _remove_if_stale(tmp: str, host: str, pid: int) -> bool:
    if host == _writer_host():
        if _process_alive(pid):
            return False
    else:
        try:
            if time.time() - os.stat(tmp).st_mtime < _FOREIGN_IDLE_S:
                return False
        except OSError:
            return False
    try:
        fd = os.open(tmp, os.O_RDONLY)
    except OSError:
        return False
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a live writer holds it
            except OSError:
                if host != _writer_host():
                    return False  # no locks here, and no way to ask the other host
        os.remove(tmp)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except (OSError, IndexError):
        return True


def _os_error(err: BaseException) -> OSError | None:
    """The operating-system error behind ``err`` (torch.save reports a full disk as "unexpected pos ...",
    with the OSError as its cause or context)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError) and err.errno is not None:
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def _sync_folder(folder: Path) -> None:
    """Make the rename durable (best effort: not every platform or filesystem allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------------------------- checksum


def checksum(obj: Any) -> str:
    """A CRC32 of a checkpoint's contents, as ``"crc32:<8 hex digits>"`` (a plain str: ``weights_only``-safe).

    Covers every tensor's dtype, shape and bytes (read in place, without a copy, for contiguous CPU
    tensors), numpy arrays, and the keys, plain values (None, bool, int, float, str, bytes) and nesting of
    dicts, lists and tuples; other objects count by their type name only. The top-level ``tandem_checksum``
    entry is left out. The value does not depend on the process (no ``id``, ``hash`` or set order).
    """
    hasher = _Hasher()
    if isinstance(obj, dict):
        obj = {k: v for k, v in obj.items() if k != CHECKSUM_KEY}
    hasher.feed(obj)
    return f"{_CHECKSUM_ALGORITHM}:{hasher.value():08x}"


class _Hasher:
    """Feeds a nested structure to zlib.crc32.

    Small items go into one stream in order. Large buffers (tensor and array bytes, read in place) are cut
    into fixed 16 MB pieces whose CRC32s are computed on a thread pool (zlib releases the GIL), and each
    piece's CRC and length join the stream where the buffer was: the value does not depend on the threads.
    """

    _PIECE = 16 << 20
    _PARALLEL_FROM = 64 << 20  # below this in all, threads cost more than they save

    def __init__(self) -> None:
        self._stream: list[bytes | Any] = []  # bytes, or a buffer to cut into pieces
        self._buffer = bytearray()
        self._large = 0

    def value(self) -> int:
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
        crc = 0
        for part in self._stream:
            if isinstance(part, bytes):
                crc = zlib.crc32(part, crc)
            else:
                for start in range(0, max(len(part), 1), self._PIECE):
                    length = min(self._PIECE, len(part) - start)
                    crc = zlib.crc32(struct.pack("<IQ", next(piece_crcs), length), crc)
        return crc

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


def verify_checksum(checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
    """Raise :class:`CheckpointError` if ``checkpoint`` (loaded from ``path``) does not match its stored checksum.

    Checkpoints written before tandem stored checksums have none and pass.
    """
    stored = checkpoint.get(CHECKSUM_KEY)
    if not isinstance(stored, str) or not stored.startswith(f"{_CHECKSUM_ALGORITHM}:"):
        return
    actual = checksum(checkpoint)
    if actual != stored:
        raise CheckpointError(
            f"Checkpoint {str(path)!r} is damaged: its contents do not match the checksum stored when it was "
            f"written ({stored}, now {actual}); a byte changed on the disk or in a copy. Do not resume from it; "
            f"{_earlier_checkpoints(path)}"
        )


# ---------------------------------------------------------------------------------------------- reading


def load_checkpoint_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a tandem checkpoint onto the CPU and check its checksum, or raise :class:`CheckpointError`
    naming the file (missing, a folder, unreadable, damaged, or not a tandem checkpoint)."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(_folder_message(path))
    if not path.is_file():
        raise CheckpointError(
            f"Checkpoint {str(path)!r} does not exist. Check ckpt_path, or pass "
            "ckpt_path='last' to resume from the newest last.ckpt of this run."
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # torch raises many types for a damaged file
        raise CheckpointError(
            f"Checkpoint {str(path)!r} could not be read ({type(err).__name__}: {err}). The file is truncated, "
            f"damaged or not a torch checkpoint; {_earlier_checkpoints(path)}"
        ) from None
    if not isinstance(checkpoint, dict) or CHECKPOINT_MARKER not in checkpoint:
        found = sorted(checkpoint)[:8] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise CheckpointError(
            f"{str(path)!r} is not a tandem checkpoint (no {CHECKPOINT_MARKER!r} key; found {found}). "
            "Pass a file written by Trainer.save_checkpoint or ModelCheckpoint; to load bare weights use "
            "module.load_state_dict(torch.load(path))."
        )
    verify_checksum(checkpoint, path)
    return checkpoint


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
    found = _checkpoints_in(folder)
    if not found:
        return (
            f"ckpt_path {str(folder)!r} is a folder, not a checkpoint file, and holds no .ckpt file. Pass a "
            "checkpoint file, or ckpt_path='last' for the newest last.ckpt of this run."
        )
    last = [p for p in found if p.name == "last.ckpt"]
    suggestion = (last or found)[0]
    return f"ckpt_path {str(folder)!r} is a folder, not a checkpoint file. Pass the file inside it: ckpt_path={str(suggestion)!r}."
