"""The temporaries of atomic writes: their names and locks, and the sweep that removes what killed writers left.

A temporary is named ``.<target>.<host>-<pid>-<random>.tmp``, created with the mode a new file gets from ``open()``
(``0o666`` less the umask) and locked (``flock``) while it is written; a later write to the same target
removes the temporaries that a killed writer left behind (the writer's process is gone and nobody holds
the lock), and never one that a live writer is still writing. A later write into the same folder removes
them, whatever file they were for (a new run saves ``last-v1.ckpt``, never ``last.ckpt`` again). A sharded
checkpoint's temporary directory (``temporary_directory``) is named and locked the same way, and a
resumed run clears its checkpoint's folder of them (``remove_stale_temporaries_in``): the run that died
may never write there again. The sweep considers only regular files and folders owned by this user, checked
without following symbolic links, and opens nothing that could block (a FIFO named like a temporary stays).

A process killed between two steps of ``replace_directory`` leaves a state that the same sweep settles once the
writer is gone: an ``.old`` directory beside its target is removed; one whose target is missing (killed
between the two renames) is renamed back onto it, so ``ckpt_path="last"`` finds the previous checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import stat
import time
from pathlib import Path

try:  # advisory locks on the temporary files; absent on Windows
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]  # the optional import's fallback: every use checks `fcntl is not None`


_FOREIGN_IDLE_S = 120.0  # a temporary of another host, unlocked and unchanged this long, is stale
_TEMPORARY = re.compile(r"^\.(?P<target>.+)\.(?P<host>[A-Za-z0-9-]+)-(?P<pid>\d+)-[0-9a-f]{8}\.(?P<kind>tmp|old)$")
_UNNAMED_OLD = re.compile(r"^\.(?P<target>.+)\.[0-9a-f]{8}\.old$")  # moved aside by earlier versions: no writer named


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


def _sync_folder(folder: Path) -> None:
    """Make the rename durable (best effort: not every platform or filesystem allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
