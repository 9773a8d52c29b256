"""Starting the other processes of a DDP job, and ending all of them when one fails.

``ScriptLauncher`` ("ddp") re-runs the user's script for the other local ranks; the original process
is rank 0. Everything the script does runs on every rank, code after ``trainer.fit()`` included, as
in plain torch DDP scripts. ``SpawnLauncher`` ("ddp_spawn") runs one function in spawned processes
and brings rank 0's results back to the caller, for code that cannot be re-run as a script
(notebooks, ``python -c``): guard the script with ``if __name__ == "__main__":``.

A launcher is used as ``launcher.launch(function, *args, trainer=trainer, **kwargs)``; it returns
what ``function`` returned on this process (ScriptLauncher) or on global rank 0 (SpawnLauncher).

When a rank fails, the others are stopped and the failure is raised as
[`RankFailedError`][tandem.utilities.exceptions.RankFailedError], with the failing rank's traceback, in the process the
user watches: rank 0 under ``ddp`` (in its main thread, wherever it is, so its ``finally`` blocks and context managers
run), the caller under ``ddp_spawn``. Each started rank writes the traceback of the error that ends it to a file of its
own (atomically: a reader never sees half of it) and, under ``ddp``, leaves printing it to rank 0: each
traceback is printed once for the job, and an error that every rank raised is printed once, naming the
ranks. A rank killed by a signal writes none and is reported by its signal. Before stopping the ranks,
the launcher announces the teardown through the side channel, so that they take its SIGTERM for what it
is (not a pre-emption) and end at once. Ctrl-C (SIGINT to the job's process group) reaches every rank, and
they end in any order: a started rank that it ended is no failure once rank 0 shows a KeyboardInterrupt of its
own, which is what rank 0 raises.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_for_any
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.multiprocessing as mp
from lightning_utilities.core.apply_func import apply_to_collection

from tandem.strategies.environments import LocalEnvironment, find_free_port
from tandem.strategies.side_channel import (
    announce_teardown,
    broke_in_torch,
    current_channel,
    error_summary,
    report_for_the_job,
)
from tandem.utilities.checkpoint import atomic_save
from tandem.utilities.excepthook import on_uncaught_exception
from tandem.utilities.exceptions import (
    CollectiveMismatchError,
    HangError,
    Preempted,
    RankFailedError,
    TandemConfigError,
    TandemUserCodeError,
)
from tandem.utilities.preemption import EXIT_CODES as PREEMPTED_EXIT_CODES
from tandem.utilities.preemption import PREEMPTION
from tandem.utilities.processes import end_with_parent, load_libc

_POLL_S = 0.1
#: seconds the started ranks get, after rank 0 declared a hang, to print their stacks and end on their own (a rank
#: stopped first prints nothing: at 8 ranks the first to end would otherwise stop the rest within a beat)
_HANG_STACKS_S = 3.0
_TERMINATE_GRACE_S = 5.0
_ECHO_WAIT_S = 2.0  # how long rank 0, its collective broken, waits to see whether a started rank failed first
_INTERRUPT_WAIT_S = 3.0  # a started rank ended by Ctrl-C: how long rank 0's main thread has to show its own
_SAME_ERROR_WAIT_S = 0.5  # how long rank 0, failing on its own, waits for started ranks raising the same error
_PREEMPTED_WAIT_S = 60.0  # ddp_spawn: a rank stopped for a pre-emption; the others must follow within this
_SETTLE_S = 0.3  # ddp_spawn: after the first failure, how long to let the others end (and write) first
_HANDLING_GRACE_S = 30.0  # rank 0 busy with an exception of its own is left to finish it this long
_RESPONSE_S = 15.0  # rank 0, told to raise, must do so within this; else the process is ended
_ABORT_AFTER_S = 3.0  # rank 0 still blocked this long after the wake-up signal: abort an NCCL process group
_NOT_GUARDED_EXIT = 87  # a spawned process that re-ran the user's unguarded script exits with this
# The signal that wakes rank 0's main thread to raise RankFailedError (a real-time one: nobody else's)
_WAKE_SIGNAL = signal.SIGRTMIN + 5 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2


def script_command() -> list[str]:
    """The command that re-runs this program: ``python script.py args`` or ``python -m module args``."""
    return [*_program(), *sys.argv[1:]]


def _program() -> list[str]:
    """``python script.py`` or ``python -m module``: this program, without its arguments."""
    import __main__

    spec = getattr(__main__, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", "__mp_main__"):
        name = spec.name[: -len(".__main__")] if spec.name.endswith(".__main__") else spec.name
        return [sys.executable, "-m", name]
    main_file = getattr(__main__, "__file__", None)
    if main_file is None or sys.argv[0] in ("", "-c"):
        raise TandemConfigError(
            "strategy='ddp' starts the other ranks by re-running your script, but this program has no script "
            "(an interactive session, a notebook or python -c). Use strategy='ddp_notebook' (it forks this process, "
            "so classes defined here come along) or 'ddp_spawn' (classes from importable modules), or run a script."
        )
    return [sys.executable, os.path.abspath(sys.argv[0])]


def child_command(local_rank: int) -> tuple[list[str], str | None]:
    """The command (and working directory) that starts local rank ``local_rank``: this program again, or, under a
    Hydra app, this Hydra job: the program with the job's own overrides, in the parent's resolved run folder
    (``hydra.run.dir``), without ``-m`` / sweep arguments and without writing Hydra's config files again (as
    Lightning does). Re-running ``sys.argv`` unchanged would give each rank a run folder of its own and, under
    ``-m``, a sweep of its own."""
    hydra_config = _hydra_config()
    if hydra_config is None:
        return script_command(), None
    from hydra.utils import get_original_cwd

    return [
        *_program(),
        *hydra_config.overrides.task,  # this job's values (a sweep's, resolved), not the sweep
        f'hydra.run.dir="{hydra_config.runtime.output_dir}"',
        "hydra.output_subdir=null",  # rank 0 wrote the job's .hydra folder
        f"hydra.job.name={hydra_config.job.name}_rank{local_rank}",  # its own log file beside rank 0's
    ], get_original_cwd()


def _hydra_config() -> Any:
    """The running Hydra job's config, or None outside a Hydra app (Hydra is never imported here)."""
    if "hydra" not in sys.modules:
        return None
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get() if HydraConfig.initialized() else None


