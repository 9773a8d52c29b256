"""Samplers that shard a DDP job's data, and the reordering that undoes the sharding of predictions.

Training, in the Trainer's ``data_order``:

- ``"sampler"`` (the default, Lightning's numbers): one process draws what the user's sampler draws; a plain
  RandomSampler's epochs are drawn as it draws them (a seed taken from torch's global generator as the epoch
  begins), by a ``GlobalOrderSampler`` that records that seed so a checkpoint can continue the epoch on any
  number of processes. Several processes get Lightning's DistributedSampler: shuffling the training data (even a
  ``shuffle=False`` loader's), seeded with the ``seed_everything`` seed plus the epoch, padded to equal shares.
- ``"global"``: the order does not depend on the number of processes: one process draws the order N processes
  share (seed plus epoch, shuffling only if the loader shuffled, with its ``drop_last``), so 1 and N processes
  train alike.

Either way an epoch's order is a function of what the checkpoint records (the seed and how it is used), and rank r
of N takes its items r, r+N, ...; so global batch k is the block ``order[k·B·N : (k+1)·B·N]`` whatever N is, and a
checkpoint of N processes can continue on N' at the exact next sample (``start``). Samplers of the user's own are
wrapped in a ``DistributedSamplerWrapper`` under several processes, and left alone on one.

Evaluation and predict: ``EvalDistributedSampler`` gives rank r the samples r, r+N, r+2N, ... of the
order one process would see, each exactly once and without padding, so sums and counts reduced across
ranks equal single-device results; ``interleave_predictions`` rebuilds the single-device list of
predictions from every rank's outputs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from tandem.utilities.data import InOrderSampler, drops_last, find_sampler, has_len, rebuild_dataloader, unwrapped
from tandem.utilities.exceptions import incompatible
from tandem.utilities.rank_zero import rank_zero_warn


class GlobalOrderSampler(DistributedSampler):
    """A DistributedSampler (same order, padding and ``drop_last``) that can begin an epoch at item ``start``
    of the global order, on any number of replicas: the elastic resume's way in. ``start`` is consumed by the
    next ``__iter__``; the remaining items are padded (with the epoch's first ones) or cut to a multiple of
    the replicas, so every rank gets as many as the others.

    ``seeding`` says where a shuffled epoch's permutation comes from: ``"epoch"``, the seed plus the epoch
    (DistributedSampler's rule); ``"generator"``, a seed drawn from torch's global generator as the epoch's
    iteration begins (RandomSampler's rule: one process draws exactly a plain RandomSampler's numbers; several
    processes use rank 0's draw). The seed of the epoch being drawn is kept in ``epoch_seed`` for checkpoints; a
    resume sets ``pending_seed`` so that the next epoch drawn is that one again.
    """

    start = 0
    seeding = "epoch"
    epoch_seed: int | None = None
    pending_seed: int | None = None

    def global_order(self) -> list[Any]:
        """The epoch's items in global order: a permutation seeded as ``seeding`` says, or the dataset's order."""
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self._draw_epoch_seed())
            return torch.randperm(len(self.dataset), generator=generator).tolist()  # type: ignore[arg-type]  # map-style
        return list(range(len(self.dataset)))  # type: ignore[arg-type]  # a map-style dataset: sized

    def _draw_epoch_seed(self) -> int:
        if self.pending_seed is not None:
            seed, self.pending_seed = self.pending_seed, None
        elif self.seeding == "epoch":
            seed = self.seed + self.epoch
        else:  # as RandomSampler.__iter__ draws it (an int64 from the global generator)
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
            if self.num_replicas > 1 and dist.is_available() and dist.is_initialized():
                shared = torch.tensor([seed], dtype=torch.int64)
                dist.broadcast(shared, src=0)  # every rank draws (its generator moves alike), rank 0's counts
                seed = int(shared.item())
        self.epoch_seed = seed
        return seed

    def __iter__(self) -> Iterator[Any]:
        start, self.start = self.start, 0
        return iter(shard_order(self.global_order(), start, self.num_replicas, self.rank, self.drop_last))

    def remaining(self, start: int) -> int:
        """How many items this rank draws in an epoch that begins at global item ``start``."""
        left = max(0, len(self.dataset) - start)  # type: ignore[arg-type]  # a map-style dataset: sized
        return left // self.num_replicas if self.drop_last else math.ceil(left / self.num_replicas)

    def order_settings(self) -> dict[str, Any]:
        """What an epoch's order is made from (a checkpoint's record; ``follow`` takes it back)."""
        return {"seed": self.seed, "seeding": self.seeding, "shuffle": self.shuffle, "epoch_seed": self.epoch_seed}

    def follow(self, settings: dict[str, Any], mid_epoch: bool) -> None:
        """Draw the order a checkpoint's run drew (``settings`` from ``order_settings``; a tandem 0.1
        checkpoint records the seed alone). ``mid_epoch``: the epoch in progress continues with its recorded seed.
        This run's ``drop_last`` stays: it decides how many batches the epoch has."""
        self.seed = settings["seed"]
        if "seeding" not in settings:
            return
        self.seeding, self.shuffle = settings["seeding"], settings["shuffle"]
        if mid_epoch and settings["epoch_seed"] is not None:
            self.pending_seed = settings["epoch_seed"]


def shard_order(order: list[Any], start: int, replicas: int, rank: int, drop_last: bool) -> list[Any]:
    """Rank ``rank``'s items of ``order[start:]``: every ``replicas``-th, after cutting the rest to a multiple of
    ``replicas`` (``drop_last``) or padding it with the order's first items (as DistributedSampler pads)."""
    rest = order[start:]
    if drop_last:
        rest = rest[: len(rest) // replicas * replicas]
    elif rest and len(rest) % replicas:
        padding = replicas - len(rest) % replicas
        rest += (order * math.ceil(padding / len(order)))[:padding]
    return rest[rank::replicas]


class SizedIterable(Protocol):
    """A sampler (of indices or batches) with a length."""

    def __iter__(self) -> Iterator[Any]: ...

    def __len__(self) -> int: ...


class DistributedSamplerWrapper(GlobalOrderSampler):
    """Shards the indices a user's sampler draws: every rank draws the whole sequence, then keeps its share.

    The draw happens under the torch seed ``seed + epoch`` so that every rank draws the same sequence
    (a sampler drawing from python's ``random`` or numpy must be seeded alike on every rank).
    """

    def __init__(
        self, sampler: SizedIterable, num_replicas: int, rank: int, seed: int = 0, drop_last: bool = False
    ) -> None:
        super().__init__(
            range(len(sampler)),  # type: ignore[arg-type]  # a DistributedSampler takes only len() of its dataset
            num_replicas=num_replicas,
            rank=rank,
            shuffle=False,
            seed=seed,
            drop_last=drop_last,
        )
        self.sampler = sampler

    def global_order(self) -> list[Any]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + self.epoch)
            return list(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)


class EvalDistributedSampler(Sampler):
    """Rank ``rank`` of ``num_replicas`` takes items rank, rank+N, rank+2N, ... of ``source``, in order:
    every item exactly once, no padding. The items are sample indices, or whole batches when ``source``
    is a batch sampler."""

    def __init__(self, source: Iterable[Any], num_replicas: int, rank: int) -> None:
        self.source = source
        self.num_replicas = num_replicas
        self.rank = rank

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.source), self.rank, None, self.num_replicas)

    def __len__(self) -> int:
        return len(range(self.rank, _length(self.source), self.num_replicas))

    def set_epoch(self, epoch: int) -> None:
        """The epoch for a source that orders by it (a shuffled loader's order, a sampler of the user's)."""
        if callable(set_epoch := getattr(self.source, "set_epoch", None)):
            set_epoch(epoch)


