"""One replica group among the others of a fault-tolerant job (``strategy="ddp_ft"``), on torchft's ``Manager``.

torchft (PyTorch's per-step fault tolerance) lets replica groups leave and join at step boundaries: a lighthouse holds
the quorum, the groups in it all-reduce their gradients over a fault-tolerant process group, and a step counts only
when every group of the quorum commits it. `ReplicaGroups` drives one group's ``Manager`` for tandem, at four
points:

- **joining** (`join`, as every fit starts, after a checkpoint's restore): the first quorum. A group that starts
  late, or again after its process was killed, takes a healthy group's live state there: the whole checkpoint
  (weights, optimizers, schedulers, the loop's place in the epoch, the epoch's logged sums, callbacks, RNG states),
  so its steps, logs and checkpoints continue the run's.
- **the quorum, where a step's batch is loaded** (`begin_step`, asked by the step's
  `Share`): which groups take part and this group's place among them decide
  the step's data.
- **the commit, before the optimizer steps** (`commit`): False when a group left during the step; the loop then
  runs the step again with its batch loaded again under the next quorum (`batch_again`).
- **values logged with** ``sync_dist=True`` are reduced over the quorum (`all_reduce`) once the group trains:
  every group of a quorum reaches the same logging steps, validations and epoch ends between two quorums. Before its
  first step (the sanity check, a joining group's set-up) a group reduces within itself.

A membership change is not a fault here: a group that leaves makes the others' step fail to commit (it runs again,
with the group gone from the quorum), never a tandem error, and tandem's own collective check and hang watch stay
within each group (where a dead rank is a real fault: the group stops, and its restart joins again).

torchft's ``Manager`` is driven directly rather than through its optimizer wrapper, whose ``zero_grad`` starts the next
quorum: tandem zeroes the gradients right after a step, before the step's logging and its epoch's end, which the
groups of the next quorum would then not share. A group that falls behind mid-run (the others committed a step it did
not) ends with `ReplicaGroupBehindError`: its restart joins with their state.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from lightning_utilities.core.apply_func import apply_to_collection

from tandem.strategies.step_shares import Quorum
from tandem.utilities.exceptions import ReplicaGroupBehindError, TandemConfigError

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from tandem.strategies.step_shares import StepShares

#: how the extra is installed (the error of a run without it names it)
INSTALL = "pip install 'tandem[ft]'"


def require_torchft(what: str) -> None:
    """Raise the install error unless torchft can be imported."""
    try:
        import torchft  # noqa: F401
    except ImportError as err:
        raise TandemConfigError(
            f"{what} runs on torchft (PyTorch's per-step fault tolerance), which is not installed here ({err}). "
            f"Install it with {INSTALL} (or pip install torchft; it needs torch>=2.7), or use strategy='ddp', "
            "which restarts the whole job from its last checkpoint instead."
        ) from err


@dataclass(frozen=True)
class LiveState:
    """What the Trainer gives its replica groups as a fit starts: ``snapshot`` builds the fit's whole state (a
    checkpoint, in memory) for a group that joins; ``restore`` puts a peer's into this fit; ``step`` is the fit's
    ``global_step`` (the groups count the same steps)."""

    snapshot: Callable[[], dict[str, Any]]
    restore: Callable[[dict[str, Any]], None]
    step: int


@dataclass(frozen=True)
class FaultToleranceOptions:
    """How this group reaches the others (see `DDPFTStrategy`'s arguments)."""

    lighthouse: str
    group_id: int
    num_groups: int
    min_replicas: int
    step_timeout: datetime.timedelta
    quorum_timeout: datetime.timedelta
    connect_timeout: datetime.timedelta
    max_retries: int | None


class ReplicaGroups:
    """This replica group's torchft ``Manager`` and the state of the step it trains (see the module's docstring)."""

    def __init__(self) -> None:
        self.options: FaultToleranceOptions | None = None
        self.manager: Any = None  # torchft.Manager, once connected
        self.crossing = False  # logged values are reduced over the quorum (the group trains)
        self.shares: StepShares | None = None  # the training loader's batch sampler (set by the strategy)
        self.loader: DataLoader | None = None  # the training loader the shares are loaded from
        self._state: LiveState | None = None
        self._open = False  # a quorum was formed for the coming step, which has not been committed yet
        self._joining = False
        self._first = True  # this group is the first of the step's quorum (before any quorum: itself alone)

    @property
    def connected(self) -> bool:
        return self.manager is not None

    def connect(self, options: FaultToleranceOptions, store: tuple[str, int], rank: int, processes: int) -> None:
        """Start this process's torchft ``Manager`` (rank 0's serves the group's recovery and talks to the lighthouse)
        on the group's own store ``(address, port)``."""
        from torchft import Manager, ProcessGroupGloo

        self.options = options
        # the peer's live state arrives as plain data, read weights-only as every checkpoint (never unpickled)
        transport = _weights_only_transport()(timeout=options.step_timeout, num_chunks=0)
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=options.step_timeout),
            load_state_dict=None,
            state_dict=None,
            min_replica_size=options.min_replicas,
            use_async_quorum=False,  # the quorum (and a recovery) before the step's batch is loaded
            timeout=options.step_timeout,
            quorum_timeout=options.quorum_timeout,
            connect_timeout=options.connect_timeout,
            rank=rank,
            world_size=processes,
            store_addr=store[0],
            store_port=store[1],
            lighthouse_addr=options.lighthouse,
            replica_id=f"tandem_group_{options.group_id}",
            max_retries=options.max_retries,
            checkpoint_transport=transport,
        )
        self.manager.register_state_dict_fn("tandem", self._load, self._save)

    def disconnect(self) -> None:
        """Leave the job (the lighthouse stops counting this group once its beats stop)."""
        manager, self.manager = self.manager, None
        self._open = self.crossing = False
        if manager is not None:
            manager.shutdown(wait=False)

    # ------------------------------------------------------------------ the steps
    def join(self, state: LiveState) -> None:
        """Form the fit's first quorum; a group behind the others (a late start, a restart) takes their state here."""
        manager = self.manager
        self._state = state
        manager.load_state_dict({"step": state.step, "batches_committed": manager.batches_committed()})
        self._joining = True
        try:
            manager.start_quorum()
        finally:
            self._joining = False
        self._open, self.crossing = True, False
        self._first = manager.participating_rank() == 0

    def begin_step(self) -> Quorum:
        """This group's place in the coming step's quorum (rank among the groups taking part, how many), forming the
        quorum unless the step has one."""
        manager = self.manager
        if not self._open:
            manager.start_quorum()  # a mid-run recovery ends this group (see _load)
            self._open = True
        self.crossing = True
        rank = manager.participating_rank()
        self._first = rank == 0
        return (rank or 0), max(1, manager.num_participants())

    def commit(self) -> bool:
        """After the step's backward: whether it counts (its all-reduce with the quorum's groups went through, in every
        process of this group); then the optimizer steps. torchft decides it for each group."""
        self._open = False
        return bool(self.manager.should_commit())

    @property
    def weight(self) -> float:
        """The weight of this rank's mean gradient in the step's average (its share's items, see
        `share_of`)."""
        latest = self.shares.latest if self.shares is not None else None
        return latest.weight if latest is not None else 1.0

    @property
    def participants(self) -> int:
        """How many groups take part in the current step (0 before the first quorum)."""
        return int(self.manager.num_participants()) if self.manager is not None else 0

    @property
    def first_in_quorum(self) -> bool:
        """This group is the first of the current quorum: it writes the run's checkpoints."""
        return self._first

    def batch_again(self) -> Any:
        """The batch of the step that was not committed, loaded again: the same items of the epoch, shared by the
        groups of the next quorum (formed here)."""
        assert self.shares is not None and self.shares.latest is not None and self.loader is not None
        indices = self.shares.latest.decide()
        dataset = self.loader.dataset
        getitems = getattr(dataset, "__getitems__", None)
        samples = getitems(indices) if getitems else [dataset[i] for i in indices]
        return self.loader.collate_fn(samples)

    # ------------------------------------------------------------------ reductions over the quorum
    def all_reduce(self, tensor: torch.Tensor, op: str) -> bool:
        """Reduce ``tensor`` in place over the quorum's groups (``op``: "sum" or "max"); False when a group left
        during it (``tensor`` is then not to be used)."""
        from torch.distributed import ReduceOp

        manager = self.manager
        if manager.errored() is not None:
            return False
        manager.allreduce(tensor, reduce_op=ReduceOp.SUM if op == "sum" else ReduceOp.MAX).wait()
        return manager.errored() is None

    # ------------------------------------------------------------------ recovery (torchft's calls)
    def _save(self) -> dict[str, Any]:
        """This group's live state for a group that joins (called by torchft while this group waits in the quorum:
        the loop stands at a step boundary). Copied, so that the step this group trains meanwhile does not change it
        under the transfer."""
        assert self._state is not None, "no fit has joined yet"
        return apply_to_collection(self._state.snapshot(), torch.Tensor, lambda t: t.detach().clone())

    def _load(self, state: dict[str, Any]) -> None:
        """A peer's live state: restored as the fit starts; mid-run this group is behind the others and ends."""
        if not self._joining or self._state is None:
            raise ReplicaGroupBehindError(
                f"Replica group {self.options.group_id if self.options else '?'} fell behind the others (they committed "
                f"a step it did not, at step {self.manager.current_step()}). It ends here; started again (the "
                "run-it-here command and torchrun --max-restarts do), it joins them with their state."
            )
        self._state.restore(state)