# ---------------------------------------------------------------------------------------------- error records


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


def _add_note(error: BaseException, note: str) -> None:
    if hasattr(error, "add_note"):  # Python 3.11+: printed under the traceback
        error.add_note(note)
    else:
        print(note, file=sys.stderr, flush=True)


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


# ---------------------------------------------------------------------------------------------- script


@dataclass
class _Child:
    rank: int
    proc: subprocess.Popen
    error_file: str
    #: how it ended, as the job's failure says it: fixed when it is declared the failure (it may still be exiting)
    ended: str = ""

    def failed(self) -> bool:
        """It failed: it ended with an error, or wrote the traceback of the error that ends it (its exit may take
        seconds more: interpreter shutdown, the side channel's last beat)."""
        return _failed(self.proc.poll()) or _read_error_record(self.error_file) is not None

    def how_it_ended(self) -> str:
        """``exited with code 1``, ``was killed by SIGKILL``; ``failed`` while it is still exiting."""
        code = self.proc.poll()
        return "failed" if code is None else _how_it_ended(code)

    def interrupted(self) -> bool:
        """It ended by Ctrl-C: Python's exit after an uncaught KeyboardInterrupt, 130, or such a record."""
        if self.proc.returncode in (-signal.SIGINT, 128 + signal.SIGINT):
            return True
        record = _read_error_record(self.error_file)
        return record is not None and record.kind == _kind(KeyboardInterrupt())

    def found_mismatch(self) -> _Record | None:
        """Its record, when it ended by finding the ranks in different collectives (the job's error, not its own)."""
        record = _read_error_record(self.error_file)
        return record if record is not None and record.kind == _kind(CollectiveMismatchError()) else None


def _handled_exception(thread_id: int) -> BaseException | None:
    """The exception ``thread_id`` is handling now (inside an except / finally / __exit__), if any."""
    entry = sys._current_exceptions().get(thread_id)
    return entry[1] if isinstance(entry, tuple) else entry


