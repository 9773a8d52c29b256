"""The failure watchdog: rank 0 watches the ranks it started until they end, and one failing ends the whole job
(raised as a RankFailedError in rank 0's main thread); and the parent watch: a started rank ends when its
launcher is gone."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tandem.strategies.launchers.records import (
    _broken_collective,
    _exit_code,
    _failure_message,
    _how_it_ended,
    _is_echo,
    _kind,
    _last_line,
    _read_error_record,
    _Record,
)
from tandem.strategies.side_channel import announce_teardown, current_channel, error_summary
from tandem.utilities.excepthook import on_uncaught_exception
from tandem.utilities.exceptions import CollectiveMismatchError, HangError, Preempted, RankFailedError, add_note
from tandem.utilities.preemption import EXIT_CODES as PREEMPTED_EXIT_CODES
from tandem.utilities.preemption import PREEMPTION
from tandem.utilities.processes import end_with_parent

_POLL_S = 0.1
#: seconds the started ranks get, after rank 0 declared a hang, to print their stacks and end on their own (a rank
#: stopped first prints nothing: at 8 ranks the first to end would otherwise stop the rest within a beat)
_HANG_STACKS_S = 3.0
_TERMINATE_GRACE_S = 5.0
_ECHO_WAIT_S = 2.0  # how long rank 0, its collective broken, waits to see whether a started rank failed first
_INTERRUPT_WAIT_S = 3.0  # a started rank ended by Ctrl-C: how long rank 0's main thread has to show its own
_SAME_ERROR_WAIT_S = 0.5  # how long rank 0, failing on its own, waits for started ranks raising the same error
_HANDLING_GRACE_S = 30.0  # rank 0 busy with an exception of its own is left to finish it this long
_RESPONSE_S = 15.0  # rank 0, told to raise, must do so within this; else the process is ended
_ABORT_AFTER_S = 3.0  # rank 0 still blocked this long after the wake-up signal: abort an NCCL process group
# The signal that wakes rank 0's main thread to raise RankFailedError (a real-time one: nobody else's)
_WAKE_SIGNAL = signal.SIGRTMIN + 5 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2


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
            add_note(error, f"[tandem] ranks {ranks} raised this error (only rank {self.rank}'s traceback is shown).")
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
