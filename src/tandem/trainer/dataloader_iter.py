"""The ``dataloader_iter`` flavour of a step (Lightning's): ``training_step(self, dataloader_iter)`` (or
``validation_step`` / ``test_step`` / ``predict_step``) pulls its batches itself with ``next(dataloader_iter)``,
which returns ``(batch, batch_idx, dataloader_idx)``.

The loop calls the step again while the stage's data is not used up: until a step takes the last batch of a
loader of known length (or of its ``limit_*_batches``), or meets the end of one of unknown length, or lets the
``StopIteration`` of an empty iterator out. The batch hooks get the last batch taken (None before the first) and
its indices. The batch stays as the loader made it: moving it to the device is the step's (Lightning's rule).
Which flavour a step is, is decided once per loop run, from its signature.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from tandem.utilities.exceptions import PossibleUserWarning
from tandem.utilities.rank_zero import rank_zero_warn


def warn_experimental(step_name: str) -> None:
    """Lightning's warning where a loop finds the flavour: experimental, and the hooks' ``batch_idx`` is the last
    batch taken."""
    rank_zero_warn(
        f"Found `dataloader_iter` argument in the `{step_name}`. Note that the support for this signature is "
        "experimental and the behavior is subject to change. If you consume the iterator more than once per step, "
        "the `batch_idx` argument in any hook that takes it will not match with the batch index of the last batch "
        "consumed, and gradient accumulation counts steps, not batches.",
        category=PossibleUserWarning,
    )


class DataLoaderIter(Iterator[tuple[Any, int, int]]):
    """What a ``*_step(self, dataloader_iter)`` gets: ``next(dataloader_iter)`` returns the next ``(batch,
    batch_idx, dataloader_idx)`` of the stage's data, and raises ``StopIteration`` once it is used up.

    Attributes (read by the loop, and by a step that wants them): ``done``, the data is used up (no more steps);
    ``fetched``, the batches taken in this pass; ``length``, the batches the pass has (None: unknown); ``batch``,
    ``batch_idx``, ``dataloader_idx``, the last batch taken and its indices (None, 0, 0 before the first).

    Args:
        source: the stage's ``(batch, batch_idx, dataloader_idx)`` in order, limits applied.
        length: how many ``source`` holds (``math.inf``: unknown, the end is found by reading past it).
    """

    def __init__(self, source: Iterator[tuple[Any, int, int]], length: int | float) -> None:
        self._source = source
        self.length: int | None = None if length == math.inf else int(length)
        self.fetched = 0
        self.done = length == 0
        self.batch: Any = None
        self.batch_idx = 0
        self.dataloader_idx = 0

    def __iter__(self) -> DataLoaderIter:
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self.done:
            raise StopIteration
        try:
            item = next(self._source)
        except StopIteration:
            self.done = True
            raise
        self.fetched += 1
        if self.length is not None:
            self.done = self.fetched >= self.length
        self.batch, self.batch_idx, self.dataloader_idx = item
        return item


def training_source(batches: Iterator[Any], start: int) -> Iterator[tuple[Any, int, int]]:
    """The training epoch's batches (from batch ``start`` on) as ``(batch, batch_idx, 0)``: several training
    loaders are read as one, their batch in the structure given (Lightning's)."""
    for batch_idx, batch in enumerate(batches, start=start):
        yield batch, batch_idx, 0


def evaluation_source(loaders: Iterator[Iterator[Any]]) -> Iterator[tuple[Any, int, int]]:
    """An evaluation stage's loaders one after another (each iterator made when it is reached), as ``(batch,
    batch_idx, dataloader_idx)``: a step may take batches across a loader's end (Lightning's sequential mode)."""
    for dataloader_idx, batches in enumerate(loaders):
        for batch_idx, batch in enumerate(batches):
            yield batch, batch_idx, dataloader_idx
