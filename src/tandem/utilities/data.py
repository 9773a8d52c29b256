"""DataLoader helpers: rebuilding a loader around a new sampler, skippable samplers, batch sizes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import fields, is_dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler

from tandem.utilities.seed import seed_workers_requested, worker_init_function

# DataLoader.__init__ arguments that are stored under the same attribute name.
_LOADER_ATTRS = (
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
    "generator", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order",
)


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
    if kwargs.get("worker_init_fn") is None and kwargs.get("num_workers", 0) > 0 and seed_workers_requested():
        kwargs["worker_init_fn"] = worker_init_function
    if batch_sampler is not None:
        return type(loader)(loader.dataset, batch_sampler=batch_sampler, **kwargs)
    if loader.batch_sampler is None:  # auto-collation off: the sampler yields whole batches' indices
        return type(loader)(loader.dataset, batch_size=None, sampler=sampler, **kwargs)
    return type(loader)(
        loader.dataset, batch_size=loader.batch_size, drop_last=loader.drop_last, sampler=sampler, **kwargs
    )


class SkippableSampler(Sampler):
    """Wraps a (batch) sampler so an epoch can start after its first ``skip`` items.

    The wrapped sampler's iterator is started eagerly, when this one is: random samplers draw their
    seed from the global RNG at that moment, not later when the first batch is fetched. That makes
    the epoch's order depend only on the RNG state at ``iter(dataloader)``, which the trainer
    records, so a resumed run draws the same order and skips the done batches without loading them.
    """

    def __init__(self, inner: Sampler | Sequence[Any]) -> None:
        self.inner = inner
        self.skip = 0  # consumed (and reset) by the next __iter__

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        skip, self.skip = self.skip, 0
        it = iter(self.inner)
        buffered = [item for _, item in zip(range(skip + 1), it)]  # starts the inner iterator now
        return _chain(buffered[skip:], it)

    def __getattr__(self, name: str) -> Any:  # set_epoch and friends reach the wrapped sampler
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def _chain(head: list[Any], rest: Iterator[Any]) -> Iterator[Any]:
    yield from head
    yield from rest


def make_skippable(loader: DataLoader) -> tuple[DataLoader, SkippableSampler | None]:
    """Rebuild ``loader`` around a :class:`SkippableSampler`; iterable-style loaders are returned as is."""
    if not isinstance(loader, DataLoader) or is_iterable_style(loader):
        return loader, None
    if loader.batch_sampler is not None:
        wrapper = SkippableSampler(loader.batch_sampler)
        return rebuild_dataloader(loader, batch_sampler=wrapper), wrapper
    wrapper = SkippableSampler(loader.sampler)
    return rebuild_dataloader(loader, sampler=wrapper), wrapper


def find_sampler(loader: DataLoader) -> Sampler | None:
    """The index sampler under any batch-sampler wrapping (ours or torch's)."""
    sampler: Any = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    while True:
        if isinstance(sampler, SkippableSampler):
            sampler = sampler.inner
        elif isinstance(sampler, BatchSampler):
            sampler = sampler.sampler
        else:
            return sampler


def extract_batch_size(batch: Any) -> int:
    """Size of dim 0 of the first tensor found in ``batch`` (tensors, mappings, sequences, dataclasses)."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.ndim > 0 else 1
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
