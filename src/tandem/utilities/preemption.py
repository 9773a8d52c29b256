"""Pre-emption signals (SIGTERM, SIGUSR1): this process's record of one, and the handlers that set it.

A cluster pre-empts a job with SIGTERM (SLURM sends SIGUSR1 ahead of it with ``--signal=USR1@90``). While
``trainer.fit`` runs, tandem's handler only records the signal here (and forwards it to the ranks this
process started). The training loop reads ``Preemption.signum`` after each batch (a local attribute,
no collective); the ranks agree on the step to stop at through the side channel's pre-emption vote
(``tandem.strategies.side_channel``), save ``last.ckpt`` there and raise ``Preempted``.

``PREEMPTION`` is one record per process, not per Trainer or process group: signal handlers belong to the
process, and the process that started the ranks (which has no loop and no process group) forwards the
signals it receives to them through the same record.

A SIGTERM is also how a job is torn down: torchrun stops the other workers with it after one failed, and
tandem's launcher its ranks. That is no pre-emption (nothing will resume; waiting for a vote only delays the
end): when the side channel says the job is being torn down (``Preemption.teardown``), the handler ends the
process at once, as SIGTERM does without a handler.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

#: the signals that ask for a pre-emption stop
SIGNALS = (signal.SIGTERM, signal.SIGUSR1) if hasattr(signal, "SIGUSR1") else (signal.SIGTERM,)
#: how a process stopped by one of them exits: 128 + the signal's number, as a shell reports a signal
EXIT_CODES = frozenset(128 + int(s) for s in SIGNALS)

#: (epoch, training batches finished in it): where a rank is, as the ranks compare positions
Position = tuple[int, int]
#: the training loop's (epoch, batches finished in it, whether the epoch's end is running)
Progress = tuple[int, int, bool]


class Preemption:
    """This process's pre-emption state: the signal received (``signum``), the processes to forward it to,
    and, during a fit, where the training loop is (``progress``, read by the side channel's watcher thread)."""

    def __init__(self) -> None:
        self.signum: int | None = None  # a stop was asked for and has not happened yet
        self.stopped: int | None = None  # the signal of the last stop this process made (its ranks exit for it)
        self.forward_to: Callable[[], list[int]] | None = None  # the running ranks this process started
        self.progress: Callable[[], Progress] | None = None
        #: why the job is being torn down (a rank failed; the launcher stops every rank), or None: the side
        #: channel answers it. A SIGTERM then is the teardown, not a pre-emption: the process ends at once.
        self.teardown: Callable[[], str | None] | None = None
        self._previous: dict[int, Any] = {}

    def request(self, signum: int) -> None:
        """Ask for a stop (from a signal handler, or told by another rank through the store)."""
        if self.signum is None:
            self.signum = int(signum)

    def done(self) -> None:
        """The stop happened (``last.ckpt`` written)."""
        self.stopped, self.signum = self.signum, None

    def install(self) -> None:
        """Catch the pre-emption signals (main thread only; a signal ignored with SIG_IGN stays ignored)."""
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return
        for signum in SIGNALS:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN:
                continue
            self._previous[int(signum)] = previous
            signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        """Put back the handlers that were there before ``install``."""
        for signum, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        for pid in self.forward_to() if self.forward_to is not None else []:  # SLURM may not signal them
            with contextlib.suppress(OSError):
                os.kill(pid, signum)
        if self.teardown is not None and self.teardown() is not None:
            # torchrun, or tandem's launcher, ends the job after a rank failed: end as if tandem had no handler
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.request(signum)
        previous = self._previous.get(int(signum))
        if callable(previous):  # a handler of the user's keeps running
            previous(signum, frame)


#: the one record per process
PREEMPTION = Preemption()
