"""The side channel: how the ranks of one process group agree without a collective, and its two clients.

A :class:`SideChannel` owns the process group's key-value store (reached out of band: never a collective, so
a rank sitting in another collective, say DDP's gradient all-reduce, cannot turn the agreement itself into a
mismatch), this rank's watcher thread, and the beats the watcher posts once a second (where the main thread
is, whether it waits inside torch for other ranks, whether the script ended or failed). Two named clients
use it:

- :attr:`SideChannel.collective_check` (:class:`CollectiveCheck`): before each of tandem's own collectives
  outside the per-step hot path (set-up broadcasts, epoch and evaluation ends, checkpoint saves,
  ``should_stop``, metric reduction at logging steps) the ranks agree that they enter the same one. A
  collective that one rank enters and another does not (``trainer.save_checkpoint`` or ``trainer.test``
  under ``if trainer.is_global_zero:``, a rank whose script already ended) otherwise fails with the
  backend's text ("Connection closed by peer"), aborts the process, or waits for the whole process-group
  timeout (30 minutes). Its messages name the Trainer entry point each rank is in: the Trainer tags it
  with :func:`entry_point` (a context variable; nothing reads the call stack's variables for it).
- :attr:`SideChannel.preemption_vote` (:class:`PreemptionVote`, reached with :func:`preemption_vote`):
  after SIGTERM / SIGUSR1, which may reach one rank only, every rank stops at the same step.

The Strategy keeps placement and collectives; coordination between ranks lives here. The cost of a
checked collective is a few store round trips (no work on the per-step path);
``benchmarks/collective_check.py`` measures it.

Process-wide state, and why each piece is needed:

- ``_CHANNEL``, the side channel of the default process group. The group is joined once per process and
  outlives each Trainer and its strategy (``teardown`` keeps it, so that ``trainer.test()`` after
  ``fit()`` and a next Trainer in the same script use it again), so its channel is the group's, not a
  strategy's: the strategy that joins the group opens it (:func:`open_channel`), destroying the group closes
  it (:func:`close_channel`).
- ``_ENTRY_POINT``, a context variable: the Trainer entry point running now, set for a block.
- :data:`~tandem.utilities.preemption.PREEMPTION` (outside this module): the signal record. Signal handlers
  belong to the process, and the process that started the ranks forwards signals with no group joined.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

from tandem.utilities.excepthook import on_uncaught_exception, remove_listener
from tandem.utilities.exceptions import CollectiveMismatchError
from tandem.utilities.preemption import PREEMPTION, Position

__all__ = [
    "CallSite",
    "CollectiveCheck",
    "CollectiveMismatchError",
    "LocalVote",
    "PreemptionVote",
    "SideChannel",
    "close_channel",
    "current_channel",
    "entry_point",
    "new_run_id",
    "open_channel",
    "preemption_vote",
]

#: seconds a rank at a pre-emption stop waits for every rank to say where it stops
_PREEMPTION_WAIT_S = 60.0
#: how often the watcher posts this rank's beat (and a waiting rank looks for one that will never arrive)
_BEAT_S = 1.0

_TANDEM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # src/tandem
_STRATEGIES_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_BLOCKING = (  # where a main thread waits for other ranks inside torch
    f"{os.sep}torch{os.sep}distributed{os.sep}",
    f"{os.sep}torch{os.sep}autograd{os.sep}",
    f"{os.sep}torch{os.sep}nn{os.sep}parallel{os.sep}",
    f"{os.sep}torch{os.sep}_tensor.py",  # Tensor.backward
)
_FIX = (
    "Every rank must make the same Trainer calls (fit, validate, test, predict, save_checkpoint) and log "
    "the same synced values; guard only side effects (files, prints, uploads) with trainer.is_global_zero."
)

#: the Trainer entry point running now (see :func:`entry_point`)
_ENTRY_POINT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tandem_entry_point", default=None)


@contextlib.contextmanager
def entry_point(name: str) -> Iterator[None]:
    """Inside the block, tandem's collectives belong to the Trainer entry point ``name`` ("fit", "test",
    "save_checkpoint", ...; nested blocks: the innermost). ``trainer.test`` on one rank and
    ``trainer.validate`` on another pass through the same collectives, yet do not belong together: the
    collective check tells them apart by this name.

    Example::

        with entry_point("save_checkpoint"):
            strategy.barrier()  # a mismatch names "in Trainer.save_checkpoint"
    """
    token = _ENTRY_POINT.set(name)
    try:
        yield
    finally:
        _ENTRY_POINT.reset(token)


# ---------------------------------------------------------------------------------------------- call sites


@dataclass(frozen=True)
class CallSite:
    """Where a collective was asked for: tandem's own caller and entry point (the tag) and the user's line."""

    tag: str  # e.g. "barrier@Strategy.save_checkpoint in Trainer.fit" or "all_gather@user code"
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
        entry = _ENTRY_POINT.get()
        return cls(f"{op}@{internal or 'user code'}" + (f" in Trainer.{entry}" if entry else ""), _user_site(frame))


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


# ---------------------------------------------------------------------------------------------- the channel


class SideChannel:
    """One per process group: the store, this rank's watcher thread and its beats, and the two clients.

    Args:
        store: the process group's key-value store (``torch.distributed`` ``Store``).
        rank: this process's global rank.
        world_size: processes in the group.
        run_id: a token shared by every rank of this group (keys of another group, e.g. an earlier
            torchrun attempt sharing the store, are never read).
        main_thread: the thread whose stack the watcher samples (the one running the Trainer).

    Attributes:
        collective_check: agrees, before each checked collective, that every rank enters the same one.
        preemption_vote: agrees on the step every rank stops at after a pre-emption signal.
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
        self.prefix = f"tandem/side/{run_id}"
        self._beat_store = store.clone() if hasattr(store, "clone") else store  # the watcher's own connection
        self._main = main_thread or threading.main_thread()
        self._status = "running"
        self._exit_status = "exited (its script ended)"
        self._stop = threading.Event()
        self.collective_check = CollectiveCheck(self)
        self.preemption_vote = PreemptionVote(self)
        on_uncaught_exception(self.prefix, self._failed)
        atexit.register(lambda: self.close(self._exit_status))
        self._watcher = threading.Thread(target=self._watch, name="tandem-side-channel", daemon=True)
        self._watcher.start()

    def key(self, *parts: object) -> str:
        """A key of this group's channel: ``<prefix>/<part>/<part>...``."""
        return "/".join([self.prefix, *map(str, parts)])

    def beat(self, rank: int) -> _Beat | None:
        """The latest beat ``rank``'s watcher posted, or None before its first."""
        key = self.key("beat", rank)
        if not self.store.check([key]):
            return None
        status, blocked, where, last = self.store.get(key).decode().split("\n", 3)
        return _Beat(status, float(blocked), where, last)

    def _failed(self, kind: type[BaseException], error: BaseException, tb: Any) -> None:
        self._exit_status = f"failed ({kind.__name__}: {str(error).strip()[:300]})"

    def _watch(self) -> None:
        """The watcher thread: once a second, post where the main thread is; run the vote's share."""
        where, since = "", time.monotonic()
        while not self._stop.wait(_BEAT_S):
            now_where, blocked = _main_thread_position(self._main_frame())
            if now_where != where:
                where, since = now_where, time.monotonic()
            blocked_for = time.monotonic() - since if blocked else 0.0
            try:
                self._post_beat(self._status, blocked_for, where)
                self.preemption_vote._share(self._beat_store)
            except Exception:  # the store is gone (the job is ending): nothing more to report
                return

    def _post_beat(self, status: str, blocked_for: float, where: str) -> None:
        self._beat_store.set(
            self.key("beat", self.rank), f"{status}\n{blocked_for:.1f}\n{where}\n{self.collective_check.last}"
        )

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
        remove_listener(self.prefix)
        with contextlib.suppress(Exception):  # the store may already be closed at interpreter exit
            self._post_beat(status, 0.0, "")


