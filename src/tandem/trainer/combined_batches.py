"""Several training loaders (a list, a dict, nested ones, or a ``CombinedLoader``) read as one: the fit loop iterates
:class:`TrainingBatches`, whose batches have the shape the user gave, epoch after epoch, and which can begin an epoch
after its first ``skip`` batches (a mid-epoch resume) with every loader where it stood."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from tandem.utilities.combined_loader import CombinedLoader
from tandem.utilities.data import SkippableSampler, find_sampler


class TrainingBatches:
    """The fit's batches from ``combined`` (over the processed loaders; ``skippables``: each loader's
    :class:`~tandem.utilities.data.SkippableSampler`, or None for all when one cannot skip).

    Like a SkippableSampler for the loop: ``skip`` is consumed by the next ``iter()``, and :meth:`start` draws the
    epoch's orders and skips without loading data.
    """

    def __init__(self, combined: CombinedLoader, skippables: list[SkippableSampler] | None) -> None:
        self.combined, self.skippables = combined, skippables
        self.skip = 0

    @property
    def loaders(self) -> list[Any]:
        return self.combined.flattened

    def __len__(self) -> int:
        length = self.combined._length()
        if length == float("inf"):
            raise TypeError("a loader of unknown length decides the number of batches")
        return int(length)

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        if skip and self.skippables is not None:
            self.combined._begin_at(skip, self._prepare)
        else:
            iter(self.combined)
        return _batches(self.combined)

    def _prepare(self, given: list[int]) -> None:
        assert self.skippables is not None
        for skippable, count in zip(self.skippables, given):
            skippable.skip = count

    def start(self) -> None:
        """Draw each loader's order and skip its done items now, in the loaders' order (see
        :meth:`~tandem.utilities.data.SkippableSampler.start`)."""
        for skippable in self.skippables or ():
            skippable.start()

    def set_epoch(self, epoch: int) -> None:
        """``set_epoch`` on each loader's sampler that has one (a DistributedSampler: each loader its own)."""
        for loader in self.loaders:
            sampler = find_sampler(loader) if isinstance(loader, DataLoader) else None
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)


def _batches(combined: CombinedLoader) -> Iterator[Any]:
    """The batches of the pass ``combined`` has begun, without their indices."""
    while True:
        try:
            batch, _, _ = next(combined)
        except StopIteration:
            return
        yield batch
