"""Atomic writes: a file, a link or a directory is put in place whole, or the previous one stays.

Writes go to a temporary file in the target's folder, then ``os.replace`` puts it in place, so a process
killed while writing leaves the previous file intact (``tandem.utilities.temporaries`` names and locks the
temporaries, and removes those of killed writers).

A finished directory replaces the previous one in three steps (``replace_directory``): the previous one
is renamed aside to ``.<target>.<host>-<pid>-<random>.old``, the new one renamed onto the target, then the
previous one removed. A process killed between two steps leaves a state that the same sweep settles once the
writer is gone: an ``.old`` directory beside its target is removed; one whose target is missing (killed
between the two renames) is renamed back onto it, so ``ckpt_path="last"`` finds the previous checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from tandem.utilities.cloud_io import is_url, url_filesystem
from tandem.utilities.exceptions import FileWriteError, write_failed
from tandem.utilities.temporaries import (
    _create_temporary,
    _lock,
    _remove_path,
    _sync_folder,
    _temporary_name,
    _writer_host,
    remove_stale_temporaries_in,
)


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