class _Watchdog:
    """The ranks this process started, watched until they end: one failing ends the whole job.

    The failure is raised as [`RankFailedError`][tandem.utilities.exceptions.RankFailedError] in the thread that
    launched them (normally the main thread): directly when that thread is already failing (its collective broke when
    the rank died), else through a signal whose handler raises it (a busy or sleeping thread). Only a thread that
    does not respond at all (blocked outside Python) is ended with ``os._exit``.
    """

    def __init__(self) -> None:
        self.children: list[_Child] = []
        self.stopping = False
        self.failure: _Child | None = None
        self.reported = False  # RankFailedError was raised in the launching thread
        self.interrupted = False  # the launching thread got a KeyboardInterrupt of its own (Ctrl-C)
        self._woken_with: Exception | None = None  # the error the wake-up signal raised in the launching thread
        self._main_failing = False  # the launching thread is in launch()'s error handling
        self._main_done = False  # the interpreter is exiting: nothing left to raise into
        self.hydra_job: str | None = None  # the run folder of the Hydra job the ranks were started for
        self._force_wake = False  # raise even inside an except / finally block (it has taken too long)
        main_ident = threading.main_thread().ident
        assert main_ident is not None  # the main thread has started
        self._main_ident = main_ident
        self._signal_installed = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._folder: str | None = None

    def start(self, children: list[_Child], folder: str) -> None:
        self.children, self._folder = children, folder
        self._main_ident = threading.get_ident()
        if threading.current_thread() is threading.main_thread():
            signal.signal(_WAKE_SIGNAL, self._on_wake_signal)
            self._signal_installed = True
        self._thread = threading.Thread(target=self._watch, name="tandem-ddp-watchdog", daemon=True)
        self._thread.start()
        atexit.register(self.wait)
        on_uncaught_exception(  # rank 0 failed later, outside launch()
            "launcher: stop the ranks",
            lambda kind, error, tb: self.stop(f"rank {self.rank} failed ({error_summary(error)})"),
        )

    @property
    def rank(self) -> int:
        """This process's global rank (the ranks it started follow it)."""
        return self.children[0].rank - 1 if self.children else 0

    # ------------------------------------------------------------------ the watching thread
    def failed_child(self) -> _Child | None:
        return next((c for c in self.children if c.failed()), None)

    def failures_within(self, seconds: float) -> list[_Child]:
        """The started ranks that failed (ended with an error, or wrote the traceback of the error that ends them),
        waiting up to ``seconds`` for the others."""
        deadline = time.monotonic() + seconds
        pending = [c for c in self.children if c.proc.poll() is None and not c.failed()]
        while pending and time.monotonic() < deadline:
            time.sleep(_POLL_S / 2)
            pending = [c for c in pending if c.proc.poll() is None and not c.failed()]
        return [c for c in self.children if c.failed()]

    def wait_for_end(self, seconds: float) -> None:
        """Wait up to ``seconds`` for every started rank to end; stop those still running then."""
        deadline = time.monotonic() + seconds
        while any(c.proc.poll() is None for c in self.children) and time.monotonic() < deadline:
            time.sleep(_POLL_S / 2)
        self.stop("the ranks' Hydra job ended")
        if self._thread is not None:
            self._thread.join()

    def wait_for_failure(self, seconds: float) -> _Child | None:
        """A started rank that failed, waiting up to ``seconds`` for one while any is still running."""
        deadline = time.monotonic() + seconds
        while self.children:
            failed = self.failure or self.failed_child()
            if failed is not None or time.monotonic() > deadline:
                return failed
            if all(c.proc.poll() is not None for c in self.children):
                return None
            time.sleep(_POLL_S / 2)
        return None

    def _watch(self) -> None:
        while not self.stopping:
            codes = [c.proc.poll() for c in self.children]  # read once: a rank ending in between is seen next time
            failed = next((c for c, code in zip(self.children, codes) if _failed(code)), None)
            if failed is not None:
                if failed.interrupted() and self._interrupted_within(_INTERRUPT_WAIT_S):
                    return  # Ctrl-C reached the job's process group: rank 0 raises KeyboardInterrupt and stops the rest
                if self._declare(failed):
                    self.stop(f"rank {failed.rank} {failed.ended}")
                    self._raise_in_main()
                return
            if None not in codes:  # all ended, successfully or stopped for a pre-emption
                return
            time.sleep(_POLL_S)

    def _interrupted_within(self, seconds: float) -> bool:
        """Whether the launching thread shows a KeyboardInterrupt of its own within ``seconds``: a started rank
        that Ctrl-C ended is then one part of one interrupt of the whole group (in whatever order the ranks end),
        not a failure of that rank."""
        deadline = time.monotonic() + seconds
        while not (self.interrupted or isinstance(_handled_exception(self._main_ident), KeyboardInterrupt)):
            if self.stopping or self._main_done or time.monotonic() > deadline:
                return self.interrupted
            time.sleep(_POLL_S / 2)
        return True

    def _declare(self, child: _Child) -> bool:
        """Record ``child`` as the job's failure and say so, once; False if a failure or a stop came first."""
        with self._lock:
            if self.failure is not None or self.stopping:
                return False
            child.ended = child.how_it_ended()  # before the stop: the failure, not the SIGTERM that follows
            self.failure = child
        channel = current_channel()
        why = "after the hang this rank declared" if channel is not None and channel.hang is not None else ""
        ended = child.ended
        if child.found_mismatch() is not None:
            ended = "found the ranks in different collectives (CollectiveMismatchError)"
        print(
            f"[tandem] rank {child.rank} {ended}{' ' + why if why else ''}; stopping the other ranks.",
            file=sys.stderr,
            flush=True,
        )
        return True

    def _raise_in_main(self) -> None:
        """Make the launching thread raise RankFailedError; end the process if it cannot be reached.

        A thread already handling an exception (its collective broke when the rank died) is left to reach
        launch(), which raises the failure itself, for up to _HANDLING_GRACE_S; otherwise, or after that,
        it is woken by a signal whose handler raises. Still blocked after _ABORT_AFTER_S: an NCCL process group
        is aborted (a CUDA sync waiting for the dead rank returns). No response within _RESPONSE_S: ``os._exit``.
        """
        handling_since = woken_at = None
        aborted = False
        while not (self.reported or self._main_failing):
            now = time.monotonic()
            if self._main_done or not _thread_alive(self._main_ident):
                self._exit_now("rank 0's script has ended")
            if _handled_exception(self._main_ident) is not None and not self._force_wake:
                handling_since = handling_since or now
                self._force_wake = now - handling_since > _HANDLING_GRACE_S
                if not self._force_wake:
                    time.sleep(_POLL_S)
                    continue
            woken_at = woken_at or now
            if now - woken_at > _RESPONSE_S:
                self._exit_now(f"rank 0 did not respond within {_RESPONSE_S:.0f} s (blocked outside Python)")
            if now - woken_at > _ABORT_AFTER_S and not aborted:
                aborted = True
                _abort_nccl()  # a CUDA sync behind an NCCL collective that waits for the failed rank
            self._interrupt_main()
            time.sleep(5 * _POLL_S)

    def _interrupt_main(self) -> None:
        if self._signal_installed:
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_kill(self._main_ident, _WAKE_SIGNAL)
        else:  # launched from another thread: an asynchronous exception, seen at its next bytecode
            thread, error = ctypes.c_ulong(self._main_ident), ctypes.py_object(RankFailedError)
            ctypes.pythonapi.PyThreadState_SetAsyncExc(thread, error)

    def _on_wake_signal(self, signum: int, frame: Any) -> None:
        """Runs in the main thread: raise the failure there, unless it is already unwinding from an error."""
        if self.failure is None or self.reported or self._main_failing:
            return
        if sys.exc_info()[1] is not None and not self._force_wake:
            return  # leave its except / finally block alone: it is on its way to launch() already
        self.reported = True
        self._woken_with = self.error()
        raise self._woken_with

    def _exit_now(self, why: str) -> None:
        child = self.failure
        if child is not None:  # the failed rank did not print its traceback: rank 0 does
            print(f"{type(self.error()).__name__}: {self.error()}", file=sys.stderr, flush=True)
        print(f"[tandem] {why}; exiting.", file=sys.stderr, flush=True)
        sys.stdout.flush()
        code = child.proc.poll() if child is not None else None
        os._exit(_exit_code(code) if code is not None else 1)

    # ------------------------------------------------------------------ the launching thread
    def error(self, echo: BaseException | None = None) -> RankFailedError | HangError | CollectiveMismatchError:
        """The RankFailedError for the recorded failure, with the failing rank's traceback; the HangError when this
        process declared a hang (the started ranks then printed their stacks and ended); the CollectiveMismatchError
        a started rank raised when it found the ranks in different collectives (what this rank's broken collective
        was part of). ``echo``: this rank's own error since (named in a last line when it is not tandem's)."""
        channel = current_channel()
        if channel is not None and channel.hang is not None:
            return HangError(channel.hang)
        child = self.failure
        assert child is not None  # its callers ask once a started rank failed
        mismatch = child.found_mismatch()
        if mismatch is not None:  # its message names both sides and the user's lines: the job's error
            return CollectiveMismatchError(f"{mismatch.message()}\n(Rank {child.rank} found it and stopped the job.)")
        message = _failure_message("", child.rank, child.ended, _read_error_record(child.error_file))
        if echo is None or echo is self._woken_with:  # woken where it was: its traceback, not an error of its own
            return RankFailedError(message)
        broken = _broken_collective(echo)
        if broken is not None:  # raised from None: the backend's first line is enough
            message += (
                f"\nRank {self.rank}'s collective then broke ({error_summary(broken)}), because rank {child.rank} "
                "had stopped."
            )
        elif not isinstance(echo, RankFailedError):  # tandem's own report of the same end adds nothing
            message += (
                f"\nRank {self.rank} then raised {type(echo).__name__} (shown above), most likely because rank "
                f"{child.rank} had stopped."
            )
        return RankFailedError(message)

    def failure_behind(self, error: BaseException) -> Exception | None:
        """Rank 0's launch() failed with ``error``: the error to raise instead (a started rank failed first, and
        ``error`` is most likely its echo; see ``error``), or None to re-raise ``error`` (its own, or Ctrl-C).
        Stops every started rank."""
        if isinstance(error, Preempted):
            return None  # every rank stopped at the same step and exits with the same code; they are not stopped
        if isinstance(error, HangError):  # raised as it is: its table says where each rank was
            self._main_failing = self.reported = True
            self.stop("rank 0 declared a hang")
            return None
        self.interrupted = isinstance(error, KeyboardInterrupt)  # before the watchdog reads _main_failing
        self._main_failing = True  # the watchdog will not interrupt this thread any more
        reason = f"rank {self.rank} failed ({error_summary(error)})"
        woken = self._woken_with
        if woken is not None and error is woken:  # raised by the wake-up signal: the failure itself, not an echo of it
            self.stop(reason)
            return woken
        if isinstance(error, RankFailedError) and not error.args:  # raised asynchronously (launched from a thread)
            self.reported = True
            self.stop(reason)
            return self.error() if self.failure is not None else None
        if isinstance(error, KeyboardInterrupt) or (self.stopping and self.failure is None):
            self.stop(f"rank {self.rank} was interrupted")  # Ctrl-C, or stopped after an earlier error of its own
            return None
        if _is_echo(error):  # a started rank most likely ended first: its failure is the one to raise
            failed = self.failure or self.wait_for_failure(_ECHO_WAIT_S)
            if failed is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):  # it wrote its traceback and is ending
                    failed.proc.wait(_TERMINATE_GRACE_S)
                self._declare(failed)  # said once, by whichever thread saw it first
            self.stop(reason)
            if self.failure is None:
                return None  # none failed (one ended normally: the side channel's error says so)
            self.reported = True
            return self.error(echo=error)
        failures = [self.failure] if self.failure is not None else self.failures_within(_SAME_ERROR_WAIT_S)
        own = _last_line("".join(traceback.format_exception_only(type(error), error)))
        records = [_read_error_record(c.error_file) for c in failures]
        if failures and all(r is not None and _last_line(r[1]) == own for r in records):
            self.stop(reason)  # the same error on those ranks: shown once, rank 0's traceback
            ranks = ", ".join(str(r) for r in [self.rank, *(c.rank for c in failures)])
            _add_note(error, f"[tandem] ranks {ranks} raised this error (only rank {self.rank}'s traceback is shown).")
            return None
        if failures:  # its record (or its exit) says it failed: the job's failure, whether or not it ended yet
            with contextlib.suppress(subprocess.TimeoutExpired):  # it wrote its traceback and is ending
                failures[0].proc.wait(_TERMINATE_GRACE_S)
            self._declare(failures[0])
        self.stop(reason)
        if self.failure is None:
            return None  # rank 0's own error
        self.reported = True
        return self.error(echo=error)

    def stop(self, reason: str) -> None:
        """Terminate every started rank still running; kill those that ignore it. The side channel is told first
        (``reason``): the ranks take the SIGTERM for the teardown it is, not for a pre-emption, and end at once."""
        self.stopping = True
        channel = current_channel()
        if channel is not None and channel.hang is not None:  # each rank's watcher prints its stack, then it ends
            deadline = time.monotonic() + _HANG_STACKS_S
            while any(c.proc.poll() is None for c in self.children) and time.monotonic() < deadline:
                time.sleep(_POLL_S / 2)
        alive = [c.proc for c in self.children if c.proc.poll() is None]
        if alive:
            announce_teardown(reason, stopping=True)
        for proc in alive:
            proc.terminate()
        deadline = time.monotonic() + _TERMINATE_GRACE_S
        for proc in alive:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def wait(self) -> None:
        """At exit, rank 0 waits for the ranks it started (they die with it); a failure still ends the job."""
        self._main_done = True
        if self._thread is not None:
            self._thread.join()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)


