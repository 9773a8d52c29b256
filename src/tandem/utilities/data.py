"""DataLoader helpers: rebuilding a loader around a new sampler, skippable samplers, batch sizes, workers that
end with their process."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from dataclasses import fields, is_dataclass
from typing import Any, cast

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler, SequentialSampler

from tandem.utilities.processes import end_with_parent
from tandem.utilities.rank_zero import rank_zero_warn
from tandem.utilities.seed import pl_worker_init_function, seed_workers_requested

# DataLoader.__init__ arguments that are stored under the same attribute name.
_LOADER_ATTRS = (
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


class _DieWithParent:
    """A DataLoader ``worker_init_fn`` that first makes the worker end with the process that started it
    (Linux ``PR_SET_PDEATHSIG``), then runs the user's. Without it a worker outlives a killed rank by up to
    5 s (until torch's own check of its parent). A class, so loaders with a "spawn" context can pickle it."""

    def __init__(self, inner: Callable[[int], Any] | None, parent: int) -> None:
        self.inner, self.parent = inner, parent

    def __call__(self, worker_id: int) -> None:
        end_with_parent()
        try:  # the parent (not always this worker's parent process: a forkserver starts workers) still runs?
            os.kill(self.parent, 0)
        except ProcessLookupError:
            os._exit(1)  # it died before prctl took effect
        if self.inner is not None:
            self.inner(worker_id)


def end_workers_with_process(loader: Any) -> None:
    """Make ``loader``'s worker processes (if any) end as soon as this process ends, however it ends."""
    if sys.platform != "linux" or not isinstance(loader, DataLoader) or not loader.num_workers:
        return
    if not isinstance(loader.worker_init_fn, _DieWithParent):
        loader.worker_init_fn = _DieWithParent(loader.worker_init_fn, os.getpid())


def seed_workers(loader: Any, rank: int) -> None:
    """After ``seed_everything(workers=True)``: give ``loader`` (a DataLoader without a ``worker_init_fn`` of its
    own) Lightning's ``pl_worker_init_function`` for this ``rank``, as Lightning does to
    every loader its Trainer runs."""
    if not isinstance(loader, DataLoader) or not seed_workers_requested():
        return
    init = loader.worker_init_fn
    seeding = functools.partial(pl_worker_init_function, rank=rank)
    if init is None:
        loader.worker_init_fn = seeding
    elif isinstance(init, _DieWithParent) and init.inner is None:
        init.inner = seeding


def has_len(loader: Any) -> bool:
    try:
        len(loader)
    except (TypeError, NotImplementedError):
        return False
    return True


def is_iterable_style(loader: Any) -> bool:
    return isinstance(loader, DataLoader) and isinstance(loader.dataset, IterableDataset)


def rebuild_dataloader(
    loader: DataLoader, *, sampler: Sampler | None = None, batch_sampler: Sampler | None = None
) -> DataLoader:
    """A new DataLoader like ``loader`` but drawing indices from ``sampler`` or ``batch_sampler``.

    Only ``torch.utils.data.DataLoader`` itself can be rebuilt faithfully; a subclass with its own
    ``__init__`` is rejected with a message rather than rebuilt wrongly.
    """
    if type(loader).__init__ is not DataLoader.__init__:
        raise TypeError(
            f"tandem needs to replace the sampler of your {type(loader).__name__}, a DataLoader subclass with "
            "its own __init__, and cannot rebuild it safely. Use torch.utils.data.DataLoader, or pass "
            "use_distributed_sampler=False to the Trainer and shard the data yourself."
        )
    kwargs = {name: getattr(loader, name) for name in _LOADER_ATTRS if hasattr(loader, name)}
    if kwargs.get("num_workers", 0) == 0:
        kwargs.pop("prefetch_factor", None)
        kwargs["persistent_workers"] = False
    init = kwargs.get("worker_init_fn")
    if isinstance(init, _DieWithParent):
        kwargs["worker_init_fn"] = _DieWithParent(init.inner, init.parent)
    if batch_sampler is not None:
        return type(loader)(loader.dataset, batch_sampler=batch_sampler, **kwargs)
    batches = loader.batch_sampler
    if batches is None:  # auto-collation off: the sampler yields whole batches' indices
        return type(loader)(loader.dataset, batch_size=None, sampler=sampler, **kwargs)
    if type(batches) is not BatchSampler:
        raise TypeError(
            f"rebuild_dataloader(sampler=...) of a DataLoader batched by a {type(batches).__name__}: a new sampler "
            "goes under torch's BatchSampler only (this one would be dropped); pass batch_sampler=... instead."
        )
    # the BatchSampler's settings: DataLoader(batch_sampler=BatchSampler(...)) leaves batch_size None, drop_last False
    return type(loader)(
        loader.dataset, batch_size=batches.batch_size, drop_last=batches.drop_last, sampler=sampler, **kwargs
    )


class InOrderSampler(SequentialSampler):
    """A SequentialSampler that no data order shuffles (``overfit_batches``: the same batches every epoch)."""


def in_order(loader: Any, name: str) -> Any:
    """``loader`` drawing its samples in order (``overfit_batches``: the same batches every epoch): a shuffling
    DataLoader is rebuilt with an ``InOrderSampler`` and a warning (Lightning's), an ordered one without;
    anything else is returned as is."""
    if not isinstance(loader, DataLoader) or type(loader.batch_sampler) not in (BatchSampler, type(None)):
        return loader  # a batch sampler of the user's draws its own order
    sampler = find_sampler(loader)
    if type(sampler) not in (RandomSampler, SequentialSampler):
        return loader
    if isinstance(sampler, RandomSampler):
        rank_zero_warn(
            f"Trainer(overfit_batches=...) trains on the same batches every epoch, but the {name} shuffle; tandem "
            "turns their shuffling off for this run. Pass shuffle=False to silence this warning."
        )
    dataset = cast(Sized, loader.dataset)  # its RandomSampler or SequentialSampler draws from len(dataset) indices
    return rebuild_dataloader(loader, sampler=InOrderSampler(dataset))


class SkippableSampler(Sampler):
    """Wraps a (batch) sampler so an epoch can start after its first ``skip`` items.

    Iteration is as lazy as the wrapped sampler's (a plain loop and tandem draw the same shuffled order
    from the same seed). For a resume, ``start`` begins the newest iteration without fetching any
    data: a random sampler draws its seed from the global RNG at that moment, so the trainer can
    replay the epoch's recorded RNG state, start, skip the done batches' indices, and then restore the
    checkpoint's RNG state before the first batch is loaded.
    """

    def __init__(self, inner: Iterable[Any]) -> None:
        self.inner = inner
        self.skip = 0  # consumed (and reset) by the next __iter__
        self._latest: _SkippingIterator | None = None

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]  # as a DataLoader, asked only of samplers with a length

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        if not skip:  # the usual epoch: the wrapped sampler's own iterator, no per-batch cost
            self._latest = None
            return iter(self.inner)
        self._latest = _SkippingIterator(self.inner, skip)
        return self._latest

    def start(self) -> None:
        """Start the newest iteration now (draw its random order and skip), without loading data."""
        if self._latest is not None:
            self._latest.start()

    def __getattr__(self, name: str) -> Any:  # set_epoch and friends reach the wrapped sampler
        if name in ("inner", "_latest", "skip"):
            raise AttributeError(name)
        return getattr(self.inner, name)