class FirstItems(BatchSampler):
    """The first ``count`` items of ``sampler`` (indices or batches).

    A BatchSampler subclass only so that ``find_sampler`` sees through it
    to the sampler below, whose ``set_epoch`` the Trainer calls.
    """

    def __init__(self, sampler: Iterable[Any], count: int) -> None:  # BatchSampler.__init__ is not called
        self.sampler = sampler
        self.count = count

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.sampler), self.count)

    def __len__(self) -> int:
        return min(self.count, _length(self.sampler))

    def set_epoch(self, epoch: int) -> None:
        if callable(set_epoch := getattr(self.sampler, "set_epoch", None)):
            set_epoch(epoch)


#: the Trainer's ``data_order`` choices (see the module's docstring)
DATA_ORDERS = ("sampler", "global")


def _length(source: Iterable[Any]) -> int:
    """``len(source)``: a TypeError where it has no length (a loader over it then has none either)."""
    if not isinstance(source, Sized):
        raise TypeError(f"object of type {type(source).__name__!r} has no len()")
    return len(source)


def _is_plain_random(sampler: object) -> bool:
    return type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None


def shard_training(
    loader: DataLoader, num_replicas: int, rank: int, seed: int, data_order: str = "sampler"
) -> DataLoader:
    """The user's sampler becomes a DistributedSampler or is wrapped in one. ``data_order="sampler"``: a
    RandomSampler or SequentialSampler becomes Lightning's training DistributedSampler (shuffling, padded);
    ``"global"``: the order one process draws too (shuffling only if the loader did, with its ``drop_last``).

    ``seed`` must be the same on every rank, or the ranks would shard different permutations.
    """
    custom = type(loader.batch_sampler) is not BatchSampler and loader.batch_sampler is not None
    drawn = loader.batch_sampler if custom else find_sampler(loader)
    if not has_len(drawn):
        raise incompatible(
            f"The training DataLoader's {'batch_sampler' if custom else 'sampler'} {type(drawn).__name__}",
            "it has no __len__, so tandem cannot split it between the ranks with a DistributedSampler",
            "Give it a __len__, or shard the data yourself (each rank its own sampler or IterableDataset) and pass "
            "Trainer(use_distributed_sampler=False): tandem then ends each epoch for all ranks at the first batch "
            "one of them lacks.",
        )
    sized = cast(SizedIterable, drawn)  # has_len took its len()
    if custom:
        wrapper = DistributedSamplerWrapper(sized, num_replicas, rank, seed)
        return rebuild_dataloader(loader, batch_sampler=wrapper)
    sampler = find_sampler(loader)
    if isinstance(sampler, DistributedSampler):
        return loader
    if data_order == "sampler" and isinstance(sampler, (RandomSampler, SequentialSampler)):
        shuffle = not isinstance(sampler, InOrderSampler)  # Lightning's: "shuffle=True for the train sampler"
        new: Sampler = GlobalOrderSampler(loader.dataset, num_replicas, rank, shuffle=shuffle, seed=seed)
    elif type(sampler) in (SequentialSampler, InOrderSampler) or _is_plain_random(sampler):
        new = _global_order(loader, num_replicas, rank, seed)
    else:
        new = DistributedSamplerWrapper(sized, num_replicas, rank, seed, drops_last(loader))
    return rebuild_dataloader(loader, sampler=new)


