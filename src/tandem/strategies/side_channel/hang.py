"""The hang watch (``HangWatch``, part of ``SideChannel``): with a ``hang_timeout``, rank 0's watcher declares a
hang when no rank's place or stack moved for that long, prints the table of where each rank is and its own stack,
and stops the job; the other ranks print their stacks and end with ``HANG_EXIT``.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Protocol

from tandem.strategies.side_channel import group
from tandem.strategies.side_channel.beat import _BEAT_S

if TYPE_CHECKING:
    from tandem.strategies.side_channel.beat import _Beat
    from tandem.strategies.side_channel.store import SignedStore


#: how a rank other than 0 ends after a hang was declared (its stack printed; rank 0 raises HangError); timeout(1)'s
HANG_EXIT = 124
#: seconds rank 0's main thread has, after a hang was declared, to raise HangError before the process ends itself
_HANG_RESPONSE_S = 10.0
#: the ``moved`` counter stays in [0, _MOVES_LIMIT) until rank 0 declares a hang (it then subtracts 2**62)
_MOVES_LIMIT = 1 << 61


class _Channel(Protocol):
    """What the hang watch uses of the ``SideChannel`` it is part of."""

    rank: int
    hang_timeout: float | None
    hang: str | None
    _beat_store: SignedStore
    _stalled: tuple[int, float] | None
    _tore_down: bool

    def key(self, *parts: object) -> str: ...

    def beats(self, store: SignedStore | None = None) -> list[_Beat | None] | None: ...

    def _declare_hang(self, beats: list[_Beat], stalled_for: float) -> None: ...

    def _end_if_not_raised(self) -> None: ...


class HangWatch:
    """``SideChannel``'s hang watch: its watcher thread calls ``_look_for_hang`` once a beat when the channel has a
    ``hang_timeout``; the state it reads and sets (``hang``, ``hang_timeout``, the ranks' moves) is the channel's."""

    hang: str | None  # the hang rank 0 declared (the table of where each rank was), or None
    _stalled: tuple[int, float] | None  # rank 0: the ranks' moves counted, and since when

    def _look_for_hang(self: _Channel, moved: bool, hang_timeout: float) -> None:
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

    def _declare_hang(self: _Channel, beats: list[_Beat], stalled_for: float) -> None:
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
        # under tandem's launcher, it raises HangError in the main thread (it sees the ranks end)
        if not group._REPORTER:
            threading.Thread(target=self._end_if_not_raised, name="tandem-hang", daemon=True).start()

    def _end_if_not_raised(self: _Channel) -> None:
        """Rank 0 not under tandem's launcher: its main thread raises HangError when its collective breaks (the
        other ranks ended); a main thread blocked elsewhere gets ``_HANG_RESPONSE_S``, then the process ends."""
        time.sleep(_HANG_RESPONSE_S)
        print(f"[tandem] HangError: {self.hang}\n[tandem] rank 0 did not respond; exiting.", file=sys.stderr)
        sys.stderr.flush()
        os._exit(HANG_EXIT)