@dataclass
class _Beat:
    status: str
    blocked_for: float
    where: str
    last: str

    @property
    def where_text(self) -> str:
        return f"Its last tandem collective was {self.last}. " if self.last else ""


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


# ---------------------------------------------------------------------------------------------- client 1


class CollectiveCheck:
    """The side channel's first client: before each checked collective, the ranks agree they enter the same.

    1. Each rank writes its ``n``-th check's tag (the operation, tandem's call site, the entry point) and its
       user-code call site under ``check/<n>/<rank>``, then counts itself in ``check/<n>/arrived``.
    2. The last rank to arrive reads every tag and writes the verdict: ``ok`` or the mismatch, both sides
       named. Every rank waits for the verdict and raises :class:`CollectiveMismatchError` if it is not ok.
    3. While it waits, a rank reads the beats of the ranks that have not arrived. A rank that ended its
       script, or whose main thread has sat in a torch collective or backward pass (for DDP: the gradient
       all-reduce, waiting for this rank) for ``stall_timeout`` seconds, will not arrive: the waiting ranks
       raise, naming it and where it is. A rank that is merely slow (still computing, or in user code such as
       ``prepare_data`` on rank 0) is waited for, up to the process-group timeout, as before.
    """

    def __init__(self, channel: SideChannel) -> None:
        self.channel = channel
        self.count = 0
        self.last = ""  # this rank's latest check, for the other ranks' messages (posted with each beat)

    def check(self, site: CallSite, stall_timeout: float = 60.0) -> None:
        """Agree with every other rank that this is the collective they enter next; raise if not.

        ``stall_timeout``: seconds a rank may sit in a torch collective or backward pass, not in this
        check, before the waiting ranks call it a mismatch.
        """
        channel, store = self.channel, self.channel.store
        self.count += 1
        n = self.count
        store.set(channel.key("check", n, channel.rank), f"{site.tag}\n{site.user}")
        self.last = f"check {n}: {_describe(site.tag, site.user)}"
        arrived = store.add(channel.key("check", n, "arrived"), 1)
        verdict_key = channel.key("check", n, "verdict")
        if arrived == channel.world_size:
            store.set(verdict_key, self._verdict(n))
        verdict = self._wait_for(verdict_key, n, site, stall_timeout)
        if n > 1:  # every rank has read check n - 1 (they all reached n): drop what this rank wrote for it
            _delete(store, channel.key("check", n - 1, channel.rank))
            if channel.rank == 0:
                _delete(store, channel.key("check", n - 1, "arrived"))
                _delete(store, channel.key("check", n - 1, "verdict"))
        if verdict != "ok":
            raise CollectiveMismatchError(verdict)

    def _verdict(self, n: int) -> str:
        keys = [self.channel.key("check", n, r) for r in range(self.channel.world_size)]
        entries = [v.decode().split("\n", 1) for v in _multi_get(self.channel.store, keys)]
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
        """Poll for ``key`` (the store's own timed wait logs a warning per timeout); every beat, look for a
        rank that will never arrive."""
        store, delay = self.channel.store, 0.0002
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
        channel = self.channel
        me = f"rank {channel.rank} entered {_describe(site.tag, site.user)}"
        for r in range(channel.world_size):
            if r == channel.rank or channel.store.check([channel.key("check", n, r)]):
                continue
            beat = channel.beat(r)
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


