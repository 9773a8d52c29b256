"""The skip agreement (``SkipAgreement``, the side channel's third client): a ``training_step`` that returned None on
one rank while another ran backward is named at once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tandem.strategies.side_channel import group
from tandem.strategies.side_channel.beat import _BEAT_S
from tandem.strategies.side_channel.store import _POLL_BUDGET

if TYPE_CHECKING:
    from tandem.strategies.side_channel.channel import SideChannel


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
    channel = group._CHANNEL
    return channel.skip_agreement if channel is not None and channel.world_size > 1 else None
