"""The side channel: how the ranks of one process group agree without a collective, and its three clients.

A ``SideChannel`` owns the process group's key-value store (reached out of band: never a collective, so
a rank sitting in another collective, say DDP's gradient all-reduce, cannot turn the agreement itself into a
mismatch), this rank's watcher thread, and the beats the watcher posts once a second (where the main thread
is, whether it waits inside torch for other ranks, whether the script ended or failed). Three named clients
use it:

- ``SideChannel.collective_check`` (``CollectiveCheck``): before each of tandem's own collectives
  outside the per-step hot path (set-up broadcasts, epoch and evaluation ends, checkpoint saves,
  ``should_stop``, metric reduction at logging steps) the ranks agree that they enter the same one. A
  collective that one rank enters and another does not (``trainer.save_checkpoint`` or ``trainer.test``
  under ``if trainer.is_global_zero:``, a rank whose script already ended) otherwise fails with the
  backend's text ("Connection closed by peer"), aborts the process, or waits for the whole process-group
  timeout (30 minutes). Its messages name the Trainer entry point each rank is in: the Trainer tags it
  with ``entry_point`` (a context variable; nothing reads the call stack's variables for it).
- ``SideChannel.preemption_vote`` (``PreemptionVote``, reached with ``preemption_vote``):
  after SIGTERM / SIGUSR1, which may reach one rank only, every rank stops at the same step.
- `SideChannel.skip_agreement` (`SkipAgreement`, reached with `skip_agreement`): a
  ``training_step`` that returned None on one rank while another ran backward is named at once (only a batch that
  returned None does any work).

The beats also carry each rank's place: the stage, epoch, batch and step its fit loop publishes with
``placed`` (a callable the watcher reads once a beat: nothing runs per step), and, sampled from the main
thread's stack, the hook it is in and the user's line. With a ``hang_timeout`` (the strategy's), rank 0's watcher
watches for a hang anywhere, not only in tandem's own collectives: when, during a fit, no rank's place or stack
moves for that long (DDP's all-reduce after one rank skipped ``backward``, a ``torch.distributed`` call on one
rank, a data loader blocked on one rank), it prints a table of where each rank is and its own stack; the other
ranks print theirs (``faulthandler``) and end with ``HANG_EXIT``, and rank 0 raises
[`HangError`][tandem.utilities.exceptions.HangError] with the table (its collective breaks as they end; under tandem's
launcher the launcher raises it).

The channel also carries how the job ends. A rank posts how it left (``ended its script normally (after
Trainer.fit returned)``, ``(sys.exit(0) at train.py:12 in training_step inside Trainer.fit)``, ``failed
(ValueError: ...)``, ``was interrupted (KeyboardInterrupt)``, ``stopped the job (CollectiveMismatchError: ...)``); a
rank whose collective then breaks inside torch (gloo's "Connection closed by peer")
raises [`RankFailedError`][tandem.utilities.exceptions.RankFailedError] naming that rank and where it was
(``SideChannel.explain``, at the Trainer entry point). A failing rank, or the launcher stopping the job, announces the
teardown (``announce_teardown``): a SIGTERM that follows (torchrun's, tandem's launcher's) ends a rank at once
instead of starting a pre-emption stop, and a rank blocked in a collective waiting for the launching rank
ends from its watcher.

What the store is trusted with. The store listens on every interface without authentication (torchrun's does too):
anyone who reaches its port can list, read, write and delete keys. So every value that controls the job (beats,
check tags, differ records and verdicts, teardown, stopping, the hang declaration, the pre-emption signal and stop
positions) is signed (``SignedStore``): an HMAC-SHA256 with a per-job secret that rank 0 draws and broadcasts
over the process group's own backend with the run id (never through the store), over the key's full name and the
value. A value that is not signed by this job (an outsider's, a malformed one) reads as absent and is reported once
on stderr. The counters the store keeps with ``add`` (``arrived``, ``posted``, ``moved``) cannot be signed: they are
hints that wake the ranks or save requests, and nothing the job does rests on them alone.

The Strategy keeps placement and collectives; coordination between ranks lives here. The cost of a
checked collective is a few store round trips (no work on the per-step path);
``benchmarks/collective_check.py`` measures it.

Process-wide state, and why each piece is needed:

- ``_CHANNEL``, the side channel of the default process group. The group is joined once per process and
  outlives each Trainer and its strategy (``teardown`` keeps it, so that ``trainer.test()`` after
  ``fit()`` and a next Trainer in the same script use it again), so its channel is the group's, not a
  strategy's: the strategy that joins the group opens it (``open_channel``), destroying the group closes
  it (``close_channel``).
- ``_ENTRY_POINT``, a context variable: the Trainer entry point running now, set for a block.
- ``PREEMPTION`` (outside this module): the signal record. Signal handlers
  belong to the process, and the process that started the ranks forwards signals with no group joined.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import faulthandler
import hashlib
import hmac
import itertools
import os
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

from tandem.utilities.excepthook import on_uncaught_exception, remove_listener
from tandem.utilities.exceptions import CollectiveMismatchError, HangError, RankFailedError
from tandem.utilities.preemption import PREEMPTION, Position

__all__ = [
    "CallSite",
    "CollectiveCheck",
    "CollectiveMismatchError",
    "HANG_EXIT",
    "LocalVote",
    "Place",
    "TORN_DOWN_EXIT",
    "announce_teardown",
    "broke_in_torch",
    "error_summary",
    "PreemptionVote",
    "SideChannel",
    "SignedStore",
    "SkipAgreement",
    "close_channel",
    "current_channel",
    "entry_point",
    "new_run_id",
    "new_secret",
    "open_channel",
    "placed",
    "preemption_vote",
    "report_for_the_job",
    "skip_agreement",
]

#: seconds a rank at a pre-emption stop waits for every rank to say where it stops
_PREEMPTION_WAIT_S = 60.0
#: how often the watcher posts this rank's beat (and a waiting rank looks for one that will never arrive)
_BEAT_S = 1.0
#: store requests a second that the ranks waiting in a collective check make together, at most, once they have
#: waited a while (a rank polls every 20 ms, or every N / _POLL_BUDGET seconds at N ranks when that is longer)
_POLL_BUDGET = 5000.0
_WATCHER_JOIN_S = 10.0  # the longest close() waits for the watcher's store call to return

_TANDEM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # src/tandem
_STRATEGIES_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_BLOCKING = (  # where a main thread waits for other ranks inside torch
    f"{os.sep}torch{os.sep}distributed{os.sep}",
    f"{os.sep}torch{os.sep}autograd{os.sep}",
    f"{os.sep}torch{os.sep}nn{os.sep}parallel{os.sep}",
    f"{os.sep}torch{os.sep}_tensor.py",  # Tensor.backward
)
_LIBRARIES = (f"{os.sep}torch{os.sep}", f"{os.sep}lightning_utilities{os.sep}")
#: about the most characters of an error's message that `error_summary` quotes (a status, a teardown reason)
_SUMMARY_LIMIT = 300
#: seconds a rank whose collective broke waits for the rank that left to say so (it posts before its sockets close)
_ANNOUNCE_WAIT_S = 2.0
#: how a rank whose main thread waited in a collective ends when the job is torn down (as by SIGTERM: 128 + 15)
TORN_DOWN_EXIT = 143
#: how a rank other than 0 ends after a hang was declared (its stack printed; rank 0 raises HangError); timeout(1)'s
HANG_EXIT = 124
#: seconds rank 0's main thread has, after a hang was declared, to raise HangError before the process ends itself
_HANG_RESPONSE_S = 10.0
#: a value's signature: HMAC-SHA256 in hex, ahead of the value
_MAC_LEN = 64
#: values not signed by this job that one channel reports (one line each, once per key), at most: a flood is not
_REPORT_LIMIT = 20
#: times a first-writer-wins write replaces a value not signed by this job before it simply sets its own
_REPLACE_TRIES = 10
#: the ``moved`` counter stays in [0, _MOVES_LIMIT) until rank 0 declares a hang (it then subtracts 2**62)
_MOVES_LIMIT = 1 << 61
#: where a rank's loop is, as the watcher reads it: (stage, epoch, batch in the epoch, global step)
Place = tuple[str | None, int, int, int]
_HOOK_NAMES = frozenset(
    {"training_step", "validation_step", "test_step", "predict_step", "backward", "optimizer_step"}
    | {"optimizer_zero_grad", "configure_optimizers", "prepare_data", "setup", "teardown"}
)
_DATA_LOADING = f"{os.sep}torch{os.sep}utils{os.sep}data{os.sep}"
_THIS_FILE = os.path.abspath(__file__).removesuffix("c")  # side_channel.py
_FIX_LIMITS = (
    "Every rank must make the same Trainer calls with the same limits (max_epochs, max_steps, limit_*_batches), "
    "and none may end its script (sys.exit, return) while the others still train."
)
_FIX = (
    "Every rank must make the same Trainer calls (fit, validate, test, predict, save_checkpoint) and log "
    "the same synced values; guard only side effects (files, prints, uploads) with trainer.is_global_zero."
)
_FIX_STALLED = (
    "Every rank must enter the same collectives: make the same Trainer calls (fit, validate, test, predict, "
    "save_checkpoint), log the same synced values and call torch.distributed collectives (dist.barrier, "
    "all_reduce) on every rank; guard only side effects (files, prints, uploads) with trainer.is_global_zero."
)

#: the Trainer entry point running now (see ``entry_point``)
_ENTRY_POINT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tandem_entry_point", default=None)


@contextlib.contextmanager
def entry_point(name: str) -> Iterator[None]:
    """Inside the block, tandem's collectives belong to the Trainer entry point ``name`` ("fit", "test",
    "save_checkpoint", ...; nested blocks: the innermost). ``trainer.test`` on one rank and
    ``trainer.validate`` on another pass through the same collectives, yet do not belong together: the
    collective check tells them apart by this name.

    Example:
        ```python
        with entry_point("save_checkpoint"):
            strategy.barrier()  # a mismatch names "in Trainer.save_checkpoint"
        ```
    """
    outermost = _ENTRY_POINT.get() is None
    token = _ENTRY_POINT.set(name)
    try:
        yield
    except SystemExit as stop:
        if outermost and _CHANNEL is not None and type(stop) is SystemExit:  # Preempted has its own report
            _CHANNEL.left = f"{_exit_call(stop)} inside Trainer.{name}"
        raise
    except BaseException as error:
        explained = _CHANNEL.explain(error, name) if outermost and _CHANNEL is not None else None
        if explained is not None:
            raise explained from None  # the backend's text is in the message, once
        raise
    else:
        if outermost and _CHANNEL is not None:
            _CHANNEL.left = f"after Trainer.{name} returned"
    finally:
        _ENTRY_POINT.reset(token)


@contextlib.contextmanager
def placed(place: Callable[[], Place]) -> Iterator[None]:
    """Inside the block, ``place()`` says where this rank's loop is: (stage, epoch, batch, global step). The
    watcher thread calls it once a beat (nothing runs per step: it reads the loop's own counters); a hang's table
    shows it. Nothing happens without a side channel.

    Example:
        ```python
        with placed(lambda: (state.stage, loop.epoch, loop.batches_done, loop.global_step)):
            ...  # the fit
        ```
    """
    channel = _CHANNEL
    if channel is None:
        yield
        return
    previous, channel.place = channel.place, place
    try:
        yield
    finally:
        channel.place = previous


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
        while frame is not None and (_in(frame, _STRATEGIES_DIR) or _in_library(frame)):
            frame = frame.f_back
        if frame is not None and _in(frame, _TANDEM_DIR) and not frame.f_code.co_filename.endswith("module.py"):
            internal = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
        entry = _ENTRY_POINT.get()
        return cls(f"{op}@{internal or 'user code'}" + (f" in Trainer.{entry}" if entry else ""), _user_site(frame))


def _in(frame: FrameType, folder: str) -> bool:
    return frame.f_code.co_filename.startswith(folder)


def _in_library(frame: FrameType) -> bool:
    """A frame of torch or lightning-utilities (``self.all_gather`` goes through ``apply_to_collection``)."""
    name = frame.f_code.co_filename
    return any(part in name for part in _LIBRARIES) or name.startswith("<frozen")


def _user_site(frame: FrameType | None) -> str:
    """The innermost frame outside tandem, torch and lightning-utilities, as ``file.py:line in function``."""
    while frame is not None:
        if not _in(frame, _TANDEM_DIR) and not _in_library(frame):
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return ""


def _exit_call(stop: SystemExit) -> str:
    """``sys.exit(0) at train.py:12 in training_step``: where a SystemExit was raised, in the user's code."""
    tb, user = stop.__traceback__, ""
    while tb is not None:  # the innermost user frame of the traceback
        if not _in(tb.tb_frame, _TANDEM_DIR) and not _in_library(tb.tb_frame):
            user = f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    code = 0 if stop.code is None else stop.code
    return f"sys.exit({code!r})" + (f" at {user}" if user else "")


def _describe(tag: str, user: str) -> str:
    op, _, where = tag.partition("@")
    where, _, entry = where.partition(" in ")
    text = f"{op} (from {where}" + (f" in {entry}" if entry else "")
    return text + (f", called at {user})" if user else ")")


# ---------------------------------------------------------------------------------------------- the signed store


class SignedStore:
    """The process group's store as the side channel reads and writes it: only values this job signed count.

    Every value written carries an HMAC-SHA256, keyed with the job's secret, over the key's full name and the value
    (a signed value cannot be forged, nor moved to another key). A value read counts only when its signature holds;
    any other (an outsider's, a malformed one) reads as absent, and the first time a key holds one, a ``[tandem]``
    line on stderr says so (at most ``_REPORT_LIMIT`` lines a channel). Counters (``add``) cannot be signed:
    callers take them as hints and act on signed values only.

    Args:
        store: the process group's ``torch.distributed`` store.
        secret: the job's secret, the same on every rank (rank 0 draws it with ``new_secret`` and broadcasts it
            over the process group's backend: it never goes through the store).

    Example:
        ```python
        store = SignedStore(dist.distributed_c10d._get_default_store(), secret)
        store.set("tandem/side/ab12/teardown", "rank 1 failed")
        store.get("tandem/side/ab12/teardown")  # "rank 1 failed"; None if an outsider wrote it
        ```
    """

    def __init__(self, store: Any, secret: bytes, reported: set[str] | None = None) -> None:
        self.raw, self._secret = store, secret
        self._reported = reported if reported is not None else set()  # shared with clones: once per key, per channel
        self._lock = threading.RLock()  # a signal handler may read the store (torn_down) while this thread reports

    def clone(self) -> SignedStore:
        """The same store and secret over a connection of its own (for another thread)."""
        return SignedStore(self.raw.clone() if hasattr(self.raw, "clone") else self.raw, self._secret, self._reported)

    def seal(self, key: str, payload: str) -> bytes:
        """``payload`` signed for ``key``: the value to write there."""
        data = payload.encode()
        return self._mac(key, data) + data

    def open(self, key: str, value: bytes) -> str | None:
        """The payload of ``value`` read at ``key``, or None (reported once) when this job did not sign it there."""
        data = value[_MAC_LEN:]
        if len(value) >= _MAC_LEN and hmac.compare_digest(value[:_MAC_LEN], self._mac(key, data)):
            with contextlib.suppress(UnicodeDecodeError):
                return data.decode()
        self._report(key)
        return None

    def _mac(self, key: str, data: bytes) -> bytes:
        return hmac.new(self._secret, key.encode() + b"\0" + data, hashlib.sha256).hexdigest().encode()

    def _report(self, key: str) -> None:
        with self._lock:
            if key in self._reported or len(self._reported) >= _REPORT_LIMIT:
                return
            self._reported.add(key)
            last = len(self._reported) == _REPORT_LIMIT
        with contextlib.suppress(Exception):  # (a print inside a print, from a signal handler): the value stays ignored
            print(
                f"[tandem] ignored {key} in the process group's store: its value is not signed by this job (an "
                "outsider wrote it, or it is malformed); the job goes on as if the key were absent."
                + (f" Further such keys are not reported ({_REPORT_LIMIT} were)." if last else ""),
                file=sys.stderr,
                flush=True,
            )

    # ------------------------------------------------------------------ signed values
    def set(self, key: str, payload: str) -> None:
        self.raw.set(key, self.seal(key, payload))

    def get(self, key: str, present: bool = False) -> str | None:
        """The payload at ``key``; None when the key is absent or not signed by this job. ``present``: the caller
        just saw the key (one request instead of two)."""
        if not present and not self.raw.check([key]):
            return None
        return self.open(key, self.raw.get(key))

    def get_all(self, keys: list[str]) -> list[str | None] | None:
        """The payloads at ``keys`` (None for one not signed by this job), in one request; None while one is absent."""
        if not self.raw.check(keys):
            return None
        values = self.raw.multi_get(keys) if hasattr(self.raw, "multi_get") else [self.raw.get(k) for k in keys]
        return [self.open(k, v) for k, v in zip(keys, values)]

    def first(self, key: str, payload: str) -> str:
        """Write ``payload`` at ``key`` unless a signed value is there: the first signed payload, which every writer
        gets back. A value this job did not sign (an outsider wrote it first) is replaced: only that exact value, so
        that of several ranks replacing it one wins and the others read its payload."""
        mine = self.seal(key, payload)
        current = self.raw.compare_set(key, "", mine)
        for _ in range(_REPLACE_TRIES):
            if current == mine:
                return payload
            found = self.open(key, current)
            if found is not None:
                return found
            current = self.raw.compare_set(key, current, mine)
        self.raw.set(key, mine)  # an outsider keeps rewriting the key
        return payload

    def append(self, key: str, record: str) -> None:
        """Add ``record`` (text without NUL) to the records at ``key``."""
        self.raw.append(key, b"\0" + self.seal(key, record) + b"\0")  # NUL-framed: bytes appended around it stay apart

    def records(self, key: str) -> list[str]:
        """The signed records at ``key`` (none when it is absent); anything else appended there is skipped."""
        if not self.raw.check([key]):
            return []
        found = [self.open(key, part) for part in self.raw.get(key).split(b"\0") if part]
        return [record for record in found if record is not None]

    # ------------------------------------------------------------------ unsigned: hints
    def add(self, key: str, amount: int) -> int:
        """Add to the counter at ``key``: anyone can, so the count is a hint."""
        return int(self.raw.add(key, amount))

    def check(self, keys: list[str]) -> bool:
        """Whether every key is present (signed or not)."""
        return bool(self.raw.check(keys))

    def delete(self, key: str) -> None:
        with contextlib.suppress(Exception):  # some stores (FileStore) cannot delete: the key only costs memory
            self.raw.delete_key(key)


# ---------------------------------------------------------------------------------------------- the channel


class SideChannel:
    """One per process group: the store, this rank's watcher thread and its beats, and the two clients.

    Args:
        store: the process group's key-value store (``torch.distributed`` ``Store``).
        rank: this process's global rank.
        world_size: processes in the group.
        run_id: a token shared by every rank of this group (keys of another group, e.g. an earlier
            torchrun attempt sharing the store, are never read).
        secret: the group's secret, shared by every rank over the group's backend (never through the store):
            every value the channel writes is signed with it, and it reads only values signed with it.
        main_thread: the thread whose stack the watcher samples (the one running the Trainer).

    Attributes:
        collective_check: agrees, before each checked collective, that every rank enters the same one.
        preemption_vote: agrees on the step every rank stops at after a pre-emption signal.
        skip_agreement: agrees that a batch ``training_step`` skipped (returned None) is skipped on every rank.
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        run_id: str,
        secret: bytes,
        main_thread: threading.Thread | None = None,
    ) -> None:
        self.store, self.rank, self.world_size = SignedStore(store, secret), rank, world_size
        self.prefix = f"tandem/side/{run_id}"
        self._beat_store = self.store.clone()  # the watcher's own connection
        self._main = main_thread or threading.main_thread()
        self._status = "running"
        self._failure: str | None = None  # "failed (...)": an uncaught exception ends this rank's script
        self._tore_down = False  # this rank announced the job's teardown (it ends it; the others follow)
        #: how this rank last left a Trainer entry point ("after Trainer.fit returned", "sys.exit(0) at ...
        #: inside Trainer.fit"): what the other ranks are told when its script ends
        self.left = ""
        #: where this rank's loop is (see ``placed``); read by the watcher, once a beat
        self.place: Callable[[], Place] | None = None
        #: seconds without progress on any rank after which rank 0 declares a hang (None: never)
        self.hang_timeout: float | None = None
        #: the hang rank 0 declared (the table of where each rank was), or None
        self.hang: str | None = None
        self._stalled: tuple[int, float] | None = None  # rank 0: the ranks' moves counted, and since when
        self._beats = itertools.count(1)  # this rank's beats, numbered: a beat older than one read is a replay
        self._latest: dict[int, int] = {}  # each rank's latest beat read here (its number)
        self._skipped = False  # the watcher reported a beat it skipped (once)
        self._stop = threading.Event()
        self.collective_check = CollectiveCheck(self)
        self.preemption_vote = PreemptionVote(self)
        self.skip_agreement = SkipAgreement(self)
        on_uncaught_exception(self.prefix, self._failed)
        PREEMPTION.teardown = self.torn_down  # a SIGTERM while the job is torn down is not a pre-emption
        atexit.register(lambda: self.close(self._exit_status()))
        self._watcher = threading.Thread(target=self._watch, name="tandem-side-channel", daemon=True)
        self._watcher.start()

    def key(self, *parts: object) -> str:
        """A key of this group's channel: ``<prefix>/<part>/<part>...``."""
        return "/".join([self.prefix, *map(str, parts)])

    def beat(self, rank: int) -> _Beat | None:
        """The latest beat ``rank``'s watcher posted, or None before its first (or when the key holds a value this
        job did not sign, or a beat older than one read before)."""
        return self._fresh(rank, self.store.get(self.key("beat", rank)))

    def beats(self, store: SignedStore | None = None) -> list[_Beat | None] | None:
        """Every rank's latest beat, in one request (None for a rank whose key holds a value this job did not sign,
        or a beat older than one read before); None until every rank posted its first."""
        payloads = (store or self.store).get_all([self.key("beat", r) for r in range(self.world_size)])
        return None if payloads is None else [self._fresh(r, payload) for r, payload in enumerate(payloads)]

    def _fresh(self, rank: int, payload: str | None) -> _Beat | None:
        beat = _Beat.parse(payload) if payload is not None else None
        if beat is None or beat.number < self._latest.get(rank, 0):  # an older beat written again: a replay
            return None
        self._latest[rank] = beat.number
        return beat

    def _failed(self, kind: type[BaseException], error: BaseException, tb: Any) -> None:
        """Uncaught exception: this rank fails, so the job is torn down (the others end at once, see torn_down)."""
        if isinstance(error, KeyboardInterrupt):  # Ctrl-C: no failure of this rank's (it reaches the whole group)
            self._failure = "was interrupted (KeyboardInterrupt)"
        elif isinstance(error, CollectiveMismatchError):  # it found the ranks in different collectives
            self._failure = f"stopped the job ({error_summary(error)})"
        else:
            self._failure = f"failed ({error_summary(error)})"
        self.announce_teardown(f"rank {self.rank} {self._failure}")

    def _exit_status(self) -> str:
        """What the other ranks read when this rank's script ends (posted at exit)."""
        if self._failure is not None:
            return self._failure
        if self.left.startswith("sys.exit(") and not self.left.startswith(("sys.exit(0)", "sys.exit(None)")):
            return f"ended its script with {self.left}"
        return "ended its script normally" + (f" ({self.left})" if self.left else "")

    # ------------------------------------------------------------------ teardown
    def announce_teardown(self, reason: str, stopping: bool = False) -> None:
        """The job is ending (a rank failed, or the launcher is stopping every rank): tell every rank, so that a
        SIGTERM that follows is not taken for a pre-emption. ``stopping``: this process stops the others and
        stays alive meanwhile (tandem's launcher in rank 0), so a rank blocked in a collective waiting for it
        ends at once (a rank that fails instead closes its connections as it exits: the collective breaks)."""
        self._tore_down = True
        with contextlib.suppress(Exception):  # the store may be gone already
            store = self.store.clone()  # any thread may call this
            store.first(self.key("teardown"), reason)  # the first reason stays; a round trip
            if stopping:
                store.set(self.key("stopping"), reason)
            if self._status == "running":
                self._status = self._failure or "is stopping the job"
            self._post_beat(self._status, 0.0, "")

    def torn_down(self) -> str | None:
        """Why the job is being torn down (a rank failed, the launcher stops it), or None while it runs. An
        unreachable store counts as torn down: it lives in a process of the job."""
        try:
            return self.store.get(self.key("teardown"))  # a value this job did not sign: None
        except Exception:
            return "the job's store is gone"

    def explain(self, error: BaseException, entry: str) -> RankFailedError | HangError | None:
        """``error`` ends this rank's Trainer.``entry``. When it is a collective that broke inside torch because
        another rank left (its script ended or failed; gloo's "Connection closed by peer"), the
        [`RankFailedError`][tandem.utilities.exceptions.RankFailedError] that names that rank, how it left and where
        this rank was; else None."""
        if self.hang is not None and not isinstance(error, (HangError, KeyboardInterrupt)):
            return HangError(self.hang)  # this rank's collective broke because the others ended after the hang
        if isinstance(error, (RankFailedError, CollectiveMismatchError, HangError)) or not broke_in_torch(error):
            return None
        deadline = time.monotonic() + _ANNOUNCE_WAIT_S  # it posts before its sockets close; let the post land
        while not (gone := self._departed()):
            if time.monotonic() > deadline:
                return None  # killed, or the store is gone: nobody said why
            time.sleep(0.05)
        rank, beat = gone[0]
        tb = error.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where, _ = _main_thread_position(tb.tb_frame if tb is not None else None, tb.tb_lineno if tb else None)
        summary = f"rank {rank} {beat.status} while rank {self.rank} was in {where}, in Trainer.{entry}"
        print(f"[tandem] {summary}; rank {self.rank}'s collective broke.", file=sys.stderr, flush=True)
        if beat.status.startswith("ended its script"):
            cause = _FIX_LIMITS
        elif beat.status.startswith("was interrupted"):
            cause = f"Rank {rank} was interrupted alone (a SIGINT sent to its process, not to the job's group)."
        elif beat.status.startswith("stopped the job"):
            cause = f"The ranks entered different collectives: rank {rank}'s error (printed by rank {rank}) says where."
        else:
            cause = f"Rank {rank}'s error is the cause (its traceback is printed by rank {rank})."
        return RankFailedError(
            f"{summary[0].upper()}{summary[1:]}; the collective then failed on rank {self.rank} with "
            f"{error_summary(error)}. {cause}"
        )

    def _departed(self) -> list[tuple[int, _Beat]]:
        """The other ranks that said they left (script ended, failed, group destroyed)."""
        try:
            beats = [(r, self.beat(r)) for r in range(self.world_size) if r != self.rank]
        except Exception:
            return []
        return [(r, beat) for r, beat in beats if beat is not None and beat.status != "running"]

    def _watch(self) -> None:
        """The watcher thread: once a second, post where the main thread is; run the vote's share. When the
        launcher stops the job while the main thread waits inside torch for another rank, end this process:
        that rank will never come, and no signal handler runs in a thread blocked in C++. Only a store that is gone
        ends the thread (the job is ending): a value this job did not sign reads as absent."""
        where, since, seen, still_since = "", time.monotonic(), None, time.monotonic()
        while not self._stop.wait(_BEAT_S):
            try:
                now = time.monotonic()
                now_where, blocked, user, hook = _main_thread_place(self._main_frame())
                if now_where != where:
                    where, since = now_where, now
                place = self._place_text()
                moved = seen is not None and seen != (place, where)
                if seen != (place, where):
                    seen, still_since = (place, where), now
                blocked_for = now - since if blocked else 0.0
                self._post_beat(self._status, blocked_for, where, place, hook, user, now - still_since)
                self.preemption_vote._share(self._beat_store)
                stopping = blocked and not (self._tore_down or _REPORTER)
                if stopping and self._beat_store.get(self.key("stopping")) is not None:
                    os._exit(TORN_DOWN_EXIT)  # as SIGTERM's default action would (128 + 15)
                if self.hang_timeout is not None:
                    self._look_for_hang(moved, self.hang_timeout)
            except Exception as error:
                if not self._store_reachable():
                    return  # the store is gone (the job is ending): nothing more to report
                if not self._skipped:
                    self._skipped = True
                    print(
                        f"[tandem] rank {self.rank}'s side-channel watcher skipped a beat: {error_summary(error)}",
                        file=sys.stderr,
                        flush=True,
                    )

    def _store_reachable(self) -> bool:
        try:
            self._beat_store.check([self.key("beat", self.rank)])
        except Exception:
            return False
        return True

    def _place_text(self) -> str:
        place = self.place
        if place is None:
            return ""
        stage, epoch, batch, step = place()
        return f"{stage or '-'} {epoch} {batch} {step}"

    def _post_beat(
        self,
        status: str,
        blocked_for: float,
        where: str,
        place: str = "",
        hook: str = "",
        user: str = "",
        still_for: float = 0.0,
    ) -> None:
        fields = (next(self._beats), f"{still_for:.1f}", status, f"{blocked_for:.1f}", where, place, hook, user)
        self._beat_store.set(self.key("beat", self.rank), "\n".join(map(str, (*fields, self.collective_check.last))))

    # ------------------------------------------------------------------ hangs
    def _look_for_hang(self, moved: bool, hang_timeout: float) -> None:
        """Watcher thread, once a beat; ``moved``: this rank's place or stack changed since its last beat. Every
        rank adds that to the group's ``moved`` counter (one request, whatever the number of ranks). Rank 0: when
        the counter has not grown for ``hang_timeout`` seconds, it reads every rank's beat (once, not every beat)
        and, while some rank is in a loop, none has left and every rank's beat says it has not moved for about that
        long, declares the hang (``_declare_hang``). Every other rank: when rank 0 declared one (its signed
        ``hang`` key; the counter out of its range only says when to look), print this rank's stack and end (its
        collectives then break on rank 0, which raises). Anyone can add to the counter: that can keep a hang from
        being seen, never make one (the beats decide)."""
        store = self._beat_store
        total = store.add(self.key("moved"), int(moved))
        if self.rank != 0:
            if not 0 <= total < _MOVES_LIMIT and store.get(self.key("hang")) is not None:
                print(f"[tandem] rank {self.rank}: rank 0 declared a hang; this rank's stack:", file=sys.stderr)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                sys.stderr.flush()
                os._exit(HANG_EXIT)
            return
        if self.hang is not None:
            return
        now = time.monotonic()
        if self._stalled is None or self._stalled[0] != total:
            self._stalled = (total, now)
            return
        if now - self._stalled[1] < hang_timeout:
            return
        beats = self.beats(store)
        still = max(hang_timeout - 2 * _BEAT_S, hang_timeout / 2)  # a beat is up to a second old
        if (
            beats is None
            or any(b is None or b.status != "running" or b.still_for < still for b in beats)
            or not any(b.place for b in beats if b is not None)
        ):
            # a rank left (the other clients report it), no loop runs (set-up), or a rank moved after all (the
            # counter was held back), or a beat is missing or not signed by this job: no hang to declare now
            self._stalled = (total, now)
            return
        self._declare_hang([b for b in beats if b is not None], now - self._stalled[1])

    def _declare_hang(self, beats: list[_Beat], stalled_for: float) -> None:
        """Rank 0: print the table of where each rank is and this rank's stack, tell the other ranks (they print
        theirs and end), and make the main thread raise [`HangError`][tandem.utilities.exceptions.HangError]."""
        rows = [("rank", "stage", "hook", "epoch", "step", "batch", "blocked at (your code)", "innermost frame")]
        for r, beat in enumerate(beats):
            stage, epoch, batch, step = (beat.place or "- - - -").split(" ")
            rows.append((str(r), stage, beat.hook or "-", epoch, step, batch, beat.user or "-", beat.where or "-"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        table = "\n".join(
            "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in rows
        )
        self.hang = (
            f"No rank made progress for {stalled_for:.0f} s (hang_timeout={self.hang_timeout:g} s): the job was "
            "stopped instead of waiting for the process-group timeout. Where each rank was:\n"
            f"{table}\n"
            "A rank waiting in torch's collective or backward pass waits for a rank that never enters the same one: "
            "every rank must run the same collectives in the same order (call backward on every rank in every "
            "step; call torch.distributed collectives on every rank), and no rank may block on its own (a data "
            "loader or a lock). Each rank's Python stack is printed above. Raise DDPStrategy(hang_timeout=...) if "
            "a step or a data fetch really takes this long."
        )
        print(f"[tandem] {self.hang}\n[tandem] rank 0's stack:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        # The job is torn down (a SIGTERM that follows, torchrun's, ends a rank at once), but this rank's status stays
        # "running": a rank waiting in the collective check would fail on it before its watcher prints its stack.
        self._tore_down = True
        store = self._beat_store
        store.set(self.key("hang"), f"rank 0 declared a hang after {stalled_for:.0f} s")  # what the other ranks trust
        store.first(self.key("teardown"), f"rank 0 declared a hang after {stalled_for:.0f} s")
        store.add(self.key("moved"), -(1 << 62))  # out of the counter's range: the other ranks' watchers look
        if not _REPORTER:  # under tandem's launcher, it raises HangError in the main thread (it sees the ranks end)
            threading.Thread(target=self._end_if_not_raised, name="tandem-hang", daemon=True).start()

    def _end_if_not_raised(self) -> None:
        """Rank 0 not under tandem's launcher: its main thread raises HangError when its collective breaks (the
        other ranks ended); a main thread blocked elsewhere gets ``_HANG_RESPONSE_S``, then the process ends."""
        time.sleep(_HANG_RESPONSE_S)
        print(f"[tandem] HangError: {self.hang}\n[tandem] rank 0 did not respond; exiting.", file=sys.stderr)
        sys.stderr.flush()
        os._exit(HANG_EXIT)

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
        if PREEMPTION.teardown == self.torn_down:
            PREEMPTION.teardown = None
        with contextlib.suppress(Exception):  # the store may already be closed at interpreter exit
            self._post_beat(status, 0.0, "")
        if threading.current_thread() is not self._watcher:
            # Wait for the watcher to leave its store call: a daemon thread still inside C++ when the interpreter
            # finalizes is ended by pthread_exit, which aborts the process ("terminate called without an active
            # exception", SIGABRT) and reads to the other ranks as a crash of this one.
            self._watcher.join(_WATCHER_JOIN_S)


@dataclass
class _Beat:
    number: int  # the rank's beats so far: a beat older than one already read is a replay
    still_for: float  # seconds since the rank's place or stack last moved
    status: str
    blocked_for: float
    where: str
    last: str
    place: str = ""  # "stage epoch batch step", or "" outside a loop
    hook: str = ""
    user: str = ""  # the user's line the main thread is in

    @classmethod
    def parse(cls, payload: str) -> _Beat | None:
        """The beat posted as ``payload``, or None when it is not one."""
        try:
            number, still, status, blocked, where, place, hook, user, last = payload.split("\n", 8)
            return cls(int(number), float(still), status, float(blocked), where, last, place, hook, user)
        except ValueError:
            return None

    @property
    def check_count(self) -> int:
        """How many collective checks the rank has entered (its latest, ``check <n>: ...``)."""
        return int(self.last.split(":", 1)[0].removeprefix("check ")) if self.last.startswith("check ") else 0

    @property
    def where_text(self) -> str:
        return f"Its last tandem collective was {self.last}. " if self.last else ""


def broke_in_torch(error: BaseException) -> bool:
    """Whether ``error`` was raised inside torch's collectives or backward pass (where a rank waits for the others,
    and fails when one of them leaves). A KeyboardInterrupt (or SystemExit) raised there never is: Ctrl-C lands
    wherever the main thread is, inside torch as often as not."""
    if not isinstance(error, Exception):
        return False
    frame = _innermost_frame(error)
    return frame is not None and any(part in frame.f_code.co_filename for part in _TORCH_BLOCKING)


def _innermost_frame(error: BaseException) -> FrameType | None:
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame if tb is not None else None


def error_summary(error: BaseException) -> str:
    """``Type: first line of the message`` (gloo's advice to read the other logs cut), shortened to about 300
    characters at a sentence or clause (see `_clipped`)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = text.split(". This is typically caused by")[0]  # gloo's advice to read the other rank's log
    return f"{type(error).__name__}: {_clipped(text)}" if text else type(error).__name__


def _clipped(text: str, limit: int = _SUMMARY_LIMIT) -> str:
    """``text`` if it has at most ``limit`` characters; else its longest beginning within them that ends a sentence
    or a clause outside parentheses, then `` ...``: never a cut inside a name or a call site (``in <module>``)."""
    if len(text) <= limit:
        return text
    depth, cut = 0, -1
    for i, char in enumerate(text[:limit]):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth = max(0, depth - 1)
        elif char in ".,;" and depth == 0 and text[i + 1 : i + 2] == " ":
            cut = i + 1 if char == "." else i  # a sentence keeps its full stop; a clause drops its comma
    if cut <= 0:  # one long clause: between two words
        cut = max(text.rfind(" ", 0, limit), 0) or limit
    return f"{text[:cut]} ..."


def _main_thread_place(frame: FrameType | None) -> tuple[str, bool, str, str]:
    """``_main_thread_position``, the user's line and the hook the main thread is in (the innermost frame named
    after a hook or step method outside torch; "fetching a batch" inside a data loader; "backward" in autograd). A
    wait in the collective check shows as its caller (its polling loop would look like progress)."""
    checking = frame is not None and frame.f_code.co_filename == _THIS_FILE
    while frame is not None and _in(frame, _STRATEGIES_DIR):
        frame = frame.f_back
    where, blocked = _main_thread_position(frame)
    if checking:
        user = _user_site(frame)
        where = "tandem's collective check" + (f", called at {user}" if user else "")
    hook, inner = "", frame
    while inner is not None:
        name, file = inner.f_code.co_name, inner.f_code.co_filename
        if _DATA_LOADING in file:
            hook = "fetching a batch"
            break
        if not _in_library(inner) and (name.startswith("on_") or name in _HOOK_NAMES):
            hook = name
            break
        inner = inner.f_back
    if not hook and frame is not None and f"{os.sep}torch{os.sep}autograd{os.sep}" in frame.f_code.co_filename:
        hook = "backward"
    return where, blocked, _user_site(frame), hook


def _main_thread_position(frame: FrameType | None, lineno: int | None = None) -> tuple[str, bool]:
    """Where the main thread is, as text, and whether it waits inside torch (a collective or a backward
    pass) for other ranks. The text changes whenever the innermost frame moves."""
    if frame is None:
        return "", False
    code = frame.f_code
    blocked = any(part in code.co_filename for part in _TORCH_BLOCKING)
    inner = f"{code.co_name} ({os.path.basename(code.co_filename)}:{lineno or frame.f_lineno})"
    user = _user_site(frame)
    where = f"torch's {inner}" if blocked else inner
    return (f"{where}, called at {user}" if user else where), blocked


# ---------------------------------------------------------------------------------------------- client 1


class CollectiveCheck:
    """The side channel's first client: before each checked collective, the ranks agree they enter the same.

    What it costs does not grow with the number of ranks N: each rank makes the same few store requests whatever N
    is, and no rank reads N keys unless something is wrong (see ``benchmarks/scale.py``).

    1. Each rank offers its ``n``-th check's tag (the operation, tandem's call site, the entry point) and its
       user-code call site to ``check/<n>/tag`` with ``compare_set``: the first rank's stays, and every rank gets
       it back. A rank whose tag differs appends its own to ``check/<n>/differ``. Then it counts itself in
       ``check/<n>/arrived`` (and its next beat says it arrived).
    2. The last rank to arrive writes the verdict: ``ok`` when nobody differed, else the mismatch, every side
       named (read from the one ``differ`` key). Every rank waits for the verdict (polling, at most
       ``_POLL_BUDGET`` requests a second from all waiting ranks together) and raises
       [`CollectiveMismatchError`][tandem.utilities.exceptions.CollectiveMismatchError] if it is not ok.
    3. While they wait, the rank whose tag was written first reads the other ranks' beats once a beat (one
       request). A rank that ended its script, or whose main thread has sat in a torch collective or backward
       pass (for DDP: the gradient all-reduce, waiting for this rank) for ``stall_timeout`` seconds, will not
       arrive: it writes that as the verdict, naming the rank and where it is, and every rank raises it. A rank
       that is merely slow (still computing, or in user code such as ``prepare_data`` on rank 0) is waited for, up
       to the process-group timeout, as before. When every beat says its rank arrived and no verdict came (an
       outsider held the ``arrived`` count back), it writes the verdict itself.

    Tags, differ records and verdicts are signed (``SignedStore``); ``arrived`` is a count anyone can change,
    so it only says who writes the verdict soonest: pushed up, a verdict may be written before a differing rank
    arrived (its mismatch then fails in the collective itself, as without the check); a job whose ranks agree gets
    ``ok`` whatever the count says.
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
        mine = f"{site.tag}\n{site.user}"
        writer, _, first = store.first(channel.key("check", n, "tag"), f"{channel.rank}\n{mine}").partition("\n")
        if first.split("\n", 1)[0] != site.tag:
            store.append(channel.key("check", n, "differ"), f"{channel.rank}\n{mine}")
        self.last = f"check {n}: {_describe(site.tag, site.user)}"  # its next beat says this rank arrived
        arrived = store.add(channel.key("check", n, "arrived"), 1)  # a hint: anyone can add to it
        verdict_key = channel.key("check", n, "verdict")
        if arrived == channel.world_size:
            store.first(verdict_key, self._verdict(n, first))
        verdict = self._wait_for(verdict_key, n, site, stall_timeout, first, diagnose=writer == str(channel.rank))
        if n > 1 and channel.rank == 0:  # every rank has read check n - 1 (they all reached n): drop its keys
            for name in ("tag", "arrived", "verdict"):  # (no "differ": check n - 1 passed)
                store.delete(channel.key("check", n - 1, name))
        if verdict != "ok":
            raise CollectiveMismatchError(verdict)

    def _verdict(self, n: int, first: str) -> str:
        """The last rank to arrive: "ok", or the mismatch with every side named (``first``: the first rank's
        tag and user site, which the ranks that did not append to ``differ`` share)."""
        differing = {}
        for record in self.channel.store.records(self.channel.key("check", n, "differ")):
            rank, tag, user = record.split("\n", 2)
            differing[int(rank)] = (tag, user)
        if not differing:
            return "ok"
        entries = [differing.get(r, tuple(first.split("\n", 1))) for r in range(self.channel.world_size)]
        groups: dict[str, list[int]] = {}
        for r, (tag, _) in enumerate(entries):
            groups.setdefault(tag, []).append(r)
        sides = "; ".join(
            f"rank{'s' if len(ranks) > 1 else ''} {_ranks(ranks)} entered {_describe(tag, entries[ranks[0]][1])}"
            for tag, ranks in groups.items()
        )
        return f"The ranks entered different collectives: {sides}. {_FIX}"

    def _wait_for(self, key: str, n: int, site: CallSite, stall_timeout: float, first: str, diagnose: bool) -> str:
        """Poll for ``key``, backing off to a pace at which all ranks together stay within ``_POLL_BUDGET``
        requests a second (the store's own timed wait logs a warning per timeout). ``diagnose`` (the rank whose
        tag was written first, and any rank that finds a value this job did not sign at ``key``): every beat, look
        for a rank that will never arrive, or for every rank arrived, and make that the verdict."""
        store, delay = self.channel.store, 0.0002
        longest = max(0.02, self.channel.world_size / _POLL_BUDGET)
        diagnose_at = time.monotonic() + _BEAT_S
        suspects: dict[int, tuple[str, int]] = {}
        while True:
            if store.check([key]):
                verdict = store.get(key, present=True)
                if verdict is not None:
                    return verdict
                diagnose = True  # an outsider's value: the verdict may never come from the rank that wrote it
            time.sleep(delay)
            delay = min(delay * 2, longest)
            if diagnose and time.monotonic() >= diagnose_at:
                problem, suspects = self._missing_rank_problem(n, site, stall_timeout, suspects, first)
                if problem is not None:
                    store.first(key, problem)  # unless the verdict came meanwhile: every rank reads it
                diagnose_at = time.monotonic() + _BEAT_S

    def _missing_rank_problem(
        self, n: int, site: CallSite, stall_timeout: float, suspects: dict[int, tuple[str, int]], first: str
    ) -> tuple[str | None, dict[int, tuple[str, int]]]:
        """The verdict this rank can give while it waits, or None; and the ranks that look stalled now (their
        message and beat). Read from every rank's beat (one request). When every rank's beat says it arrived, the
        verdict (whatever ``arrived`` counts). Else why a rank that has not arrived never will: a rank that ended
        is a problem at once; a rank stalled in torch only when it already was at the previous look, in an older
        beat (a beat is up to a second old: it may have arrived since). A beat from before check ``n - 1`` is
        stale (every rank passed that check since): it says nothing."""
        channel = self.channel
        me = f"rank {channel.rank} entered {_describe(site.tag, site.user)}"
        beats = channel.beats()
        if beats is None:  # a rank whose watcher has not posted yet: still starting
            return None, {}
        others = [(r, beat) for r, beat in enumerate(beats) if r != channel.rank]
        if all(beat is not None and beat.check_count >= n for _, beat in others):
            return self._verdict(n, first), {}  # every rank arrived, yet no verdict came: give it here
        stalled = {}
        for r, beat in others:
            if beat is None or not n - 1 <= beat.check_count < n:
                continue
            if beat.status != "running":
                return f"Rank {r} {beat.status} while {me}. {beat.where_text}{_FIX}", {}
            if beat.blocked_for >= stall_timeout:
                stalled[r] = (
                    f"Rank {r} has waited {beat.blocked_for:.0f} s in {beat.where}, a collective that rank "
                    f"{channel.rank} never entered (rank {r}'s last tandem collective was {beat.last or 'none'}), "
                    f"while {me}. {_FIX_STALLED}",
                    beat.number,
                )
        confirmed = [r for r, (_, number) in stalled.items() if r in suspects and suspects[r][1] < number]
        return (stalled[confirmed[0]][0] if confirmed else None), stalled


# ---------------------------------------------------------------------------------------------- client 2


class PreemptionVote:
    """The side channel's second client: after a pre-emption signal, the ranks agree where they all stop.

    A signal may reach one rank only (torchrun, srun, a signal sent by hand), and each rank sees it at a
    different step. The ranks agree on one stop position without any per-step work: the signal handler sets
    a local flag (``PREEMPTION``); each watcher shares it both ways (flag ->
    store key ``preempt/<round>/signal``, key -> flag) once a second. Each rank posts, once (compare_set), a
    position at or ahead of where it is: its watcher posts the batch its main thread is in (or the epoch end
    it is in), its main thread, if it gets there first, the position it stopped at. Every rank stops at the
    first stop point at or after the largest post. A rank blocked in a collective (waiting for a rank that
    already stopped to look at the flag) gets its post from its watcher, so nobody waits for it; DDP keeps
    the ranks within one step of each other, so the largest post is at most a step or two ahead of anyone.
    Each rank counts itself in ``preempt/<round>/posted`` as it posts; a rank at its stop point polls that one key
    (at most ``_POLL_BUDGET`` requests a second from all ranks together), then reads the N positions once. The
    signal and the positions are signed (``SignedStore``); ``posted``, a count anyone can change, only says
    when to read them: a rank also reads them once a second, and stops only when all N are there and signed.
    """

    def __init__(self, channel: SideChannel) -> None:
        self.channel = channel
        self._lock = threading.Lock()
        self._round = 0  # fits and pre-emption stops so far (keys of an earlier round are never read)
        self._seen = False  # this round's request is known both here and in the store
        self._target: Position | None = None
        self._posted = False  # this rank's stop position is in the store, and counted in ``posted``

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
            store.first(self._key("signal"), str(PREEMPTION.signum))
            self._post(store, here)
            keys = [self._key(f"stop/{r}") for r in range(channel.world_size)]
        timeout = _PREEMPTION_WAIT_S
        deadline = time.monotonic() + timeout
        look_at = time.monotonic() + _BEAT_S
        delay, longest = 0.001, max(0.01, channel.world_size / _POLL_BUDGET)  # one small request a poll
        read_at_count = 0
        while True:
            posted = store.add(self._key("posted"), 0)  # a hint: the positions themselves are signed
            looking = time.monotonic() > look_at
            if looking or (posted >= channel.world_size and posted != read_at_count):
                read_at_count = posted
                positions = store.get_all(keys)
                if positions is not None and None not in positions:
                    break
            if looking:  # a rank failed meanwhile: nobody stops at a common step
                look_at = time.monotonic() + _BEAT_S
                reason = channel.torn_down()
                if reason is not None:
                    raise RankFailedError(f"Pre-emption: rank {channel.rank} stopped waiting for the others: {reason}.")
            if time.monotonic() > deadline:
                missing = [r for r, k in enumerate(keys) if store.get(k) is None]
                raise CollectiveMismatchError(
                    f"Pre-emption: rank {channel.rank} stopped at epoch {here[0]}, batch {here[1]} and waited "
                    f"{timeout:.0f} s for rank(s) {_ranks(missing)} to say where they stop; they did not answer "
                    "(stopped or hung). No checkpoint was written for this stop."
                )
            time.sleep(delay)
            delay = min(2 * delay, longest)
        self._target = max(_parse_position(p) for p in positions if p is not None)  # once a stop
        return self._target

    def new_round(self) -> None:
        """Every rank calls this at the start of each fit and after each pre-emption stop, so the rounds match:
        a stop's keys are never read again, and a signal still pending is shared afresh."""
        with self._lock:
            self._round += 1
            self._seen, self._target, self._posted = False, None, False

    def _post(self, store: SignedStore, position: Position) -> None:
        """Post this rank's stop position, unless it already did (its watcher or its main thread: the first wins),
        and count it in ``posted`` (what the ranks wait on: one key, whatever the number of ranks). Under the lock."""
        if self._posted:
            return
        store.first(self._key(f"stop/{self.channel.rank}"), _position_text(position))
        store.add(self._key("posted"), 1)
        self._posted = True

    def _share(self, store: SignedStore) -> None:
        """Watcher thread: share the local flag and the store key both ways; post this rank's position."""
        with self._lock:
            if not self._seen:
                if PREEMPTION.signum is not None:
                    store.first(self._key("signal"), str(PREEMPTION.signum))
                else:
                    signum = store.get(self._key("signal"))  # another rank's signal, signed; an outsider's: None
                    if signum is None:
                        return
                    PREEMPTION.request(int(signum))
                self._seen = True
            progress = PREEMPTION.progress
            if progress is not None:  # in a fit: where the main thread can stop next, at the earliest
                epoch, done, epoch_end = progress()
                ahead = (epoch + 1, 0) if epoch_end else (epoch, done + 1)
                self._post(store, ahead)


class LocalVote:
    """The pre-emption vote of a process with no side channel (one process, or no process group): it stops
    where it is."""

    def target(self, here: Position) -> Position:
        return here

    def new_round(self) -> None:
        pass


def preemption_vote() -> PreemptionVote | LocalVote:
    """This process's pre-emption vote: the process group's side channel's, or a ``LocalVote`` when
    there is none.

    Example:
        ```python
        preemption_vote().new_round()  # at the start of each fit
        if here >= preemption_vote().target(here):  # at a stop point, with a signal pending
            ...  # every rank stops here
        ```
    """
    return _CHANNEL.preemption_vote if _CHANNEL is not None else LocalVote()


# ---------------------------------------------------------------------------------------------- client 3


class SkipAgreement:
    """The side channel's third client: a batch that ``training_step`` skipped (returned None) on one rank only.

    Under DDP (and FSDP) each backward pass exchanges gradients with every rank, so a rank that skips a stepping
    batch leaves the others waiting in their backward for a backward it never runs: the job hangs until the
    collective check's stall timeout or the hang watch ends it, naming collectives instead of the skip. Nothing runs
    for this on a batch that returned a loss; a rank whose ``training_step`` returned None calls `agree`
    (once per such batch): it counts itself in ``skip/<check>/<place>/count`` and records its rank there (signed),
    then waits until every rank skipped the same batch (the count says when to read the records), or until a
    rank's beat shows it in its backward pass at this same batch (its place: stage, epoch, batch, step): that rank
    ran backward, and the batch is a mismatch. The key holds the collective checks passed so far, the same on every
    rank, so a later fit's batch never reads an earlier one's records.
    """

    def __init__(self, channel: SideChannel) -> None:
        self.channel = channel

    def agree(self) -> int | None:
        """Main thread, at a stepping batch whose ``training_step`` returned None: the rank found running backward
        at this batch instead, or None when every rank skips it (or a rank left: its end is reported elsewhere)."""
        channel, store = self.channel, self.channel.store
        place = channel._place_text()
        key = channel.key("skip", channel.collective_check.count, *place.split())
        store.append(f"{key}/ranks", str(channel.rank))
        count = store.add(f"{key}/count", 1)  # a hint: the records are signed
        delay, longest = 0.0002, max(0.02, channel.world_size / _POLL_BUDGET)
        look_at = time.monotonic() + _BEAT_S
        while True:
            if count >= channel.world_size:
                skipping = {int(r) for r in store.records(f"{key}/ranks")}
                if len(skipping) >= channel.world_size:
                    return None
            if time.monotonic() >= look_at:
                look_at = time.monotonic() + _BEAT_S
                for rank, beat in enumerate(channel.beats() or []):
                    if rank == channel.rank or beat is None:
                        continue
                    if beat.status != "running":
                        return None
                    if beat.hook == "backward" and beat.place == place:
                        return rank
            time.sleep(delay)
            delay = min(delay * 2, longest)
            count = store.add(f"{key}/count", 0)


def skip_agreement() -> SkipAgreement | None:
    """This process's skip agreement (see `SkipAgreement`), or None with no side channel or one rank (a
    skipped batch then waits for nobody).

    Example:
        ```python
        agreement = skip_agreement()  # once per fit
        if loss is None and agreement is not None and (rank := agreement.agree()) is not None:
            ...  # that rank ran backward at this batch: say so
        ```
    """
    channel = _CHANNEL
    return channel.skip_agreement if channel is not None and channel.world_size > 1 else None


# ---------------------------------------------------------------------------------------------- the group's


def new_run_id() -> str:
    """A fresh token for one process group (rank 0 makes it; the strategy broadcasts it). Anyone who reaches the
    store can read it (``list_keys``): it keeps groups apart, it guards nothing."""
    return uuid.uuid4().hex[:12]


def new_secret() -> bytes:
    """A fresh secret for one process group's side channel (rank 0 draws it; the strategy broadcasts it over the
    group's backend, never through the store)."""
    return secrets.token_bytes(32)


def open_channel(store: Any, rank: int, world_size: int, run_id: str, secret: bytes) -> SideChannel:
    """Open the side channel of the process group this process just joined (every rank, right after joining, with
    the run id and secret rank 0 broadcast); any earlier group's channel is closed."""
    global _CHANNEL
    close_channel()
    _CHANNEL = SideChannel(store, rank, world_size, run_id, secret)
    return _CHANNEL


def report_for_the_job() -> None:
    """This process started the other ranks and reports their failures (tandem's launcher, in rank 0): a teardown
    never ends it from the watcher; it raises the failure in its main thread instead."""
    global _REPORTER
    _REPORTER = True


def announce_teardown(reason: str, stopping: bool = False) -> None:
    """The job is being torn down (see ``SideChannel.announce_teardown``); nothing happens without a channel."""
    if _CHANNEL is not None:
        _CHANNEL.announce_teardown(reason, stopping)


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
_REPORTER = False  # see report_for_the_job


# ---------------------------------------------------------------------------------------------- helpers


def _position_text(position: Position) -> str:
    return f"{position[0]} {position[1]}"


def _parse_position(payload: str) -> Position:
    epoch, done = payload.split()
    return int(epoch), int(done)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)