# ---------------------------------------------------------------------------------------------- client 2


class PreemptionVote:
    """The side channel's second client: after a pre-emption signal, the ranks agree where they all stop.

    A signal may reach one rank only (torchrun, srun, a signal sent by hand), and each rank sees it at a
    different step. The ranks agree on one stop position without any per-step work: the signal handler sets
    a local flag (:data:`~tandem.utilities.preemption.PREEMPTION`); each watcher shares it both ways (flag ->
    store key ``preempt/<round>/signal``, key -> flag) once a second. Each rank posts, once (compare_set), a
    position at or ahead of where it is: its watcher posts the batch its main thread is in (or the epoch end
    it is in), its main thread, if it gets there first, the position it stopped at. Every rank stops at the
    first stop point at or after the largest post. A rank blocked in a collective (waiting for a rank that
    already stopped to look at the flag) gets its post from its watcher, so nobody waits for it; DDP keeps
    the ranks within one step of each other, so the largest post is at most a step or two ahead of anyone.
    """

    def __init__(self, channel: SideChannel) -> None:
        self.channel = channel
        self._lock = threading.Lock()
        self._round = 0  # fits and pre-emption stops so far (keys of an earlier round are never read)
        self._seen = False  # this round's request is known both here and in the store
        self._target: Position | None = None

    def _key(self, name: str) -> str:
        return self.channel.key("preempt", self._round, name)

    def target(self, here: Position) -> Position:
        """Main thread, at a stop point with the flag set (``here``: epoch, batches done in it): the position
        every rank stops at, at or after ``here``. Posts ``here`` unless this rank's watcher posted first, and
        waits up to ``_PREEMPTION_WAIT_S`` (60 s) for every rank to post."""
        if self._target is not None:
            return self._target
        channel, store = self.channel, self.channel.store
        with self._lock:
            store.compare_set(self._key("signal"), "", str(PREEMPTION.signum))
            store.compare_set(self._key(f"stop/{channel.rank}"), "", _position_text(here))
            keys = [self._key(f"stop/{r}") for r in range(channel.world_size)]
        timeout = _PREEMPTION_WAIT_S
        deadline = time.monotonic() + timeout
        while not store.check(keys):
            if time.monotonic() > deadline:
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
                raise CollectiveMismatchError(
                    f"Pre-emption: rank {channel.rank} stopped at epoch {here[0]}, batch {here[1]} and waited "
                    f"{timeout:.0f} s for rank(s) {_ranks(missing)} to say where they stop; they did not answer "
                    "(stopped or hung). No checkpoint was written for this stop."
                )
            time.sleep(0.01)
        self._target = max(_parse_position(v) for v in _multi_get(store, keys))
        return self._target

    def new_round(self) -> None:
        """Every rank calls this at the start of each fit and after each pre-emption stop, so the rounds match:
        a stop's keys are never read again, and a signal still pending is shared afresh."""
        with self._lock:
            self._round += 1
            self._seen, self._target = False, None

    def _share(self, store: Any) -> None:
        """Watcher thread: share the local flag and the store key both ways; post this rank's position."""
        with self._lock:
            if not self._seen:
                if PREEMPTION.signum is not None:
                    store.compare_set(self._key("signal"), "", str(PREEMPTION.signum))
                elif store.check([self._key("signal")]):
                    PREEMPTION.request(int(store.get(self._key("signal"))))
                else:
                    return
                self._seen = True
            progress = PREEMPTION.progress
            if progress is not None:  # in a fit: where the main thread can stop next, at the earliest
                epoch, done, epoch_end = progress()
                ahead = (epoch + 1, 0) if epoch_end else (epoch, done + 1)
                store.compare_set(self._key(f"stop/{self.channel.rank}"), "", _position_text(ahead))