def _failed(returncode: int | None) -> bool:
    """A started rank ended with an error: not running, not 0, and not the exit of a pre-emption stop that this
    process made too (every rank stops at the same step and exits with 128 + the signal's number)."""
    if returncode is None or returncode == 0:
        return False
    return not (returncode in PREEMPTED_EXIT_CODES and (PREEMPTION.signum is not None or PREEMPTION.stopped))


def _abort_nccl() -> None:
    """Best effort: abort NCCL's communicators, so that a thread blocked behind a collective that waits for a
    dead rank returns (gloo needs none of this: the dead rank's closed sockets end its collectives)."""
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_backend() == "nccl":
            dist.distributed_c10d._abort_process_group()


def _thread_alive(ident: int | None) -> bool:
    return any(t.ident == ident for t in threading.enumerate())


_WATCHDOG = _Watchdog()  # one per process: a script's later Trainers reuse the ranks started by the first
_JOB_END_WAIT_S = 60.0  # how long a sweep's next job waits for the previous job's ranks to end


def processes_started() -> bool:
    """Whether this process already started the other local ranks of its script."""
    return bool(_WATCHDOG.children)


def _die_with_parent(parent_pid: int, libc: Any) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec
        end_with_parent(libc)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


@functools.cache  # once per process, however many Trainers launch
def _watch_parent(pid: int) -> None:
    """Where PR_SET_PDEATHSIG is missing: a started rank ends itself when its launcher is gone."""

    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="tandem-parent-watch", daemon=True).start()


