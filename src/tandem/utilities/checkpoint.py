"""Checkpoint and log files: atomic writes, a checksum verified on load, and errors that name the file.

Writes go to a temporary file in the target's folder, then ``os.replace`` puts it in place, so a process
killed while writing leaves the previous file intact. The temporary is named
``.<target>.<host>-<pid>-<random>.tmp``, created with the mode a new file gets from ``open()``
(``0o666`` less the umask) and locked (``flock``) while it is written; a later write to the same target
removes the temporaries that a killed writer left behind (the writer's process is gone and nobody holds
the lock), and never one that a live writer is still writing. A later write into the same folder removes
them, whatever file they were for (a new run saves ``last-v1.ckpt``, never ``last.ckpt`` again). A sharded
checkpoint's temporary directory (``temporary_directory``) is named and locked the same way, and a
resumed run clears its checkpoint's folder of them (``remove_stale_temporaries_in``): the run that died
may never write there again. The sweep considers only regular files and folders owned by this user, checked
without following symbolic links, and opens nothing that could block (a FIFO named like a temporary stays).

A finished directory replaces the previous one in three steps (``replace_directory``): the previous one
is renamed aside to ``.<target>.<host>-<pid>-<random>.old``, the new one renamed onto the target, then the
previous one removed. A process killed between two steps leaves a state that the same sweep settles once the
writer is gone: an ``.old`` directory beside its target is removed; one whose target is missing (killed
between the two renames) is renamed back onto it, so ``ckpt_path="last"`` finds the previous checkpoint.

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

import contextlib
import glob
import os
import re
import secrets
import shutil
import socket
import stat
import struct
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import torch

from tandem.utilities.exceptions import CheckpointError, FileWriteError, no_checkpoint_path, write_failed
from tandem.utilities.plain_data import BadPlainData, LegacyPickledValue, NotPlainData, decode, encode

try:  # advisory locks on the temporary files; absent on Windows
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]  # the optional import's fallback: every use checks `fcntl is not None`

try:  # RNG states hold numpy arrays
    import numpy as np
except ImportError:  # pragma: no cover
    np = None  # type: ignore[assignment]  # the optional import's fallback: every use checks `np is not None`

CHECKPOINT_MARKER = "tandem_version"
CHECKSUM_KEY = "tandem_checksum"
_CHECKSUM_ALGORITHM = "crc32"
_FOREIGN_IDLE_S = 120.0  # a temporary of another host, unlocked and unchanged this long, is stale
_TEMPORARY = re.compile(r"^\.(?P<target>.+)\.(?P<host>[A-Za-z0-9-]+)-(?P<pid>\d+)-[0-9a-f]{8}\.(?P<kind>tmp|old)$")
_UNNAMED_OLD = re.compile(r"^\.(?P<target>.+)\.[0-9a-f]{8}\.old$")  # moved aside by earlier versions: no writer named
#: a sharded checkpoint (a directory written by torch.distributed.checkpoint) holds its other state in this file
SHARDED_META_FILE = "meta.pt"
_SAFE_MAPPINGS = (dict, OrderedDict)
_HEAD_BYTES = 64  # what is read of a file torch could not load, to tell a damaged checkpoint from another file


# ---------------------------------------------------------------------------------------------- writing


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], None], what: str = "") -> None:
    """Call ``write`` on a temporary file in the same folder, then ``os.replace`` it onto ``path``.

    A process killed while writing leaves the previous file at ``path`` intact; the next write into that
    folder removes the temporary it left. The new file gets the mode ``open()`` would give it (``0o666`` less the
    umask). An operating-system error (disk full, no permission) becomes a
    [`FileWriteError`][tandem.utilities.exceptions.FileWriteError] that names ``path`` and the cause.

    Args:
        path: the file to write.
        write: writes the contents to the open binary file it is given.
        what: the file's role for error messages, e.g. "checkpoint".
    """
    if is_url(path):
        _remote_write(os.fspath(path), write, what)
        return
    path = Path(path)
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries_in(path.parent)
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


def is_url(path: str | os.PathLike) -> bool:
    """Whether ``path`` names an fsspec filesystem (``memory://``, ``s3://``, ``gs://``) rather than a local file."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def url_filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` and the path inside it (``s3://`` needs s3fs, ``gs://`` gcsfs)."""
    try:
        import fsspec
    except ImportError:
        raise CheckpointError(f"{url!r} is a URL; reading or writing URLs needs fsspec: pip install fsspec") from None
    return fsspec.core.url_to_fs(url)


def read_text(path: str | os.PathLike) -> str | None:
    """The UTF-8 text of the file ``path`` (local or at an fsspec URL), or None when there is no such file."""
    if is_url(path):
        fs, inner = url_filesystem(os.fspath(path))
        return fs.cat_file(inner).decode("utf-8") if fs.isfile(inner) else None
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as file:
        return file.read()


def _remote_write(url: str, write: Callable[[IO[bytes]], None], what: str) -> None:
    """Write to a temporary name next to ``url``, then ``fs.mv`` it onto ``url``. Not atomic on object stores
    (S3, GCS copy and delete): a reader may briefly find no file, but never a half-written one under ``url``."""
    fs, path = url_filesystem(url)
    parent, name = path.rsplit("/", 1) if "/" in path else ("", path)
    tmp = f"{parent}/.{name}.{_writer_host()}-{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        if parent:
            fs.makedirs(parent, exist_ok=True)
        with fs.open(tmp, "wb") as f:
            write(f)
        fs.mv(tmp, path)
    except BaseException as err:
        with contextlib.suppress(Exception):
            fs.rm(tmp)
        if isinstance(err, OSError):
            raise write_failed(url, err, what, kept=False) from None
        raise


def remove_file(path: str | os.PathLike) -> None:
    """Delete a file or a folder (a sharded checkpoint), local or at an fsspec URL; a missing one is fine. A
    symbolic link is removed itself, never what it points to."""
    if is_url(path):
        fs, inner = url_filesystem(os.fspath(path))
        if fs.exists(inner):
            fs.rm(inner, recursive=fs.isdir(inner))
        return
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def atomic_link(
    target: str | os.PathLike,
    path: str | os.PathLike,
    what: str = "",
    before_copy: Callable[[], None] | None = None,
) -> None:
    """Make ``path`` a symbolic link to ``target`` (relative to ``path``'s folder, so the folder can move), put in
    place as ``atomic_write`` puts a file: made under a temporary name, then ``os.replace``'d onto ``path``, so
    a reader finds the previous file or the new link, never neither. Where links cannot be made (Windows without
    the privilege, some network filesystems), ``path`` becomes a copy of ``target`` instead, written atomically
    too; ``before_copy`` is called first (e.g. to wait for a background write of ``target``). A directory at
    ``path`` (a sharded checkpoint) is replaced as ``replace_directory`` does. Local paths only. A process
    killed between making the link and the rename leaves a hidden link named like a temporary, which the sweep
    leaves alone as it leaves every symbolic link (it points to a checkpoint, and holds no data).

    Args:
        target: the checkpoint to point to (a file, or a sharded checkpoint's directory).
        path: the link to make, e.g. ``.../last.ckpt``.
        what: the link's role for error messages.
        before_copy: called before a copy is made instead of a link.
    """
    target, path = Path(target), Path(path)
    relative = os.path.relpath(target, path.parent)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise write_failed(path, err, what, kept=os.path.lexists(path)) from None
    remove_stale_temporaries_in(path.parent)
    try:
        while True:
            tmp = _temporary_name(path)
            try:
                os.symlink(relative, tmp)
                break
            except FileExistsError:
                continue
    except OSError:  # no links here: a copy
        if before_copy is not None:
            before_copy()
        _atomic_copy(target, path, what)
        return
    try:
        if path.is_dir() and not path.is_symlink():
            replace_directory(tmp, path)
        else:
            os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise write_failed(path, err, what, kept=os.path.lexists(path)) from None
    _sync_folder(path.parent)


def _atomic_copy(source: Path, path: Path, what: str) -> None:
    """A copy of the checkpoint ``source`` (a file, or a sharded checkpoint's directory) at ``path``, atomically."""
    if not source.is_dir():
        with open(source, "rb") as src:
            atomic_write(path, lambda f: shutil.copyfileobj(src, f), what)
        return
    with temporary_directory(path) as tmp:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        replace_directory(tmp, path)


def glob_files(pattern: str) -> list[str]:
    """The files matching the glob ``pattern``, local or at an fsspec URL (then given back as URLs)."""
    if not is_url(pattern):
        return glob.glob(pattern)
    fs, inner = url_filesystem(pattern)
    return [fs.unstrip_protocol(p) for p in fs.glob(inner)]


def modified_time(path: str) -> float:
    """When the file at ``path`` (local, or an fsspec URL) last changed, in seconds since the epoch."""
    if not is_url(path):
        return os.path.getmtime(path)
    fs, inner = url_filesystem(path)
    return fs.modified(inner).timestamp()


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


def check_writable_folder(folder: str | os.PathLike, what: str = "") -> None:
    """Raise [`FileWriteError`][tandem.utilities.exceptions.FileWriteError] now if files cannot be created in ``folder``
    (or where it would be made).

    Probes the folder, or its nearest existing parent, by creating and removing an empty file: this sees
    permissions, ACLs and read-only mounts alike, and leaves nothing behind. An fsspec URL is not probed
    (that would mean a round trip to the store): its filesystem reports a problem at the first write.
    """
    if is_url(folder):
        return
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
    """Remove the temporaries of ``path`` (files, or a sharded checkpoint's directories) that killed writers
    left; returns their names.

    Only tandem's temporaries of exactly this target are considered, and one is removed only when its
    writer is gone: on this host its process no longer exists and nobody holds its lock; from another
    host (a shared filesystem) nobody holds its lock and it has not changed for two minutes.
    """
    path = Path(path)
    return _remove_stale(path.parent, path.name)


def remove_stale_temporaries_in(folder: str | os.PathLike) -> list[str]:
    """``remove_stale_temporaries`` for every target in ``folder``: what killed saves of any file there
    left (every write calls it on its folder, and a resumed run on its checkpoint's folder, which it may never
    write to again), and what a killed ``replace_directory`` left (a previous checkpoint moved aside: removed
    beside its replacement, renamed back where the replacement never arrived). Files and directories that are not
    tandem's temporaries are never touched."""
    return _remove_stale(Path(folder), None)


def replace_directory(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Put the finished directory ``source`` (a sharded checkpoint's ``temporary_directory``) at ``target``;
    a checkpoint already there is renamed aside first and removed only after. A kill between any two steps
    leaves a state ``remove_stale_temporaries_in`` settles (see ``_swap_steps``)."""
    for _ in _swap_steps(Path(source), Path(target)):
        pass


def _swap_steps(source: Path, target: Path) -> Iterator[str]:
    """``replace_directory`` one step at a time; after each it yields the state a kill there leaves:

    - "moved aside": ``target`` is missing; the previous checkpoint is ``.<target>.<writer>.old`` and the new one
      the temporary ``source``. The sweep renames the ``.old`` back onto ``target`` and removes the temporary.
    - "in place": the new checkpoint is at ``target``; the sweep removes the ``.old``.
    - "removed": done (also while the ``.old`` is being removed: a part of it is left, which the sweep removes).
    """
    old = None
    if os.path.lexists(target):
        old = Path(_temporary_name(target, "old"))
        os.replace(target, old)
        _sync_folder(target.parent)
        yield "moved aside"
    os.replace(source, target)
    _sync_folder(target.parent)
    yield "in place"
    if old is not None:
        _remove_path(old)
    yield "removed"


@contextlib.contextmanager
def temporary_directory(path: str | os.PathLike) -> Iterator[Path]:
    """A new directory next to ``path``, named and locked like ``atomic_write``'s temporaries, for a
    sharded checkpoint that is renamed onto ``path`` when complete; the folder's stale ones are removed first.
    The lock is held until the block ends, so no other process takes the directory for a killed writer's."""
    path = Path(path)
    remove_stale_temporaries_in(path.parent)
    while True:
        tmp = _temporary_name(path)
        try:
            os.mkdir(tmp)
            break
        except FileExistsError:
            continue
    fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        _lock(fd)
        yield Path(tmp)
    finally:
        os.close(fd)


def _remove_stale(folder: Path, target: str | None) -> list[str]:
    removed: list[str] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    prefix = "." if target is None else f".{target}."
    for entry in entries:
        if not entry.name.startswith(prefix) or not entry.name.endswith((".tmp", ".old")):
            continue
        match = _TEMPORARY.match(entry.name) or _UNNAMED_OLD.match(entry.name)
        if match is None or target is not None and match["target"] != target:
            continue
        if match.re is not _TEMPORARY:  # a previous checkpoint an earlier tandem moved aside without its writer's name
            gone = _settle_if_stale(entry.path, folder / match["target"], None, None)
        elif match["kind"] == "tmp":
            gone = _remove_if_stale(entry.path, match["host"], int(match["pid"]))
        else:
            gone = _settle_if_stale(entry.path, folder / match["target"], match["host"], int(match["pid"]))
        if gone:
            removed.append(entry.name)
    return removed


def _settle_if_stale(old: str, target: Path, host: str | None, pid: int | None) -> bool:
    """A previous checkpoint that ``replace_directory`` moved aside, once its writer is gone: removed when its
    replacement is at ``target``, renamed back onto ``target`` when the writer was killed before the replacement
    got there. A writer on another host (or one an earlier tandem did not name) cannot be asked: it is gone when
    the rename is two minutes old."""
    found = _ours(old)
    if found is None:
        return False
    try:
        if pid is not None and host == _writer_host():
            if _process_alive(pid):
                return False
        elif time.time() - found.st_ctime < _FOREIGN_IDLE_S:  # ctime: when it was renamed aside
            return False
        if os.path.lexists(target):
            _remove_path(old)
        else:
            os.replace(old, target)
            _sync_folder(target.parent)
    except OSError:
        return False
    return True


def _remove_path(path: str | Path) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def _writer_host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname().split(".")[0])[:40] or "host"


def _temporary_name(path: Path, kind: str = "tmp") -> str:
    return str(path.parent / f".{path.name}.{_writer_host()}-{os.getpid()}-{secrets.token_hex(4)}.{kind}")


def _lock(fd: int) -> None:
    if fcntl is not None:
        with contextlib.suppress(OSError):  # a filesystem without locks: the process check still holds
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _create_temporary(path: Path) -> tuple[str, int]:
    """A new, locked temporary file next to ``path``, with the mode a new file gets from ``open()``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = _temporary_name(path)
        try:
            fd = os.open(tmp, flags, 0o666)  # the umask applies, as for open() and torch.save(obj, path)
        except FileExistsError:
            continue
        _lock(fd)
        return tmp, fd


def _last_change(tmp: str) -> float:
    """When ``tmp`` last changed: a directory's newest entry (its shards are written inside it)."""
    latest = os.lstat(tmp).st_mtime
    if os.path.isdir(tmp) and not os.path.islink(tmp):
        for folder, _, files in os.walk(tmp):
            for name in files:
                with contextlib.suppress(OSError):
                    latest = max(latest, os.lstat(os.path.join(folder, name)).st_mtime)
    return latest


def _ours(path: str) -> os.stat_result | None:
    """``path``'s own status (links not followed) when it can be a temporary tandem wrote: a regular file or a
    folder, owned by this user; None for anything else (a symlink, a FIFO, a socket, a device, another user's
    file), which the sweep never opens, waits on or removes."""
    try:
        found = os.lstat(path)
    except OSError:
        return None
    if not (stat.S_ISREG(found.st_mode) or stat.S_ISDIR(found.st_mode)):
        return None
    if hasattr(os, "getuid") and found.st_uid != os.getuid():
        return None
    return found


def _remove_if_stale(tmp: str, host: str, pid: int) -> bool:
    found = _ours(tmp)
    if found is None:
        return False
    if host == _writer_host():
        if _process_alive(pid):
            return False
    else:
        try:
            if time.time() - _last_change(tmp) < _FOREIGN_IDLE_S:
                return False
        except OSError:
            return False
    try:  # never blocks, never follows a link; the file opened must be the one checked
        fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (found.st_dev, found.st_ino):
            return False
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a live writer holds it
            except OSError:
                if host != _writer_host():
                    return False  # no locks here, and no way to ask the other host
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
        else:
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


def _os_error(err: BaseException | None) -> OSError | None:
    """The operating-system error behind ``err`` (torch.save reports a full disk as "unexpected pos ...",
    with the OSError as its cause or context)."""
    seen: set[int] = set()
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


# ---------------------------------------------------------------------------------------------- plain data

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


# ---------------------------------------------------------------------------------------------- checksum


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


# ---------------------------------------------------------------------------------------------- reading


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
