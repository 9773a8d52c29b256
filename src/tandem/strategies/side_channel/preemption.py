"""The pre-emption vote (``PreemptionVote``, the side channel's second client): after SIGTERM / SIGUSR1, which may
reach one rank only, every rank stops at the same step. ``LocalVote`` is a process's without a side channel;
``preemption_vote`` returns this process's.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from tandem.strategies.side_channel import group
from tandem.strategies.side_channel.beat import _BEAT_S
from tandem.strategies.side_channel.places import _ranks
from tandem.strategies.side_channel.store import _POLL_BUDGET
from tandem.utilities.exceptions import CollectiveMismatchError, RankFailedError
from tandem.utilities.preemption import PREEMPTION, Position

if TYPE_CHECKING:
    from tandem.strategies.side_channel.channel import SideChannel
    from tandem.strategies.side_channel.store import SignedStore


#: seconds a rank at a pre-emption stop waits for every rank to say where it stops
_PREEMPTION_WAIT_S = 60.0


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
    return group._CHANNEL.preemption_vote if group._CHANNEL is not None else LocalVote()


def _position_text(position: Position) -> str:
    return f"{position[0]} {position[1]}"


def _parse_position(payload: str) -> Position:
    epoch, done = payload.split()
    return int(epoch), int(done)
