"""``SideChannel``, one per process group: the signed store, this rank's watcher thread and the beats it posts, how
this rank left (posted at exit), the job's teardown, and ``explain`` (which rank a collective that broke inside
torch was waiting for). Its clients: ``collective_check``, ``preemption_vote``, ``skip_agreement``; its hang watch
(``HangWatch``) runs in the watcher.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from tandem.strategies.side_channel import group
from tandem.strategies.side_channel.beat import _BEAT_S, _Beat
from tandem.strategies.side_channel.collective_check import CollectiveCheck
from tandem.strategies.side_channel.hang import HangWatch
from tandem.strategies.side_channel.places import (
    _main_thread_place,
    _main_thread_position,
    broke_in_torch,
    error_summary,
)
from tandem.strategies.side_channel.preemption import PreemptionVote
from tandem.strategies.side_channel.skipped_batch import SkipAgreement
from tandem.strategies.side_channel.store import SignedStore
from tandem.utilities.excepthook import on_uncaught_exception, remove_listener
from tandem.utilities.exceptions import CollectiveMismatchError, HangError, RankFailedError
from tandem.utilities.preemption import PREEMPTION

if TYPE_CHECKING:
    from tandem.strategies.side_channel.places import Place


_WATCHER_JOIN_S = 10.0  # the longest close() waits for the watcher's store call to return
#: seconds a rank whose collective broke waits for the rank that left to say so (it posts before its sockets close)
_ANNOUNCE_WAIT_S = 2.0
#: how a rank whose main thread waited in a collective ends when the job is torn down (as by SIGTERM: 128 + 15)
TORN_DOWN_EXIT = 143
_FIX_LIMITS = (
    "Every rank must make the same Trainer calls with the same limits (max_epochs, max_steps, limit_*_batches), "
    "and none may end its script (sys.exit, return) while the others still train."
)


class SideChannel(HangWatch):
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
                stopping = blocked and not (self._tore_down or group._REPORTER)
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


def open_channel(store: Any, rank: int, world_size: int, run_id: str, secret: bytes) -> SideChannel:
    """Open the side channel of the process group this process just joined (every rank, right after joining, with
    the run id and secret rank 0 broadcast); any earlier group's channel is closed."""
    group.close_channel()
    group._CHANNEL = SideChannel(store, rank, world_size, run_id, secret)
    return group._CHANNEL