class ScriptLauncher:
    """Start local ranks 1..N-1 by re-running this script with the rank variables set; this process is rank 0.

    When a started rank fails, rank 0 stops the others and raises
    [`RankFailedError`][tandem.utilities.exceptions.RankFailedError] (with that rank's traceback) in its main thread,
    wherever it is: ``finally`` blocks and context managers run.

    Args:
        environment: the [`LocalEnvironment`][tandem.strategies.environments.LocalEnvironment] of this job.
        num_processes: processes per node.
    """

    def __init__(self, environment: LocalEnvironment, num_processes: int) -> None:
        self.environment = environment
        self.num_processes = num_processes

    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        if self.environment.creates_processes_externally:  # a rank that a launcher started
            if self.environment.launcher_pid is not None and sys.platform != "linux":
                _watch_parent(self.environment.launcher_pid)
            if self.environment.error_file is not None:
                _record_uncaught_errors(self.environment.error_file, self.environment.launcher_pid)
        elif self.num_processes > 1 and (not _WATCHDOG.children or self._next_hydra_job()):
            self._start_children()
        try:
            return function(*args, **kwargs)
        except BaseException as error:
            if not _WATCHDOG.children:
                raise
            failure = _WATCHDOG.failure_behind(error)
            if failure is None:
                raise
            if _is_echo(error):
                raise failure from None  # the message names the broken collective; the backend's text once
            raise failure  # noqa: B904 (rank 0's own error stays attached as the context: nothing is cut)

    def _next_hydra_job(self) -> bool:
        """A Hydra sweep (``-m``) moved on to its next job: the ranks started for the previous one ran that job
        only and ended. Leave their process group, so that this job starts its ranks and joins a new group."""
        global _WATCHDOG
        hydra_config = _hydra_config()
        if hydra_config is None or hydra_config.runtime.output_dir == _WATCHDOG.hydra_job:
            return False
        from tandem.strategies.parallel import leave_process_group  # parallel imports this module

        _WATCHDOG.wait_for_end(_JOB_END_WAIT_S)
        leave_process_group()
        _WATCHDOG = _Watchdog()
        if self.environment.num_nodes == 1:
            os.environ["MASTER_PORT"] = str(find_free_port())  # the last job's port may still be held
        return True

    def _start_children(self) -> None:
        hydra_config = _hydra_config()
        _WATCHDOG.hydra_job = hydra_config.runtime.output_dir if hydra_config is not None else None
        libc = load_libc()
        folder = tempfile.mkdtemp(prefix="tandem-errors-")
        children = []
        for local_rank in range(1, self.num_processes):
            rank = self.environment.node_rank * self.num_processes + local_rank
            error_file = os.path.join(folder, f"rank{rank}.txt")
            command, cwd = child_command(local_rank)
            proc = subprocess.Popen(
                command,
                cwd=cwd,
                env=self.environment.child_environment(local_rank, error_file),
                preexec_fn=_die_with_parent(os.getpid(), libc),
            )
            children.append(_Child(rank, proc, error_file))
        # SIGTERM / SIGUSR1 reach them too; only running ones (a reaped child's pid may belong to another process)
        PREEMPTION.forward_to = lambda: [child.proc.pid for child in children if child.proc.poll() is None]
        report_for_the_job()  # a teardown does not end this process: it raises the failure
        _WATCHDOG.start(children, folder)