def ordered_training(loader: DataLoader, seed: int, data_order: str = "sampler") -> DataLoader:
    """One process's training loader, drawing its order through a ``GlobalOrderSampler`` of one replica
    that a checkpoint can continue on any number of processes. ``data_order="sampler"``: the numbers the user's
    sampler draws (a plain RandomSampler's seed per epoch from the global generator; a SequentialSampler's
    order); ``"global"``: the order N processes would share, seeded with ``seed + epoch``. Other samplers stay."""
    if not isinstance(loader, DataLoader) or type(loader.batch_sampler) is not BatchSampler:
        return loader
    sampler = find_sampler(loader)
    if type(sampler) not in (SequentialSampler, InOrderSampler) and not _is_plain_random(sampler):
        return loader
    if data_order == "global":
        return rebuild_dataloader(loader, sampler=_global_order(loader, 1, 0, seed))
    if isinstance(sampler, RandomSampler) and sampler.generator is not None:
        return loader  # it draws from the user's generator, whose states tandem does not record
    order = GlobalOrderSampler(loader.dataset, num_replicas=1, rank=0, shuffle=isinstance(sampler, RandomSampler))
    order.seeding = "generator"
    return rebuild_dataloader(loader, sampler=order)


def _global_order(loader: DataLoader, num_replicas: int, rank: int, seed: int) -> GlobalOrderSampler:
    shuffle = type(find_sampler(loader)) is RandomSampler
    return GlobalOrderSampler(
        loader.dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=drops_last(loader)
    )


