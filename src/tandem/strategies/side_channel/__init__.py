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

The Strategy keeps placement and collectives; coordination between ranks lives here. The cost of a
checked collective is a few store round trips (no work on the per-step path);
``benchmarks/collective_check.py`` measures it.

Where each part lives, one job a file:

- ``store.py``: ``SignedStore``, the process group's store as the channel reads and writes it (what it is trusted
  with, and how values are signed).
- ``channel.py``: ``SideChannel``, one per process group: the watcher thread and its beats, how a rank left, the
  job's teardown, ``explain`` (which rank a broken collective waited for).
- ``beat.py``: the beat each rank's watcher posts once a second (``_Beat``).
- ``hang.py``: the hang watch (``HangWatch``) in rank 0's watcher, and the table it prints.
- ``places.py``: where a rank is: the Trainer entry point (``entry_point``), its loop's place (``placed``), a
  collective's call site (``CallSite``), the main thread's frame as the watcher samples it, an error's summary.
- ``collective_check.py``: the first client, ``CollectiveCheck``.
- ``preemption.py``: the second client, ``PreemptionVote`` (``preemption_vote``: this process's).
- ``skipped_batch.py``: the third client, ``SkipAgreement`` (``skip_agreement``: this process's).
- ``group.py``: this process's channel (``current_channel``, ``close_channel``; ``channel.py``'s ``open_channel`` sets
  it), the group's run id and secret, ``announce_teardown``, ``report_for_the_job``.

Process-wide state, and why each piece is needed:

- ``group._CHANNEL``, the side channel of the default process group. The group is joined once per process and
  outlives each Trainer and its strategy (``teardown`` keeps it, so that ``trainer.test()`` after
  ``fit()`` and a next Trainer in the same script use it again), so its channel is the group's, not a
  strategy's: the strategy that joins the group opens it (``open_channel``), destroying the group closes
  it (``close_channel``).
- ``places._ENTRY_POINT``, a context variable: the Trainer entry point running now, set for a block.
- ``PREEMPTION`` (``tandem.utilities.preemption``): the signal record. Signal handlers
  belong to the process, and the process that started the ranks forwards signals with no group joined.
"""

from __future__ import annotations

from tandem.strategies.side_channel.channel import open_channel

# the names the Trainer and the strategies import from here; each module above is their home
from tandem.strategies.side_channel.group import (
    announce_teardown,
    close_channel,
    current_channel,
    new_run_id,
    new_secret,
    report_for_the_job,
)
from tandem.strategies.side_channel.places import CallSite, broke_in_torch, entry_point, error_summary, placed
from tandem.strategies.side_channel.preemption import preemption_vote
from tandem.strategies.side_channel.skipped_batch import SkipAgreement, skip_agreement

__all__ = [
    "CallSite",
    "SkipAgreement",
    "announce_teardown",
    "broke_in_torch",
    "close_channel",
    "current_channel",
    "entry_point",
    "error_summary",
    "new_run_id",
    "new_secret",
    "open_channel",
    "placed",
    "preemption_vote",
    "report_for_the_job",
    "skip_agreement",
]