# ---------------------------------------------------------------------------------------------- spawn


def _to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu()


def collect(trainer: Any) -> dict[str, Any]:
    """What rank 0 of ``ddp_spawn`` sends back: trained weights, metrics, loop progress, checkpoint paths."""
    payload: dict[str, Any] = {
        "state_dict": {k: v.detach().cpu() for k, v in trainer.strategy.full_module_state_dict().items()},
        "callback_metrics": apply_to_collection(dict(trainer.callback_metrics), torch.Tensor, _to_cpu),
        "logged_metrics": apply_to_collection(dict(getattr(trainer, "logged_metrics", {})), torch.Tensor, _to_cpu),
    }
    payload["progress"] = trainer.fit_loop.state_dict()  # current_epoch and global_step read it afterwards
    checkpoint = getattr(trainer, "checkpoint_callback", None)
    if checkpoint is not None:
        payload["checkpoint"] = {
            name: getattr(checkpoint, name)
            for name in ("best_model_path", "last_model_path", "best_model_score")
            if hasattr(checkpoint, name)
        }
        payload["checkpoint"] = apply_to_collection(payload["checkpoint"], torch.Tensor, _to_cpu)
    return payload


def apply(trainer: Any, payload: dict[str, Any], module: torch.nn.Module | None) -> None:
    """Put rank 0's results into the calling process: weights into ``module``, the rest into ``trainer``."""
    if module is not None:
        module.load_state_dict(payload["state_dict"])
    trainer.callback_metrics.clear()
    trainer.callback_metrics.update(payload["callback_metrics"])
    logged = getattr(trainer, "logged_metrics", None)
    if isinstance(logged, dict) and "logged_metrics" in payload:
        logged.clear()
        logged.update(payload["logged_metrics"])
    trainer.fit_loop.load_state_dict(payload["progress"])
    checkpoint = getattr(trainer, "checkpoint_callback", None)
    if checkpoint is not None:
        for name, value in payload.get("checkpoint", {}).items():
            setattr(checkpoint, name, value)


def _spawned(
    local_rank: int,
    environment: LocalEnvironment,
    function: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    trainer: Any,
    folder: str,
    rng_state: dict[str, Any],
) -> None:
    """A spawned rank: the caller's RNG state (so seed_everything holds), the function, and the outcome on disk."""
    from tandem.utilities.seed import restore_rng_state

    Path(folder, f"started{local_rank}").touch()  # it got past importing the user's script
    end_with_parent()  # end with the caller
    try:
        environment.export_rank(local_rank)
        restore_rng_state(rng_state)
        result = function(*args, **kwargs)
        payload = collect(trainer) if trainer is not None else None  # every rank: gathering weights is a collective
        if environment.global_rank == 0:
            result = apply_to_collection(result, torch.Tensor, _to_cpu)
            atomic_save({"result": result, "payload": payload}, os.path.join(folder, "rank0.pt"))
    except KeyboardInterrupt:
        sys.exit(130)  # Ctrl-C reached every process; the caller reports it
    except Preempted as stopped:  # every rank stopped at the same step, last.ckpt written
        if environment.global_rank == 0:
            _write_error_record(os.path.join(folder, "preempted.txt"), f"{stopped.checkpoint}\n{stopped.message}")
        sys.exit(stopped.code)
    except BaseException as error:  # the caller raises the first failure's traceback; the others are its echoes
        _write_error_record(os.path.join(folder, f"error{local_rank}.txt"), traceback.format_exc(), error)
        announce_teardown(f"rank {environment.global_rank} failed ({error_summary(error)})")  # the others end now
        sys.exit(1)