def _weights_only_transport() -> type:
    """torchft's HTTP checkpoint transport, reading what it receives with ``weights_only=True`` (torchft's own unpickles
    it, for states that are not plain data; tandem's live state is, as its checkpoint files are)."""
    import urllib.request

    from torch.distributed._serialization import _streaming_load
    from torchft.checkpointing import HTTPTransport

    class WeightsOnlyHTTPTransport(HTTPTransport):
        @classmethod
        def _load_from_address(cls, address: str, timeout: datetime.timedelta) -> object:
            with urllib.request.urlopen(address, timeout=timeout.total_seconds()) as f:
                return _streaming_load(f, weights_only=True)

    return WeightsOnlyHTTPTransport


def all_reduce_gradients(groups: ReplicaGroups, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's communication hook under ``ddp_ft``: the bucket's mean gradient, weighted by this rank's share of the
    step, averaged over the group's processes and then over the quorum's groups (torchft's fault-tolerant
    all-reduce: a group that left makes it fail quietly, and the step is not committed)."""
    buffer = bucket.buffer()
    weight = groups.weight
    if weight != 1.0:
        buffer.mul_(weight)
    processes = dist.get_world_size()
    if processes > 1:
        dist.all_reduce(buffer)
        buffer.div_(processes)
    groups.manager.allreduce(buffer).wait()
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(buffer)
    return done


# torch checks a communication hook's annotations as objects (this module's are strings, see the __future__ import)
all_reduce_gradients.__annotations__ = {
    "groups": ReplicaGroups,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
