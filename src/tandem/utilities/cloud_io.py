"""Files local or at an fsspec URL (``memory://``, ``s3://``, ``gs://``): whether a path is a URL, its
filesystem, and reading, listing and removing files either way (writing them is ``tandem.utilities.atomic``'s)."""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path
from typing import Any

from tandem.utilities.exceptions import CheckpointError


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