class _SkippingIterator:
    def __init__(self, inner: Iterable[Any], skip: int) -> None:
        self._inner, self._skip = inner, skip
        self._it: Iterator[Any] | None = None

    def start(self) -> Iterator[Any]:
        if self._it is None:
            self._it = iter(self._inner)
            for _ in zip(range(self._skip), self._it):
                pass
        return self._it

    def __iter__(self) -> _SkippingIterator:
        return self

    def __next__(self) -> Any:
        it = self._it
        if it is None:
            it = self.start()
        return next(it)


def unwrapped(sampler: Any) -> Any:
    """``sampler`` without tandem's ``SkippableSampler`` around it."""
    return sampler.inner if isinstance(sampler, SkippableSampler) else sampler


def make_skippable(loader: DataLoader) -> tuple[DataLoader, SkippableSampler | None]:
    """Rebuild ``loader`` around a ``SkippableSampler``; iterable-style loaders are returned as is."""
    if not isinstance(loader, DataLoader) or is_iterable_style(loader):
        return loader, None
    if loader.batch_sampler is not None:
        wrapper = SkippableSampler(loader.batch_sampler)
        return rebuild_dataloader(loader, batch_sampler=wrapper), wrapper
    wrapper = SkippableSampler(loader.sampler)
    return rebuild_dataloader(loader, sampler=wrapper), wrapper


