"""The side channel: how the ranks agree outside the process group's collectives, and its two clients.

The store, the watcher thread and its beats are one :class:`~tandem.strategies.collective_check.CollectiveGuard`
per process group (the group outlives one Trainer and its strategy, so the channel is the group's, kept for the
process: ``current_guard()``). Two named clients use it:

- **the collective check** (``CollectiveGuard.check``): before each of tandem's own collectives the ranks agree
  that they enter the same one. Its messages name the Trainer entry point each rank is in; the stage runner
  tags it explicitly with :func:`entry_point` (a context variable; nothing reads the call stack for it);
- **the pre-emption vote** (:func:`preemption_vote`): after SIGTERM / SIGUSR1 every rank stops at the same step.

The Strategy keeps placement and collectives; coordination between ranks lives here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tandem.strategies.collective_check import _ENTRY_POINT, current_guard
from tandem.utilities.preemption import Position

#: seconds a rank at a pre-emption stop waits for every rank to say where it stops
PREEMPTION_WAIT_S = 60.0


@contextlib.contextmanager
def entry_point(name: str) -> Iterator[None]:
    """Inside the block, tandem's collectives belong to the Trainer entry point ``name`` ("fit", "test",
    "save_checkpoint", ...; nested: the innermost). ``trainer.test`` on one rank and ``trainer.validate`` on
    another pass through the same collectives, yet do not belong together: the check tells them apart."""
    token = _ENTRY_POINT.set(name)
    try:
        yield
    finally:
        _ENTRY_POINT.reset(token)


def current_entry_point() -> str | None:
    """The Trainer entry point running now, or None outside one."""
    return _ENTRY_POINT.get()


class PreemptionVote:
    """The ranks' agreement on where a pre-emption stops, through the side channel (one process: here)."""

    def target(self, here: Position) -> Position:
        """At a point where training may stop (``here``: epoch, batches done in it), after a pre-emption
        signal: the position every rank stops at, at or after ``here``."""
        guard = current_guard()
        return here if guard is None else guard.preemption_target(here, timeout=PREEMPTION_WAIT_S)

    def new_round(self) -> None:
        """Every rank calls this at the start of each fit and after each pre-emption stop: the ranks agree on
        each stop afresh."""
        guard = current_guard()
        if guard is not None:
            guard.new_preemption_round()


_VOTE = PreemptionVote()


def preemption_vote() -> PreemptionVote:
    """This process's pre-emption vote (it asks the process group's side channel, when there is one)."""
    return _VOTE