class SpawnLauncher:
    """Run ``function`` in N spawned processes; the caller gets rank 0's return value back.

    With ``trainer`` given, rank 0 also sends back the trained weights (loaded into the first
    ``nn.Module`` among ``args``), ``trainer.callback_metrics`` and ``logged_metrics`` (updated in
    place), ``current_epoch`` / ``global_step``, and the checkpoint callback's ``best_model_path`` /
    ``last_model_path`` / ``best_model_score``. The spawned processes start from the caller's RNG state
    (``seed_everything`` holds in them), and the loggers' version folder is fixed in the caller first,
    so every stage of one Trainer logs into one folder.

    Args:
        environment: the [`LocalEnvironment`][tandem.strategies.environments.LocalEnvironment] of this job.
        num_processes: processes per node.
        start_method: a ``torch.multiprocessing`` start method; "spawn" works everywhere.
    """

    def __init__(self, environment: LocalEnvironment, num_processes: int, start_method: str = "spawn") -> None:
        self.environment = environment
        self.num_processes = num_processes
        self.start_method = start_method

    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        if self.start_method == "fork" and torch.cuda.is_initialized():
            raise TandemConfigError(
                "strategy='ddp_notebook' / 'ddp_fork' starts the ranks by forking this process, and CUDA is already "
                "initialised in it (a tensor or module was put on a GPU, or a torch.cuda call ran before the "
                "Trainer): a forked process cannot use CUDA then. Restart the kernel and keep every CUDA call "
                "inside the Trainer (the module on the CPU until fit), or use strategy='ddp_spawn' with the "
                "classes in an importable module."
            )
        if self.start_method == "spawn":
            _check_importable_by_spawn([*args, *kwargs.values(), *(getattr(trainer, "callbacks", None) or [])])
        if getattr(mp.current_process(), "_inheriting", False):
            # A spawned process imports the user's script again; without the __main__ guard that import
            # reached this line. End quietly: the caller sees the exit code and explains (once).
            raise SystemExit(_NOT_GUARDED_EXIT)
        self.environment.export_rendezvous()  # the spawned processes inherit MASTER_ADDR / MASTER_PORT
        for logger in getattr(trainer, "loggers", None) or []:
            logger.version = logger.version  # fixed here: fit, test and log_dir all name one folder
        from tandem.utilities.seed import capture_rng_state

        rng_state = capture_rng_state()
        rng_state.pop("cuda", None)  # each rank seeds its own device from torch's seed
        folder = tempfile.mkdtemp(prefix="tandem-spawn-")
        context = mp.get_context(self.start_method)
        processes: list[Any] = []
        try:
            for local_rank in range(self.num_processes):
                process = context.Process(  # type: ignore[attr-defined]  # typeshed's BaseContext (for a str) lacks it
                    target=_spawned,
                    args=(local_rank, self.environment, function, args, kwargs, trainer, folder, rng_state),
                    name=f"tandem-rank-{local_rank}",
                )
                try:
                    process.start()
                except (TypeError, AttributeError, pickle.PicklingError) as err:
                    found = _unpicklable(err, [*args, *kwargs.values(), trainer, function])
                    if found is None:
                        raise
                    raise found from None
                processes.append(process)
            PREEMPTION.forward_to = lambda: [p.pid for p in processes if p.exitcode is None]  # signals reach them
            PREEMPTION.install()
            try:
                self._wait(processes, folder)
            finally:
                PREEMPTION.uninstall()
                PREEMPTION.forward_to, PREEMPTION.signum = None, None  # the ranks stop; this process has no loop
            result_path = os.path.join(folder, "rank0.pt")
            if not os.path.exists(result_path):  # global rank 0 runs on another node
                return None
            received = torch.load(result_path, weights_only=False)
        finally:
            _stop(processes)
            shutil.rmtree(folder, ignore_errors=True)
        if trainer is not None and received["payload"] is not None:
            module = next((a for a in args if isinstance(a, torch.nn.Module)), None)
            apply(trainer, received["payload"], module)
        return received["result"]

    def _wait(self, processes: list[Any], folder: str) -> None:
        """Until every process ended; the first failure (not its echoes in the others) is raised."""
        running = list(range(len(processes)))
        ended: list[int] = []  # in the order they were seen to end
        preempted_at: float | None = None  # a rank stopped for a pre-emption: the others stop at the same step
        while running:
            timeout = None if preempted_at is None else max(0.0, preempted_at + _PREEMPTED_WAIT_S - time.monotonic())
            ready = wait_for_any([processes[i].sentinel for i in running], timeout)
            for i in list(running):
                if processes[i].sentinel in ready:
                    processes[i].join()
                    running.remove(i)
                    ended.append(i)
            codes = [processes[i].exitcode for i in ended]
            if any(code != 0 and code not in PREEMPTED_EXIT_CODES for code in codes):
                break
            if preempted_at is None and any(code in PREEMPTED_EXIT_CODES for code in codes):
                preempted_at = time.monotonic()
            if not ready and running:
                break  # a rank did not follow the others' pre-emption stop: a failure
        else:
            stopped = sorted({processes[i].exitcode for i in ended} & PREEMPTED_EXIT_CODES)
            if stopped:
                raise _preempted_error(stopped[0], folder)
            return
        deadline = time.monotonic() + _SETTLE_S  # the others may end on their own: their records help decide
        while running and time.monotonic() < deadline:
            for i in list(running):
                if processes[i].exitcode is not None:
                    running.remove(i)
                    ended.append(i)
            time.sleep(0.02)
        _stop(processes)
        failed = [i for i in ended if processes[i].exitcode not in (0, *PREEMPTED_EXIT_CODES)]
        raise self._failure(processes, failed or [i for i in range(len(processes)) if i not in ended], folder)

    def _failure(self, processes: list[Any], failed: list[int], folder: str) -> Exception:
        started = {i for i in range(len(processes)) if os.path.exists(os.path.join(folder, f"started{i}"))}
        if any(processes[i].exitcode == _NOT_GUARDED_EXIT and i not in started for i in failed):
            return TandemConfigError(
                "strategy='ddp_spawn' starts each process by importing your script again, and this script starts "
                'training as it is imported (it has no `if __name__ == "__main__":` guard). Put the code that '
                'creates the Trainer and calls fit under `if __name__ == "__main__":`, or use strategy="ddp", '
                "which runs the whole script on every rank."
            )
        records = {i: _read_error_record(os.path.join(folder, f"error{i}.txt")) for i in failed}
        # A rank killed by a signal (other than an abort, which can be the echo of another's failure) failed
        # first: the others' errors are what its disappearance caused. Else the earliest written traceback.
        killed = [i for i in failed if processes[i].exitcode < 0 and -processes[i].exitcode != signal.SIGABRT]
        with_record = sorted((r[0], i) for i, r in records.items() if r is not None)
        first = killed[0] if killed else with_record[0][1] if with_record else failed[0]
        rank = self.environment.node_rank * self.num_processes + first
        ended = _how_it_ended(processes[first].exitcode)
        return RankFailedError(_failure_message("ddp_spawn: ", rank, ended, records[first]))