def find_sampler(loader: DataLoader) -> Sampler | None:
    """The index sampler under any batch-sampler wrapping (ours or torch's): a BatchSampler's own (the loader's
    ``sampler`` is an unused SequentialSampler when a BatchSampler was given as ``batch_sampler``)."""
    sampler: Any = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    while True:
        if isinstance(sampler, SkippableSampler):
            sampler = sampler.inner
        elif isinstance(sampler, BatchSampler):
            sampler = sampler.sampler
        else:
            return sampler


def drops_last(loader: DataLoader) -> bool:
    """Whether ``loader`` drops its last partial batch: its BatchSampler's setting (``DataLoader(batch_sampler=
    BatchSampler(..., drop_last=True))`` leaves the loader's own ``drop_last`` False)."""
    batches = loader.batch_sampler
    return batches.drop_last if type(batches) is BatchSampler else loader.drop_last


def set_sampler_epoch(loader: Any, epoch: int) -> None:
    """``set_epoch(epoch)`` on the loader's sampler and on its batch sampler's sampler, each once, where they have one
    (Lightning's ``_set_sampler_epoch``: a DistributedSampler, or a sampler of the user's that shuffles by epoch)."""
    samplers: dict[int, Any] = {}
    if (sampler := getattr(loader, "sampler", None)) is not None:
        samplers[id(sampler)] = sampler
    batches = unwrapped(getattr(loader, "batch_sampler", None))
    if batches is not None and (sampler := getattr(batches, "sampler", None)) is not None:
        samplers[id(sampler)] = sampler
    for sampler in samplers.values():
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)


def extract_batch_size(batch: Any) -> int:
    """Size of dim 0 of the first tensor found in ``batch`` (tensors, mappings, sequences, dataclasses)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.ndim > 0 else 1
    values: Iterable[Any]
    if isinstance(batch, Mapping):
        values = batch.values()
    elif is_dataclass(batch) and not isinstance(batch, type):
        values = (getattr(batch, f.name) for f in fields(batch))
    elif isinstance(batch, (list, tuple)):
        values = batch
    else:
        values = ()
    for value in values:
        size = extract_batch_size(value)
        if size:
            return size
    return 0


def is_empty_batch(batch: Any) -> bool:
    """The batch holds no samples: its first tensor (the batch itself, or the first item of a tuple, list or dict)
    has 0 rows, and so has every other tensor ``extract_batch_size`` looks at. Reads host-side shapes only
    (no device sync); batches of other shapes are taken as not empty. Called on every training batch, so the
    common case is a few C-level calls (``torch.Tensor``'s own ``isinstance`` check runs Python code: the C base
    class is tested instead)."""
    first, kind = batch, type(batch)
    if kind is tuple or kind is list:
        first = batch[0] if batch else None
    elif kind is dict:
        first = next(iter(batch.values()), None)
    if not isinstance(first, _TENSOR_BASE):
        return False
    return not first.numel() and first.ndim > 0 and extract_batch_size(batch) == 0


_TENSOR_BASE = getattr(torch._C, "TensorBase", torch.Tensor)  # what isinstance(t, torch.Tensor) tests, in C