class LocalVote:
    """The pre-emption vote of a process with no side channel (one process, or no process group): it stops
    where it is."""

    def target(self, here: Position) -> Position:
        return here

    def new_round(self) -> None:
        pass


def preemption_vote() -> PreemptionVote | LocalVote:
    """This process's pre-emption vote: the process group's side channel's, or a :class:`LocalVote` when
    there is none.

    Example::

        preemption_vote().new_round()  # at the start of each fit
        if here >= preemption_vote().target(here):  # at a stop point, with a signal pending
            ...  # every rank stops here
    """
    return _CHANNEL.preemption_vote if _CHANNEL is not None else LocalVote()


# ---------------------------------------------------------------------------------------------- the group's


def new_run_id() -> str:
    """A fresh token for one process group (rank 0 makes it; the strategy broadcasts it)."""
    return uuid.uuid4().hex[:12]


def open_channel(store: Any, rank: int, world_size: int, run_id: str) -> SideChannel:
    """Open the side channel of the process group this process just joined (every rank, right after joining);
    any earlier group's channel is closed."""
    global _CHANNEL
    close_channel()
    _CHANNEL = SideChannel(store, rank, world_size, run_id)
    return _CHANNEL


def current_channel() -> SideChannel | None:
    """The side channel of this process's group, or None when no group was joined."""
    return _CHANNEL


def close_channel(status: str = "left its process group") -> None:
    """The process group is being destroyed: tell the other ranks, and let the next group open its own."""
    global _CHANNEL
    if _CHANNEL is not None:
        _CHANNEL.close(status)
    _CHANNEL = None


_CHANNEL: SideChannel | None = None


# ---------------------------------------------------------------------------------------------- helpers


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
