"""Checked collectives: before each of tandem's own collectives, the ranks agree on which one they enter.

A collective that one rank enters and another does not (``trainer.save_checkpoint`` or ``trainer.test``
under ``if trainer.is_global_zero:``, a rank whose script already ended) otherwise fails with the
backend's text ("Connection closed by peer"), aborts the process, or waits for the whole process-group
timeout (30 minutes). tandem's collectives outside the per-step hot path (set-up broadcasts, epoch and
evaluation ends, checkpoint saves, ``should_stop``, metric reduction at logging steps) first pass
through :meth:`CollectiveGuard.check`, which agrees *out of band*, through the process group's key-value
store (never a collective, so a rank sitting in another collective, say DDP's gradient all-reduce,
cannot turn the check itself into a mismatch):

1. Each rank writes its ``n``-th check's tag (the operation and tandem's call site) and its user-code
   call site under ``<prefix>/<n>/<rank>``, then counts itself in ``<prefix>/<n>/arrived``.
2. The last rank to arrive reads every tag and writes the verdict: ``ok`` or the mismatch, both sides
   named. Every rank waits for the verdict and raises :class:`CollectiveMismatchError` if it is not ok.
3. While it waits, a rank looks at the ranks that have not arrived. Each rank's watcher thread posts
   where its main thread is, once a second. A rank that ended its script, or whose main thread has sat
   in a torch collective or backward pass (for DDP: the gradient all-reduce, waiting for this rank) for
   ``stall_timeout`` seconds, will not arrive: the waiting ranks raise, naming it and where it is.

A rank that is merely slow (still computing, or in user code such as ``prepare_data`` on rank 0) is
waited for, up to the process-group timeout, as before. The cost is a few store round trips per checked
collective (no work on the per-step path); ``benchmarks/collective_check.py`` measures it.
"""

from __future__ import annotations

import atexit
import contextvars
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from tandem.utilities.preemption import PREEMPTION, Position

#: the Trainer entry point running now (set by ``side_channel.entry_point``; defined here, where it is read)
_ENTRY_POINT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tandem_entry_point", default=None)

_TANDEM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # src/tandem
_STRATEGIES_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_BLOCKING = (  # where a main thread waits for other ranks inside torch
    f"{os.sep}torch{os.sep}distributed{os.sep}",
    f"{os.sep}torch{os.sep}autograd{os.sep}",
    f"{os.sep}torch{os.sep}nn{os.sep}parallel{os.sep}",
    f"{os.sep}torch{os.sep}_tensor.py",  # Tensor.backward
)
_BEAT_S = 1.0
_FIX = (
    "Every rank must make the same Trainer calls (fit, validate, test, predict, save_checkpoint) and log "
    "the same synced values; guard only side effects (files, prints, uploads) with trainer.is_global_zero."
)


class CollectiveMismatchError(RuntimeError):
    """The ranks entered different collectives, or one rank will never enter the one the others wait in."""


@dataclass(frozen=True)
class CallSite:
    """Where a collective was asked for: tandem's own caller (part of the tag) and the user's line."""

    tag: str  # e.g. "barrier@Strategy.save_checkpoint" or "all_gather@user code"
    user: str  # e.g. "train.py:42 in main", or "" when no user frame is on the stack

    @classmethod
    def here(cls, op: str, depth: int = 2) -> CallSite:
        """The call site of the strategy collective ``op``, looking ``depth`` frames up from the caller."""
        frame: FrameType | None = sys._getframe(depth)
        internal = None
        while frame is not None and _in(frame, _STRATEGIES_DIR):
            frame = frame.f_back
        if frame is not None and _in(frame, _TANDEM_DIR) and not frame.f_code.co_filename.endswith("module.py"):
            internal = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
        user = _user_site(frame)
        entry = _ENTRY_POINT.get()  # tagged by the Trainer's stage runner (side_channel.entry_point)
        return cls(f"{op}@{internal or 'user code'}" + (f" in Trainer.{entry}" if entry else ""), user)


def _in(frame: FrameType, folder: str) -> bool:
    return frame.f_code.co_filename.startswith(folder)