def shard_evaluation(loader: DataLoader, num_replicas: int, rank: int, seed: int = 0) -> DataLoader:
    """Interleave samples across ranks, each exactly once: in dataset order, or for a shuffling loader (a
    RandomSampler) in Lightning's evaluation order, a permutation seeded with ``seed`` plus the epoch that every
    rank draws alike (its DistributedSampler's, ``shuffle=True``; ``seed`` must be the same on every rank)."""
    batches = loader.batch_sampler
    if type(batches) is BatchSampler:  # its own settings: a loader given it has batch_size None, drop_last False
        sampler, batch_size = batches.sampler, batches.batch_size
        if type(sampler) is RandomSampler:  # rank r's items are the DistributedSampler's, less its padding
            source: Iterable[Any] = GlobalOrderSampler(loader.dataset, num_replicas=1, rank=0, shuffle=True, seed=seed)
        elif isinstance(sampler, (SequentialSampler, RandomSampler, DistributedSampler)):
            dataset = cast(Sized, loader.dataset)  # these samplers draw from len(dataset) indices
            source = range(len(dataset))  # in order: every rank must agree on the sequence
        else:
            source = sampler
        if batches.drop_last:  # one process would drop the last partial batch: drop the same samples
            source = FirstItems(source, _length(source) - _length(source) % batch_size)
        shard = EvalDistributedSampler(source, num_replicas, rank)
        return rebuild_dataloader(loader, batch_sampler=BatchSampler(shard, batch_size, drop_last=False))
    if batches is not None:  # a custom batch sampler: whole batches go round the ranks
        shard = EvalDistributedSampler(batches, num_replicas, rank)
        return rebuild_dataloader(loader, batch_sampler=shard)
    return rebuild_dataloader(loader, sampler=EvalDistributedSampler(loader.sampler, num_replicas, rank))


def evaluation_layout(loader: DataLoader) -> int | None:
    """The batch size when samples went round the ranks, 0 when whole batches did, None when not sharded."""
    batches = unwrapped(loader.batch_sampler)
    if isinstance(batches, BatchSampler) and isinstance(batches.sampler, EvalDistributedSampler):
        return batches.batch_size
    if isinstance(batches, EvalDistributedSampler) or (
        batches is None and isinstance(unwrapped(loader.sampler), EvalDistributedSampler)
    ):
        return 0
    return None


# ---------------------------------------------------------------------------------------------- predictions


def interleave_predictions(per_rank: list[list[Any]], batch_size: int) -> list[Any]:
    """Undo the evaluation sharding: rank r's outputs covered samples (or, with ``batch_size=0``,
    batches) r, r+N, ...; return the per-batch outputs one process would have produced.

    Batch outputs are split per sample along dim 0 of every tensor (lists count as per-sample values,
    dicts and tuples as structure), put back in dataset order and re-batched by ``batch_size``. If an
    output cannot be split that way, the ranks' outputs are returned one rank after the other.
    """
    n = len(per_rank)
    if batch_size == 0:
        return [per_rank[j % n][j // n] for j in range(sum(len(p) for p in per_rank))]
    split = [_split_all(outputs) for outputs in per_rank]
    samples = [s for s in split if s is not None]
    total = sum(len(s) for s in samples)
    if len(samples) != n or any(len(s) != len(range(r, total, n)) for r, s in enumerate(samples)):
        rank_zero_warn(
            "predict_step outputs could not be split per sample along dim 0; the predictions are "
            "returned rank after rank (rank r predicted samples r, r+N, ...)."
        )
        return [output for outputs in per_rank for output in outputs]
    ordered = [samples[i % n][i // n] for i in range(total)]
    return [_join(ordered[k : k + batch_size]) for k in range(0, total, batch_size)]


def _split_all(outputs: list[Any]) -> list[Any] | None:
    pieces: list[Any] = []
    for output in outputs:
        split = _split(output)
        if split is None:
            return None
        pieces.extend(split)
    return pieces


def _split(obj: Any) -> list[Any] | None:
    """One batch output as a list of per-sample pieces of the same structure, or None."""
    if isinstance(obj, torch.Tensor):
        return list(obj.split(1)) if obj.ndim > 0 else None
    if isinstance(obj, list):
        return [[item] for item in obj]
    if isinstance(obj, Mapping):
        items: Iterable[tuple[Any, Any]] = obj.items()
    elif isinstance(obj, tuple):
        items = enumerate(obj)
    else:
        return None
    parts: dict[Any, list[Any]] = {}
    for key, value in items:
        split = _split(value)
        if split is None:
            return None
        parts[key] = split
    lengths = {len(p) for p in parts.values()}
    if len(lengths) != 1:
        return None
    count = lengths.pop()
    if isinstance(obj, Mapping):
        return [{key: parts[key][i] for key in parts} for i in range(count)]
    return [_tuple_like(obj, [parts[j][i] for j in range(len(obj))]) for i in range(count)]


def _join(pieces: list[Any]) -> Any:
    first = pieces[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(pieces)
    if isinstance(first, list):
        return [item for piece in pieces for item in piece]
    if isinstance(first, Mapping):
        return {key: _join([p[key] for p in pieces]) for key in first}
    return _tuple_like(first, [_join([p[j] for p in pieces]) for j in range(len(first))])


def _tuple_like(template: tuple, items: list[Any]) -> tuple:
    return type(template)(*items) if hasattr(template, "_fields") else tuple(items)
