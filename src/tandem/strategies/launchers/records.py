"""Error records: the traceback a started rank writes of the error that ends it (whole or not at all), read back
by the process that reports the failure, and the messages that name how a rank ended."""

from __future__ import annotations

import os
import signal
import time
import traceback
from typing import Any, NamedTuple

from tandem.strategies.side_channel import broke_in_torch
from tandem.utilities.excepthook import on_uncaught_exception
from tandem.utilities.exceptions import RankFailedError


class _Record(NamedTuple):
    """What a rank wrote of the error that ends it: when, its traceback, and the exception's class."""

    when: float
    text: str
    kind: str = ""  # "module.QualName" ("builtins.KeyboardInterrupt"); "" for a record without one

    def message(self) -> str:
        """The exception's own line (``Type: message`` as the traceback prints it, without the type)."""
        printed = self.kind.removeprefix("builtins.")
        line = next((ln for ln in reversed(self.text.splitlines()) if ln.startswith(f"{printed}: ")), "")
        return line[len(printed) + 2 :]


def _kind(error: BaseException) -> str:
    return f"{type(error).__module__}.{type(error).__qualname__}"


def _write_error_record(path: str, text: str, error: BaseException | None = None) -> None:
    """The traceback that ends this rank, written whole or not at all (a reader may look at any moment)."""
    partial = f"{path}.{os.getpid()}.part"
    with open(partial, "w", encoding="utf-8") as fh:
        fh.write(f"{time.time()!r} {_kind(error) if error is not None else ''}\n{text}")
    os.replace(partial, path)


def _read_error_record(path: str | None) -> _Record | None:
    """What ``_write_error_record`` wrote, or None if the rank wrote none."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            head, _, text = fh.read().partition("\n")
        when, _, kind = head.partition(" ")
        return _Record(float(when), text.rstrip(), kind.strip())
    except (OSError, ValueError):
        return None


def _record_uncaught_errors(path: str, launcher_pid: int | None) -> None:
    """A rank that tandem's launcher started: an exception that ends its script is written to ``path``, and rank 0
    prints it (once for the job: an error raised on every rank is shown once, naming the ranks). The rank prints
    it itself only when the record cannot be written or rank 0 is gone."""

    def record(exc_type: type[BaseException], exc: BaseException, tb: Any) -> bool:
        _write_error_record(path, "".join(traceback.format_exception(exc_type, exc, tb)), exc)
        return launcher_pid is not None and os.getppid() == launcher_pid

    on_uncaught_exception("launcher: error record", record)


def _is_echo(error: BaseException) -> bool:
    """Rank 0's error is most likely the echo of another rank's end: a collective that broke inside torch, or the
    side channel's RankFailedError naming the rank that left."""
    return (isinstance(error, RankFailedError) and bool(error.args)) or broke_in_torch(error)


def _broken_collective(error: BaseException | None) -> BaseException | None:
    """The error of the collective that broke inside torch behind ``error`` (itself, or what tandem's own
    RankFailedError explained), or None: tandem's own text is never quoted as a broken collective."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if broke_in_torch(error):
            return error
        if not isinstance(error, RankFailedError):
            return None
        seen.add(id(error))
        error = error.__context__
    return None


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1].strip() if lines else ""


def _how_it_ended(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with code {returncode}"
    if -returncode == signal.SIGINT:  # Python's exit after an uncaught KeyboardInterrupt
        return "was interrupted by SIGINT (KeyboardInterrupt)"
    name = signal.Signals(-returncode).name
    hint = " (the kernel's out-of-memory killer sends SIGKILL)" if -returncode == signal.SIGKILL else ""
    return f"was killed by {name}{hint}"


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _failure_message(prefix: str, rank: int, ended: str, record: _Record | None) -> str:
    text = f"{prefix}rank {rank} {ended}; the other ranks were stopped."
    if record is None:
        return f"{text} It left no Python traceback; its own output (above) may say more."
    return f"{text} Its traceback:\n{record[1]}"
