"""Each training step's data, shared by the replica groups that take part in it (``strategy="ddp_ft"``).

An epoch's order is tandem's global order (a `GlobalOrderSampler` of one replica:
the seed plus the epoch, shuffled when the loader shuffles), cut into steps of one fixed **global batch**: ``groups x
processes x batch_size`` items, where ``groups`` is the most replica groups the job has (``NUM_REPLICA_GROUPS``) and
``processes`` those of one group. The groups that take part in a step (its quorum, W of them) share its items: their
``W x processes`` ranks take contiguous shares that differ by one item at most. A share is decided when its batch is
loaded, after the step's quorum (`Share` asks for it on first use), so:

- every item of an epoch is trained in exactly one committed step, whatever groups leave or join: a step that was not
  committed is loaded again under the next quorum (the same items, shared anew);
- the epoch keeps its number of steps, and each step its global batch: a group alone trains the whole of it (its
  batches grow ``groups / W`` times), so the loggers' steps and the schedulers' run as in a run without a failure;
- a mid-epoch resume (a group that joins) skips the done steps without a quorum (the skipped shares are never used).

Shares that differ in size are weighted by their items when the gradients are averaged (`Share.weight`), so a
step's update is the mean over its global batch; on the epoch's last step a rank may find no item left: it trains on
one item with weight 0 (its forward and backward run, as the others', and change nothing).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

from torch.utils.data import BatchSampler

from tandem.strategies.samplers import GlobalOrderSampler

#: this rank's place in a step's quorum: (the group's rank among the groups taking part, how many take part)
Quorum = tuple[int, int]


def share_of(items: Sequence[int], consumer: int, consumers: int) -> tuple[list[int], float]:
    """Consumer ``consumer`` of ``consumers``'s contiguous share of ``items`` (sizes differ by one at most) and the
    weight its mean gradient takes before the average over the consumers: ``len(share) * consumers / len(items)``, so
    that the average is the mean over all the items. A consumer with no item left gets the first item, weight 0."""
    base, extra = divmod(len(items), consumers)
    start = consumer * base + min(consumer, extra)
    count = base + (1 if consumer < extra else 0)
    if count == 0:
        return list(items[:1]), 0.0
    return list(items[start : start + count]), count * consumers / len(items)


class Share(Sequence[int]):
    """The items of one step that this rank trains: a sequence of dataset indices, decided on first use (the
    DataLoader's fetch, after the step's quorum) and again with `decide` after a step that was not committed."""

    def __init__(self, shares: StepShares, step: int, items: list[int]) -> None:
        self.shares, self.step, self.items = shares, step, items
        self.weight = 1.0
        self._indices: list[int] | None = None

    def decide(self) -> list[int]:
        """This rank's share under the current quorum (forming it when the step has none yet)."""
        rank, size = self.shares.quorum()
        processes = self.shares.processes
        self._indices, self.weight = share_of(self.items, rank * processes + self.shares.process, size * processes)
        self.shares.latest = self
        return self._indices

    def _decided(self) -> list[int]:
        return self._indices if self._indices is not None else self.decide()

    def __len__(self) -> int:
        return len(self._decided())

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        return self._decided()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._decided())

    def __repr__(self) -> str:
        return f"Share(step={self.step}, items={len(self.items)}, indices={self._indices})"


class StepShares(BatchSampler):
    """The training loader's batch sampler under ``ddp_ft``: one `Share` a step (see the module's docstring).

    A BatchSampler subclass (its ``sampler`` is the epoch's order) so that tandem finds the order below it: the loop
    sets its epoch, a checkpoint records its seed, and a group that joins draws the order the others draw.

    Args:
        order: the epoch's global order (one replica).
        batch_size: the loader's batch size: a rank's share when every group takes part.
        groups: the most replica groups the job has.
        processes: the processes of one group.
        process: this process's rank in its group.
        quorum: this group's place in the current step's quorum, formed when the step has none yet.
        drop_last: the loader's: an epoch's last, partial global batch is left out.
    """

    def __init__(
        self,
        order: GlobalOrderSampler,
        batch_size: int,
        groups: int,
        processes: int,
        process: int,
        quorum: Callable[[], Quorum],
        drop_last: bool = False,
    ) -> None:  # BatchSampler.__init__ is not called: it would check a plain sampler's arguments only
        self.sampler, self.order, self.batch_size, self.drop_last = order, order, batch_size, drop_last
        self.groups, self.processes, self.process, self.quorum = groups, processes, process, quorum
        self.latest: Share | None = None  # the share of the step being trained (the latest one decided)

    @property
    def global_batch(self) -> int:
        """Items a step trains (all of an epoch's steps but a partial last one)."""
        return self.groups * self.processes * self.batch_size

    def __len__(self) -> int:
        items, per_step = len(self.order.dataset), self.global_batch  # type: ignore[arg-type]
        return items // per_step if self.drop_last else math.ceil(items / per_step)

    def __iter__(self) -> Iterator[Any]:
        order, per_step = self.order.global_order(), self.global_batch
        for step in range(len(self)):
            yield Share(self, step, order[step * per_step : (step + 1) * per_step])
