"""The collective check (``CollectiveCheck``, the side channel's first client): before each of tandem's own
collectives outside the per-step hot path, the ranks agree that they enter the same one.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tandem.strategies.side_channel.beat import _BEAT_S
from tandem.strategies.side_channel.places import _describe, _ranks
from tandem.strategies.side_channel.store import _POLL_BUDGET
from tandem.utilities.exceptions import CollectiveMismatchError

if TYPE_CHECKING:
    from tandem.strategies.side_channel.channel import SideChannel
    from tandem.strategies.side_channel.places import CallSite


_FIX = (
    "Every rank must make the same Trainer calls (fit, validate, test, predict, save_checkpoint) and log "
    "the same synced values; guard only side effects (files, prints, uploads) with trainer.is_global_zero."
)
_FIX_STALLED = (
    "Every rank must enter the same collectives: make the same Trainer calls (fit, validate, test, predict, "
    "save_checkpoint), log the same synced values and call torch.distributed collectives (dist.barrier, "
    "all_reduce) on every rank; guard only side effects (files, prints, uploads) with trainer.is_global_zero."
)


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