def _user_site(frame: FrameType | None) -> str:
    """The innermost frame outside tandem and torch, as ``file.py:line in function``."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_TANDEM_DIR) and f"{os.sep}torch{os.sep}" not in name and "<frozen" not in name:
            return f"{os.path.basename(name)}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return ""


def _describe(tag: str, user: str) -> str:
    op, _, where = tag.partition("@")
    where, _, entry = where.partition(" in ")
    text = f"{op} (from {where}" + (f" in {entry}" if entry else "")
    return text + (f", called at {user})" if user else ")")


class CollectiveGuard:
    """One per process group: checks every tandem collective of this process (see the module docstring).

    Args:
        store: the process group's key-value store (``torch.distributed`` ``Store``).
        rank: this process's global rank.
        world_size: processes in the group.
        run_id: a token shared by every rank of this group (keys of another group, e.g. an earlier
            torchrun attempt sharing the store, are never read).
        main_thread: the thread whose stack the watcher samples (the one running the Trainer).
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        run_id: str,
        main_thread: threading.Thread | None = None,
    ) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.prefix = f"tandem/cc/{run_id}"
        self.count = 0
        self._main = main_thread or threading.main_thread()
        self._beat_store = store.clone() if hasattr(store, "clone") else store
        self._status = "running"
        self._last = ""  # this rank's latest check, for the others' messages
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="tandem-collective-watch", daemon=True)
        self._watcher.start()
        self._exit_status = "exited (its script ended)"
        self._preempt_lock = threading.Lock()
        self._preempt_round = 0  # fits and pre-emption stops so far (keys of an earlier round are never read)
        self._preempt_seen = False  # this round's request is known both here and in the store
        self._preempt_target: Position | None = None
        previous_hook = sys.excepthook

        def excepthook(kind: type[BaseException], error: BaseException, tb: Any) -> None:
            self._exit_status = f"failed ({kind.__name__}: {str(error).strip()[:300]})"
            previous_hook(kind, error, tb)

        sys.excepthook = excepthook
        atexit.register(lambda: self.close(self._exit_status))

    # ------------------------------------------------------------------ the check
    def check(self, site: CallSite, stall_timeout: float = 60.0) -> None:
        """Agree with every other rank that this is the collective they enter next; raise if not.

        ``stall_timeout``: seconds a rank may sit in a torch collective or backward pass, not in this
        check, before the waiting ranks call it a mismatch.
        """
        self.count += 1
        n, store = self.count, self.store
        store.set(f"{self.prefix}/{n}/{self.rank}", f"{site.tag}\n{site.user}")
        self._last = f"check {n}: {_describe(site.tag, site.user)}"
        arrived = store.add(f"{self.prefix}/{n}/arrived", 1)
        verdict_key = f"{self.prefix}/{n}/verdict"
        if arrived == self.world_size:
            store.set(verdict_key, self._verdict(n))
        verdict = self._wait_for(verdict_key, n, site, stall_timeout)
        if n > 1:  # every rank has read check n - 1 (they all reached n): drop what this rank wrote for it
            _delete(store, f"{self.prefix}/{n - 1}/{self.rank}")
            if self.rank == 0:
                _delete(store, f"{self.prefix}/{n - 1}/arrived")
                _delete(store, f"{self.prefix}/{n - 1}/verdict")
        if verdict != "ok":
            raise CollectiveMismatchError(verdict)

    def _verdict(self, n: int) -> str:
        keys = [f"{self.prefix}/{n}/{r}" for r in range(self.world_size)]
        entries = [v.decode().split("\n", 1) for v in _multi_get(self.store, keys)]
        tags = [tag for tag, _ in entries]
        if len(set(tags)) == 1:
            return "ok"
        groups: dict[str, list[int]] = {}
        for r, tag in enumerate(tags):
            groups.setdefault(tag, []).append(r)
        sides = "; ".join(
            f"rank{'s' if len(ranks) > 1 else ''} {_ranks(ranks)} entered {_describe(tag, entries[ranks[0]][1])}"
            for tag, ranks in groups.items()
        )
        return f"The ranks entered different collectives: {sides}. {_FIX}"

    def _wait_for(self, key: str, n: int, site: CallSite, stall_timeout: float) -> str:
        """Poll for ``key`` (the store's own timed wait logs a warning per timeout); every second, look
        for a rank that will never arrive."""
        store, delay = self.store, 0.0002
        diagnose_at = time.monotonic() + _BEAT_S
        while not store.check([key]):
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
            if time.monotonic() >= diagnose_at:
                problem = self._missing_rank_problem(n, site, stall_timeout)
                if problem is not None:
                    raise CollectiveMismatchError(problem)
                diagnose_at = time.monotonic() + _BEAT_S
        return store.get(key).decode()

    def _missing_rank_problem(self, n: int, site: CallSite, stall_timeout: float) -> str | None:
        """Why a rank that has not arrived at check ``n`` never will, or None while it may still come."""
        me = f"rank {self.rank} entered {_describe(site.tag, site.user)}"
        for r in range(self.world_size):
            if r == self.rank or self.store.check([f"{self.prefix}/{n}/{r}"]):
                continue
            beat = _read_beat(self.store, f"{self.prefix}/beat/{r}")
            if beat is None:
                continue
            if beat.status != "running":
                return f"Rank {r} {beat.status} while {me}. {beat.where_text}{_FIX}"
            if beat.blocked_for >= stall_timeout:
                return (
                    f"Rank {r} has waited {beat.blocked_for:.0f} s in a collective that this rank never enters, in "
                    f"{beat.where} (its last tandem collective was {beat.last or 'none'}), while {me}. {_FIX}"
                )
        return None

    # ------------------------------------------------------------------ the watcher
    def _watch(self) -> None:
        where, since = "", time.monotonic()
        while not self._stop.wait(_BEAT_S):
            now_where, blocked = _main_thread_position(self._main_frame())
            if now_where != where:
                where, since = now_where, time.monotonic()
            blocked_for = time.monotonic() - since if blocked else 0.0
            try:
                self._beat_store.set(
                    f"{self.prefix}/beat/{self.rank}", f"{self._status}\n{blocked_for:.1f}\n{where}\n{self._last}"
                )
                self._share_preemption()
            except Exception:  # the store is gone (the job is ending): nothing more to report
                return

    # ------------------------------------------------------------------ pre-emption
    # A pre-emption signal may reach one rank only (torchrun, srun, a signal sent by hand), and each rank sees
    # it at a different step. The ranks agree on one stop position without any per-step work: the signal
    # handler sets a local flag; each watcher shares it both ways (flag -> store key ``preempt/<round>``,
    # key -> flag) once a second. Each rank posts, once (compare_set), a position at or ahead of where it is:
    # its watcher posts the batch its main thread is in (or the epoch end it is in), its main thread, if it
    # gets there first, the position it stopped at. Every rank stops at the first stop point at or after the
    # largest post. A rank blocked in a collective (waiting for a rank that already stopped to look at the
    # flag) gets its post from its watcher, so nobody waits for it; DDP keeps the ranks within one step of
    # each other, so the largest post is at most a step or two ahead of anyone.
    def _preempt_key(self, name: str) -> str:
        return f"{self.prefix}/preempt/{self._preempt_round}/{name}"

    def _share_preemption(self) -> None:
        """Watcher thread: share the local flag and the store key both ways; post this rank's position."""
        with self._preempt_lock:
            store = self._beat_store
            if not self._preempt_seen:
                if PREEMPTION.signum is not None:
                    store.compare_set(self._preempt_key("signal"), "", str(PREEMPTION.signum))
                elif store.check([self._preempt_key("signal")]):
                    PREEMPTION.request(int(store.get(self._preempt_key("signal"))))
                else:
                    return
                self._preempt_seen = True
            progress = PREEMPTION.progress
            if progress is not None:  # in a fit: where the main thread can stop next, at the earliest
                epoch, done, epoch_end = progress()
                ahead = (epoch + 1, 0) if epoch_end else (epoch, done + 1)
                store.compare_set(self._preempt_key(f"stop/{self.rank}"), "", _position_text(ahead))

    def preemption_target(self, here: Position, timeout: float) -> Position:
        """Main thread, at a stop point with the flag set: the position every rank stops at (the first stop
        point at or after it). Posts ``here`` unless this rank's watcher posted first; waits for every rank."""
        if self._preempt_target is not None:
            return self._preempt_target
        store = self.store
        with self._preempt_lock:
            store.compare_set(self._preempt_key("signal"), "", str(PREEMPTION.signum))
            store.compare_set(self._preempt_key(f"stop/{self.rank}"), "", _position_text(here))
            keys = [self._preempt_key(f"stop/{r}") for r in range(self.world_size)]
        deadline = time.monotonic() + timeout
        while not store.check(keys):
            if time.monotonic() > deadline:
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
                raise CollectiveMismatchError(
                    f"Pre-emption: rank {self.rank} stopped at epoch {here[0]}, batch {here[1]} and waited "
                    f"{timeout:.0f} s for rank(s) {_ranks(missing)} to say where they stop; they did not answer "
                    "(stopped or hung). No checkpoint was written for this stop."
                )
            time.sleep(0.01)
        positions = [_parse_position(v) for v in _multi_get(store, keys)]
        self._preempt_target = max(positions)
        return self._preempt_target

    def new_preemption_round(self) -> None:
        """Every rank calls this at the start of each fit and after each pre-emption stop, so the rounds match:
        a stop's keys are never read again, and a signal still pending is shared afresh."""
        with self._preempt_lock:
            self._preempt_round += 1
            self._preempt_seen, self._preempt_target = False, None

    def _main_frame(self) -> FrameType | None:
        # Returned, never kept in the watcher's variables: a frame held while the watcher sleeps would keep a
        # finished fit's frames, and the Trainer and module in their variables, alive.
        return sys._current_frames().get(self._main.ident) if self._main.ident is not None else None

    def close(self, status: str = "exited") -> None:
        """Tell the other ranks this process is leaving (at exit, or when its group is destroyed)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._status = status
        try:
            self._beat_store.set(f"{self.prefix}/beat/{self.rank}", f"{status}\n0\n\n{self._last}")
        except Exception:  # noqa: S110 - the store may already be closed at interpreter exit
            pass


@dataclass
class _Beat:
    status: str
    blocked_for: float
    where: str
    last: str

    @property
    def where_text(self) -> str:
        return f"Its last tandem collective was {self.last}. " if self.last else ""


def _read_beat(store: Any, key: str) -> _Beat | None:
    if not store.check([key]):
        return None
    status, blocked, where, last = store.get(key).decode().split("\n", 3)
    return _Beat(status, float(blocked), where, last)


def _main_thread_position(frame: FrameType | None) -> tuple[str, bool]:
    """Where the main thread is, as text, and whether it waits inside torch (a collective or a backward
    pass) for other ranks. The text changes whenever the innermost frame moves."""
    if frame is None:
        return "", False
    code = frame.f_code
    blocked = any(part in code.co_filename for part in _TORCH_BLOCKING)
    inner = f"{code.co_name} ({os.path.basename(code.co_filename)}:{frame.f_lineno})"
    user = _user_site(frame)
    where = f"torch's {inner}" if blocked else inner
    return (f"{where}, called at {user}" if user else where), blocked


def _position_text(position: Position) -> str:
    return f"{position[0]} {position[1]}"


def _parse_position(value: bytes) -> Position:
    epoch, done = value.decode().split()
    return int(epoch), int(done)


def _multi_get(store: Any, keys: list[str]) -> list[bytes]:
    if hasattr(store, "multi_get"):
        return store.multi_get(keys)
    return [store.get(k) for k in keys]


def _delete(store: Any, key: str) -> None:
    try:
        store.delete_key(key)
    except Exception:  # noqa: S110 - some stores (FileStore) cannot delete: the key only costs memory
        pass


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def new_run_id() -> str:
    """A fresh token for one process group (rank 0 makes it; the strategy broadcasts it)."""
    return uuid.uuid4().hex[:12]


def guard_for_group(factory: Callable[[], CollectiveGuard]) -> CollectiveGuard:
    """The process's guard for the default process group, made once by ``factory``."""
    global _GUARD
    if _GUARD is None:
        _GUARD = factory()
    return _GUARD


def current_guard() -> CollectiveGuard | None:
    """This process's guard, or None when checks are off or no group was joined."""
    return _GUARD


def forget_guard() -> None:
    """The process group was destroyed: the next one gets a new guard."""
    global _GUARD
    if _GUARD is not None:
        _GUARD.close("left its process group")
    _GUARD = None


_GUARD: CollectiveGuard | None = None