def _check_importable_by_spawn(objects: list[Any]) -> None:
    """A spawned process finds each class by importing its module; a class defined in the ``__main__`` of an
    interactive session (a notebook, ``python -c``) cannot be found that way."""
    if getattr(sys.modules.get("__main__"), "__file__", None) is not None:
        return  # a script: the spawned process imports it again (under its __main__ guard)
    found = next((type(o) for o in objects if type(o).__module__ == "__main__"), None)
    if found is not None:
        raise TandemConfigError(
            f"strategy='ddp_spawn' starts fresh processes that import each class by name, and {found.__name__} is "
            "defined in this interactive session (a notebook cell, python -c), which they cannot import. Use "
            "strategy='ddp_notebook', which forks this process so the class comes along, or move the class into a "
            ".py module and import it."
        )


def _preempted_error(code: int, folder: str) -> Preempted:
    """The caller's Preempted after every spawned rank stopped for a pre-emption signal (rank 0 said where)."""
    record = _read_error_record(os.path.join(folder, "preempted.txt"))
    checkpoint, _, message = record[1].partition("\n") if record is not None else ("", "", "")
    return Preempted(code - 128, checkpoint, message or "ddp_spawn: the ranks stopped for a pre-emption signal.")


def _stop(processes: list[Any]) -> None:
    """Terminate the processes still running; kill those that ignore it."""
    alive = [p for p in processes if p.exitcode is None and p.is_alive()]
    for process in alive:
        process.terminate()
    deadline = time.monotonic() + _TERMINATE_GRACE_S
    for process in alive:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.exitcode is None:
            process.kill()
            process.join()


# ---------------------------------------------------------------------------------------------- pickling


def _unpicklable(error: Exception, roots: list[Any]) -> TandemUserCodeError | None:
    """Name the attribute that ddp_spawn could not pickle (e.g. ``MyModule.writer._lock``) and the ways out."""
    for root in roots:
        if root is None or isinstance(root, (str, int, float, bool)):
            continue
        root = getattr(root, "__self__", root)  # a bound method pickles its object
        found = _find_unpicklable(root, type(root).__name__, set(), 0)
        if found is not None:
            path, cause, obj = found
            return TandemUserCodeError(
                f"strategy='ddp_spawn' sends your module, data and Trainer to each process it starts by pickling "
                f"them, and {path} (a {type(obj).__module__}.{type(obj).__qualname__}) cannot be pickled: {cause}. "
                "Use strategy='ddp', which starts the ranks by re-running your script and pickles nothing; or make "
                "it picklable: create it in setup() or a hook rather than __init__, or leave it out in __getstate__."
            )
    return None


def _find_unpicklable(obj: Any, path: str, seen: set[int], depth: int) -> tuple[str, Exception, Any] | None:
    """The deepest part of ``obj`` that fails to pickle on its own, as (attribute path, error, object)."""
    try:
        pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        return None
    except Exception as err:  # any error: pickling runs arbitrary __reduce__ code
        error = err
    if depth >= 16 or id(obj) in seen:
        return path, error, obj
    seen.add(id(obj))
    for name, part in _parts(obj):
        found = _find_unpicklable(part, f"{path}{name}", seen, depth + 1)
        if found is not None:
            return found
    return path, error, obj


def _parts(obj: Any) -> Iterator[tuple[str, Any]]:
    """What pickling ``obj`` pickles in turn, with the name to show for each."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield f"[{key!r}]", value
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for index, value in enumerate(obj):
            yield f"[{index}]", value
        return
    if isinstance(obj, functools.partial):
        yield ".func", obj.func
        yield ".args", obj.args
        yield ".keywords", obj.keywords
        return
    if hasattr(obj, "__self__") and not isinstance(obj, type):
        yield ".__self__", obj.__self__
        return
    try:
        state = obj.__getstate__() if hasattr(obj, "__getstate__") else getattr(obj, "__dict__", None)
    except Exception:
        return
    if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
        state = {**(state[0] or {}), **(state[1] or {})}
    if not isinstance(state, dict):
        return
    for key, value in state.items():
        if isinstance(obj, torch.nn.Module) and key in ("_modules", "_parameters", "_buffers") and value:
            for name, sub in value.items():  # show module.net.lock, not module._modules['net']
                yield f".{name}", sub
        else:
            yield f".{key}", value
