"""Several training loaders (a list, a dict, nested ones, or a ``CombinedLoader``) read as one: the fit loop iterates
``TrainingBatches``, whose batches have the shape the user gave, epoch after epoch, and which can begin an epoch
after its first ``skip`` batches (a mid-epoch resume) with every loader where it stood, or (an elastic resume, see
``tandem.trainer.elastic``) with each loader at a ``Place`` of its global order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader

from tandem.strategies.samplers import GlobalOrderSampler
from tandem.utilities.combined_loader import CombinedLoader
from tandem.utilities.data import SkippableSampler, find_sampler


@dataclass(frozen=True)
class Place:
    """Where one training loader stands in an epoch: in its pass ``cycle`` (0: the first; a ``max_size_cycle``
    loader shorter than the longest starts again), after the first ``consumed`` items of that pass's global order,
    all processes together (None: the pass has ended; the loader's next batch begins its next pass, if any)."""

    cycle: int
    consumed: int | None


@dataclass(frozen=True)
class Begun:
    """An epoch that began at its batch ``at`` with each loader at its place (``places``): ``left``, each loader's
    batches left in that pass then; ``step``, the items of its global order each of its batches takes (processes x
    batch size). An epoch begun at its start is ``Begun.start``; a checkpoint records one begun elsewhere."""

    at: int
    places: tuple[Place, ...]
    left: tuple[int, ...]
    step: tuple[int, ...]

    @classmethod
    def start(cls, lengths: list[int], step: list[int]) -> Begun:
        return cls(0, tuple(Place(0, 0) for _ in lengths), tuple(lengths), tuple(step))

    def places_at(self, batch: int, lengths: list[int], cycling: bool) -> list[Place]:
        """Each loader's place after the epoch's first ``batch`` batches (``lengths``: each loader's batches in a
        whole pass; ``cycling``: a loader whose pass ends starts again, as in ``max_size_cycle``)."""
        done, places = batch - self.at, []
        for place, left, step, length in zip(self.places, self.left, self.step, lengths):
            if done < left:
                assert place.consumed is not None
                places.append(Place(place.cycle, place.consumed + done * step))
            elif not cycling or done == left or not length:
                places.append(Place(place.cycle, None))
            else:  # whole passes after the one begun in, then part of one (a pass that ended exactly: not begun)
                passes, given = divmod(done - left, length)
                places.append(
                    Place(place.cycle + passes, None) if not given else Place(place.cycle + passes + 1, given * step)
                )
        return places

    def record(self) -> dict[str, Any]:
        """The checkpoint's record (``checkpoint["loops"]["data"]["begun"]``); ``from_record`` reads it."""
        loaders = [
            {"pass": p.cycle, "consumed": p.consumed, "left": left, "step": step}
            for p, left, step in zip(self.places, self.left, self.step)
        ]
        return {"at": self.at, "loaders": loaders}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Begun:
        loaders = record["loaders"]
        return cls(
            record["at"],
            tuple(Place(d["pass"], d["consumed"]) for d in loaders),
            tuple(d["left"] for d in loaders),
            tuple(d["step"] for d in loaders),
        )


class TrainingBatches:
    """The fit's batches from ``combined`` (over the processed loaders; ``skippables``: each loader's
    ``SkippableSampler``, or None for all when one cannot skip).

    Like a SkippableSampler for the loop: ``skip`` is consumed by the next ``iter()``, and ``start`` draws the
    epoch's orders and skips without loading data. An elastic resume sets ``pending`` (a ``Begun``): the next
    ``iter()`` places each loader there, and the epoch remembers it (``begun``) for a checkpoint or a replay.
    """

    def __init__(self, combined: CombinedLoader, skippables: list[SkippableSampler] | None) -> None:
        self.combined, self.skippables = combined, skippables
        self.skip = 0
        self.pending: Begun | None = None
        self.begun: Begun | None = None  # the epoch in progress began at these places, not at its start

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
        if self.pending is not None:
            self.begun, self.pending = self.pending, None
            self._place(self.begun.at)
        elif skip and self.begun is not None:  # a replay of an epoch that began elsewhere
            self._place(skip)
        else:
            self._forget_places()
            if skip and self.skippables is not None:
                self.combined._begin_at(skip, self._prepare)
            else:
                iter(self.combined)
        return _batches(self.combined)

    def _place(self, batch: int) -> None:
        """Begin the epoch after its first ``batch`` batches, each loader at its place of its global order as
        ``begun`` counts it (every loader draws a ``GlobalOrderSampler``'s order: tandem's elastic resume)."""
        assert self.begun is not None and self.skippables is not None
        lengths = [len(loader) for loader in self.loaders]
        places = self.begun.places_at(batch, lengths, cycling=self.combined.mode == "max_size_cycle")
        for loader, skippable, place in zip(self.loaders, self.skippables, places):
            sampler = find_sampler(loader)
            assert isinstance(sampler, GlobalOrderSampler)
            if place.consumed is None:  # its pass has ended: the next one is drawn afresh
                sampler.start, sampler.pending_seed = len(sampler.dataset), None  # type: ignore[arg-type]
            else:
                sampler.start = place.consumed
            skippable.skip = 0
        self.combined._begin_at(batch, lambda given: None, cycles=[place.cycle for place in places])

    def _forget_places(self) -> None:
        """An epoch begun at places has ended: what a loader left undrawn of them (the epoch ended before its next
        batch) does not reach the next epoch."""
        if self.begun is None:
            return
        self.begun = None
        for loader in self.loaders:
            sampler = find_sampler(loader)
            if isinstance(sampler, GlobalOrderSampler):
                sampler.start, sampler.pending_seed = 0, None

    def _prepare(self, given: list[int]) -> None:
        assert self.skippables is not None
        for skippable, count in zip(self.skippables, given):
            skippable.skip = count

    def start(self) -> None:
        """Draw each loader's order and skip its done items now, in the loaders' order (see
        ``start``)."""
        for skippable in self.skippables or ():
            skippable.start()

    def set_epoch(self, epoch: int) -> None:
        """``set_epoch`` on each loader's sampler that has one (a DistributedSampler: each loader its own)."""
        for loader in self.loaders:
            sampler = find_sampler(loader) if isinstance(loader, DataLoader) else None
            if sampler is not None and hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)


def _batches(combined: CombinedLoader) -> Iterator[Any]:
    """The batches of the pass ``combined`` has begun, without their indices."""
    while True:
        try:
            batch, _, _ = next(combined)
        except StopIteration:
            return
        yield batch
