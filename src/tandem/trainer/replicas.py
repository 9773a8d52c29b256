"""Replicas that must stay alike: under DDP every rank holds the whole module, and every rank must hold the same
parameters and buffers and train on its own share of the data. Neither is checked by torch, and when either
fails the run finishes without a word: rank 0's weights are saved, or every sample is trained on once per rank.

Where tandem looks, only for a strategy whose processes hold identical replicas
(``identical_replicas``: DDP, not FSDP's shards) and only with several
processes; one process does no work at all:

- **Parameters and buffers, at each training epoch's end and before each checkpoint is built.** One checksum a
  tensor (the wrapping integer sum of its bits read as 32-bit words: equal for bitwise-equal tensors whatever the
  order of the reduction, so no tolerance is needed and none can hide a divergence; as fast as a float sum), one
  all-reduce of the smallest and largest value of each checksum across the ranks (16 bytes a tensor, whatever the
  number of ranks: a gather's result would grow with it), one read. A difference (smallest != largest) is a
  [`ReplicasDivergedError`][tandem.utilities.exceptions.ReplicasDivergedError] on every rank (every rank sees the same
  reduced numbers and takes the same decision); only then are the checksums gathered, to name the first tensor that
  differs and the ranks whose copy differs. DDP averages the gradients in backward, so the ranks' parameters stay
  bitwise equal; the usual causes of a difference are named in the error.
- **The first training batch of each epoch,** when no DistributedSampler splits the training data (an
  ``IterableDataset``, or ``use_distributed_sampler=False`` with a sampler of the user's): a checksum of every
  tensor in the batch travels with the epoch end's all-reduce. Equal on every rank means the ranks train on the
  same data; that is a one-time warning (rank 0), since a user may mean it.

Not compared: statistics that each rank updates from its own batches in every training forward, by design. The
running statistics of BatchNorm and InstanceNorm layers (``running_mean``, ``running_var``) and the buffers of
quantization observers and fake-quantize modules (quantization-aware training): DDP copies rank 0's buffers to
every rank at the start of the next training forward (``broadcast_buffers``), so they differ at an epoch's end
and the checkpoint holds rank 0's. ``SyncBatchNorm`` computes its statistics from every rank's batch: those are
compared.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn
from torch.ao.quantization import FakeQuantizeBase, ObserverBase
from torch.utils.data import DistributedSampler

from tandem.utilities.exceptions import ReplicasDivergedError
from tandem.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from tandem.strategies.strategy import Strategy

#: statistics each rank updates from its own batches (DDP overwrites them with rank 0's at each training forward)
_RUNNING_STATS = ("running_mean", "running_var")
#: elements of one batch tensor read for its checksum (evenly spaced; more are skipped)
_BATCH_ELEMENTS = 1 << 20
_INTEGER_OF_SIZE = {1: torch.int8, 2: torch.int16}
_NO_BATCH = torch.zeros(3, dtype=torch.int64)  # the batch slot of a rank that did not fingerprint its batch
_SHOWN = 5  # further differing names listed in a message


def checks_replicas(strategy: Strategy) -> bool:
    """Whether ``strategy``'s processes hold replicas that must be identical, and there are several."""
    return strategy.identical_replicas and strategy.world_size > 1


# ---------------------------------------------------------------------- checksums (no processes)
def tensor_checksum(tensor: torch.Tensor, max_elements: int | None = None) -> torch.Tensor:
    """The wrapping integer sum of ``tensor``'s bytes read as 32-bit words (64-bit ones for 8-byte dtypes), a
    0-d integer tensor on its device: equal for bitwise-equal tensors whatever order the reduction runs in (integer
    addition is exact), different after any one-bit change. One pass over the tensor, in its own integer type
    (as fast as a float sum).

    Args:
        tensor: any dtype (floating point, complex, integer or bool).
        max_elements: read only this many evenly spaced elements of a larger tensor (None: all).
    """
    flat = tensor.detach()
    if flat.is_complex():
        flat = torch.view_as_real(flat)
    if max_elements is not None and flat.numel() > max_elements:
        flat = flat.reshape(-1)[:: -(-flat.numel() // max_elements)]
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    size = flat.element_size()
    if size == 4:  # float32, int32: a view of any layout
        return flat.view(torch.int32).sum(dtype=torch.int32)
    if size == 8:
        return flat.view(torch.int64).sum()
    flat = flat.reshape(-1)  # a view, unless it is not contiguous
    if flat.numel() * size % 4:  # an odd number of 2-byte or of 1-byte elements: one by one
        return flat.view(_INTEGER_OF_SIZE[size]).sum(dtype=torch.int32)
    flat = flat.contiguous()
    try:  # four bytes at a time
        return flat.view(torch.int32).sum(dtype=torch.int32)
    except RuntimeError:  # it starts inside a word of its storage: a copy that starts at a word
        return flat.clone().view(torch.int32).sum(dtype=torch.int32)


def replicated_tensors(module: nn.Module) -> list[tuple[str, str, torch.Tensor]]:
    """``(kind, name, tensor)`` of every parameter and buffer that must be identical on every rank, kind being
    "parameter" or "buffer", in the module's order (the same on every rank). Leaves out the statistics that each
    rank updates from its own batches in every training forward (see the module docstring)."""
    local: set[str] = set()
    for prefix, layer in module.named_modules():
        if isinstance(layer, nn.modules.batchnorm._NormBase) and not isinstance(layer, nn.SyncBatchNorm):
            owned: Sequence[str] = _RUNNING_STATS
        elif isinstance(layer, (ObserverBase, FakeQuantizeBase)):
            owned = [name for name, _ in layer.named_buffers(recurse=False)]
        else:
            continue
        local.update(f"{prefix}.{name}" if prefix else name for name in owned)
    found: list[tuple[str, str, torch.Tensor]] = [("parameter", name, p) for name, p in module.named_parameters()]
    found += [("buffer", name, b) for name, b in module.named_buffers() if name not in local]
    return [(kind, name, t) for kind, name, t in found if not t.is_meta]


def module_checksums(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One checksum per tensor (``tensor_checksum``), in one int64 vector on the first tensor's device (no
    tensors: an empty CPU vector)."""
    if not tensors:
        return torch.zeros(0, dtype=torch.int64)
    sums = [tensor_checksum(t) for t in tensors]
    device = sums[0].device
    if any(s.device != device for s in sums):  # a module spread over devices (rare)
        sums = [s.to(device) for s in sums]
    return torch.stack(sums).long()


def batch_fingerprint(batch: Any) -> torch.Tensor:
    """Three int64 numbers for a batch, on the CPU: 1 (fingerprinted), how many elements its tensors hold, and
    their checksums combined by position. A batch with no tensors is not fingerprinted (all zeros)."""
    tensors: list[torch.Tensor] = []
    apply_to_collection(batch, torch.Tensor, tensors.append)
    if not tensors:
        return _NO_BATCH
    sums = torch.stack([tensor_checksum(t, _BATCH_ELEMENTS).cpu().long() for t in tensors])
    sizes = torch.tensor([t.numel() for t in tensors], dtype=torch.int64)
    weights = torch.arange(1, 2 * len(tensors), 2, dtype=torch.int64)  # odd: a tensor's place counts
    return torch.stack([torch.tensor(1), sizes.sum(), (sums * weights + sizes).sum()])


# ---------------------------------------------------------------------- decisions on gathered numbers
def first_divergence(
    names: Sequence[tuple[str, str]], gathered: Sequence[Sequence[int]]
) -> tuple[int, list[int], int] | None:
    """Where the ranks' checksums differ: the index of the first differing tensor, the ranks whose value there
    is not rank 0's, and how many tensors differ in all; None when every rank's checksums are rank 0's."""
    reference = gathered[0]
    differing = [i for i in range(len(names)) if any(row[i] != reference[i] for row in gathered[1:])]
    if not differing:
        return None
    first = differing[0]
    ranks = [rank for rank, row in enumerate(gathered) if row[first] != reference[first]]
    return first, ranks, len(differing)


def diverged_error(
    names: Sequence[tuple[str, str]], divergence: tuple[int, list[int], int], when: str, manual: bool, world: int
) -> ReplicasDivergedError:
    """The error for ``divergence`` (see ``first_divergence``) found ``when`` (e.g. "at the end of epoch 0")."""
    first, ranks, count = divergence
    kind, name = names[first]
    ranks_text = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
    others = [n for _, n in names[first + 1 :]][: max(0, count - 1)]
    more = ""
    if count > 1:
        shown = ", ".join(others[:_SHOWN]) + (", ..." if count - 1 > _SHOWN else "")
        more = f" ({count - 1} more tensor{'s' if count > 2 else ''} differ too: {shown})"
    causes = []
    if manual:
        causes.append(
            "under manual optimization, loss.backward() called instead of self.manual_backward(loss): DDP then "
            "does not average the gradients, and each rank steps with its own"
        )
    if kind == "buffer":
        causes.append(
            f"the buffer {name!r} updated on some ranks only, or from each rank's own batch (DDP copies rank 0's "
            "buffers to every rank at the next training forward, so the other ranks' updates are lost): update it "
            "alike on every rank, or all-reduce the update (torch.distributed.all_reduce, as SyncBatchNorm does)"
        )
    causes.append(
        "a parameter or buffer changed outside the optimizer on some ranks only (code under `if self.global_rank "
        "== 0:`, or driven by each rank's own data or random numbers); change it alike on every rank"
    )
    causes.append(
        "the module trained by each rank on its own outside the Trainer's step (a meta-learning inner loop that "
        "steps a copy of the module and copies it back, an optimizer of your own over gradients only this rank "
        "computed); average what each rank computed (torch.distributed.all_reduce) before it changes the module"
    )
    if not manual:
        causes.append("gradients changed on some ranks only after backward (in on_after_backward or a callback)")
    listed = "; ".join(f"({i}) {cause}" for i, cause in enumerate(causes, start=1))
    return ReplicasDivergedError(
        f"The DDP replicas differ {when}: {kind} {name!r} on {ranks_text} is not what rank 0 holds{more}. Every "
        f"one of the {world} ranks must hold identical parameters and buffers; training on would continue from "
        f"diverged copies, and checkpoints would hold rank 0's alone. Likely causes: {listed}. If the program "
        "cannot keep them equal and rank 0's copy is what you want (Lightning trains on silently and saves rank "
        "0's), pass Trainer(on_replica_divergence='warn')."
    )


def same_data_warning(epoch: int, world: int) -> str:
    return (
        f"Every one of the {world} ranks got the same first training batch in epoch {epoch}: the training data "
        f"is not split between the processes, so each sample is trained on {world} times per epoch. Split it: an "
        "IterableDataset must yield only its rank's share (skip items by torch.distributed.get_rank() and "
        "get_world_size(), and by torch.utils.data.get_worker_info() across DataLoader workers); with a map-style "
        "dataset, let tandem add a DistributedSampler (Trainer(use_distributed_sampler=True), the default) or pass "
        "a DistributedSampler yourself. (Shown once.)"
    )


# ---------------------------------------------------------------------- the checks
def check_replicas(strategy: Strategy, when: str, reaction: str = "raise") -> None:
    """Raise a [`ReplicasDivergedError`][tandem.utilities.exceptions.ReplicasDivergedError] on every rank if the ranks'
    parameters or buffers differ (warn on rank 0 instead with ``reaction="warn"``). Every rank calls this; one
    all-reduce of two numbers a tensor when ``strategy`` holds identical replicas in several processes (and a gather
    when they differ), nothing otherwise.

    Args:
        strategy: the Trainer's.
        when: where the check runs, for the message (e.g. "before saving a checkpoint").
        reaction: the Trainer's ``on_replica_divergence``.
    """
    module = strategy.module
    if module is None or not checks_replicas(strategy):
        return
    named = replicated_tensors(module)
    local = module_checksums([t for _, _, t in named])
    low, high = smallest_and_largest(strategy, local)
    if not torch.equal(low, high):
        _raise_if_diverged(module, named, strategy.all_gather(local).tolist(), when, reaction)


def smallest_and_largest(strategy: Strategy, local: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each element's smallest and largest value over the ranks, for an int64 ``local``: one all-reduce (max) of
    ``local`` and its bitwise complement (``~x`` orders the values backwards, and never overflows as ``-x`` does),
    its size independent of the number of ranks. Every rank calls this."""
    both = strategy.reduce(torch.cat([local, torch.bitwise_not(local)]), "max")
    return torch.bitwise_not(both[local.numel() :]), both[: local.numel()]


def _raise_if_diverged(
    module: nn.Module,
    named: Sequence[tuple[str, str, torch.Tensor]],
    gathered: list[list[int]],
    when: str,
    reaction: str = "raise",
) -> None:
    names = [(kind, name) for kind, name, _ in named]
    divergence = first_divergence(names, gathered)
    if divergence is None:
        return
    manual = not getattr(module, "automatic_optimization", True)
    error = diverged_error(names, divergence, when, manual, len(gathered))
    if reaction != "warn":
        raise error
    rank_zero_warn(f"{error} Training goes on (on_replica_divergence='warn'); checkpoints hold rank 0's values.")


class ReplicaCheck:
    """The fit loop's checks of DDP replicas (see the module docstring): the first batch of an epoch is
    fingerprinted when no DistributedSampler splits the data, and at the epoch's end one all-gather carries the
    parameters' and buffers' checksums and that fingerprint."""

    def __init__(self) -> None:
        self.batch: torch.Tensor | None = None  # this epoch's first batch's fingerprint
        self.same_data_warned = False

    def watch_first_batch(self, strategy: Strategy, sampler: Any, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches`` as they are, after fingerprinting the first one, when the ranks may train on the same data
        (several processes holding identical replicas, and ``sampler`` not a DistributedSampler)."""
        self.batch = None
        if self.same_data_warned or isinstance(sampler, DistributedSampler) or not checks_replicas(strategy):
            return batches
        first = next(batches, _END)
        if first is _END:
            return iter(())
        self.batch = batch_fingerprint(first)
        return itertools.chain((first,), batches)

    def check_epoch_end(self, strategy: Strategy, epoch: int, reaction: str = "raise") -> None:
        """Compare every rank's replica (raising
        [`ReplicasDivergedError`][tandem.utilities.exceptions.ReplicasDivergedError] on every rank if they differ) and
        first batch (warning once if all are equal). Every rank calls this; one all-reduce of two numbers a tensor under
        several processes holding identical replicas (and a gather when they differ), nothing otherwise."""
        module = strategy.module
        if module is None or not checks_replicas(strategy):
            return
        batch, self.batch = (self.batch if self.batch is not None else _NO_BATCH), None
        named = replicated_tensors(module)
        local = module_checksums([t for _, _, t in named])
        low, high = smallest_and_largest(strategy, torch.cat([local, batch.to(local.device)]))
        count = len(named)
        if not self.same_data_warned and low[count] == 1 and torch.equal(low[count:], high[count:]):
            self.same_data_warned = True
            rank_zero_warn(same_data_warning(epoch, strategy.world_size))
        if not torch.equal(low[:count], high[:count]):  # rare: gather the checksums to name the ranks
            gathered = strategy.all_gather(local).tolist()
            _raise_if_diverged(module, named, gathered, f"at the end of epoch {epoch}", reaction)


_END = object()
