"""The base of every strategy that runs one process per device (DDP, FSDP).

What they share lives here: the environment (who started the processes, which rank this is), the
launcher choice, joining the process group, the collectives, sharding the data, evening the
training batch counts (counted ones here; an epoch of unknown length is evened by the loop, a batch at a
time, with [`ParallelStrategy.ranks_with_batch`][tandem.strategies.Strategy.ranks_with_batch]), and gathering
predictions. A subclass adds how the module is wrapped and how gradients are synchronised.

Launch: see ``tandem.strategies.launchers`` (who starts the processes),
``tandem.strategies.environments`` (how a process learns its rank) and ``tandem.strategies.process_group``
(leaving the group tandem created).

Data: see ``tandem.strategies.samplers``. The training loader is sharded with a DistributedSampler
that keeps the user's shuffle / drop_last / custom sampler; evaluation and predict loaders give every
sample to exactly one rank (rank r: samples r, r+N, r+2N, ...), so metrics reduced across ranks as
sums and counts equal single-device results. ``trainer.predict`` returns every sample's prediction,
in dataset order, on every rank.
"""

from __future__ import annotations

import atexit
import datetime
import itertools
from typing import Any

import torch
import torch.distributed as dist
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from tandem.strategies.environments.cluster_environment import ClusterEnvironment
from tandem.strategies.environments.existing_group import ProcessGroupEnvironment
from tandem.strategies.environments.local import LocalEnvironment
from tandem.strategies.environments.machine import threads_per_process
from tandem.strategies.environments.selection import select_environment
from tandem.strategies.launchers.script import ScriptLauncher, processes_started
from tandem.strategies.launchers.spawn import SpawnLauncher
from tandem.strategies.precision import Precision
from tandem.strategies.process_group import _GROUPS_CREATED, joined_external_group, leave_process_group
from tandem.strategies.samplers import (
    FirstItems,
    evaluation_layout,
    interleave_predictions,
    shard_evaluation,
    shard_training,
)
from tandem.strategies.side_channel import (
    CallSite,
    close_channel,
    current_channel,
    new_run_id,
    new_secret,
    open_channel,
)
from tandem.strategies.strategy import ReduceOp, Strategy
from tandem.utilities.compile import Compiler
from tandem.utilities.data import find_sampler, has_len, is_iterable_style, rebuild_dataloader
from tandem.utilities.exceptions import TandemConfigError, bad_choice, incompatible, out_of_range
from tandem.utilities.rank_zero import rank_zero_warn, set_rank
from tandem.utilities.seed import global_seed, reset_seed

START_METHODS = ("popen", "spawn", "fork")
#: start methods whose ranks run in processes started per stage (torch.multiprocessing), not the re-run script
PER_STAGE_START_METHODS = ("spawn", "fork")
_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class ParallelStrategy(Strategy):
    """One process per device, joined in a torch.distributed process group.

    Args:
        devices: this node's devices, one process each (the Trainer's ``devices`` when None).
        precision: see [`Precision`][tandem.strategies.Precision].
        process_group_backend: "gloo" (CPU default), "nccl" (CUDA default), or another torch backend.
        timeout: how long a collective may wait for the other ranks before failing.
        use_distributed_sampler: shard the dataloaders as described in this module; False leaves them
            alone (shard the data yourself). None: the Trainer's ``use_distributed_sampler``.
        start_method: "popen" (re-run the script), "spawn" or "fork" (torch.multiprocessing, per stage; "fork"
            is for notebooks, whose classes a spawned process cannot import).
        collective_check_timeout: tandem's own collectives (set-up, epoch and evaluation ends, checkpoint
            saves, metric reduction; not the per-step gradient sync) are first agreed on through the
            process group's store: ranks entering different ones fail at once with both sides named, and
            a rank that sits this long in another collective (or whose script ended) is reported instead
            of waiting for ``timeout`` (see ``tandem.strategies.side_channel``). None turns the
            check off.
        hang_timeout: when no rank makes progress (its loop's place, its Python stack) for this long during a fit,
            every rank prints its Python stack and rank 0 raises [`HangError`][tandem.utilities.exceptions.HangError]
            with a table of where each rank was (stage, hook, step, batch, the user's line it is blocked in),
            instead of waiting for ``timeout``: a rank that skipped ``backward``, a ``torch.distributed`` call on
            one rank, a data loader blocked on one rank. None turns it off.
        sync_batchnorm: convert BatchNorm layers to SyncBatchNorm, for the subclasses that can. None: the
            Trainer's ``sync_batchnorm``.
        cluster_environment: how this process learns its rank (a
            [`ClusterEnvironment`][tandem.strategies.environments.ClusterEnvironment], e.g.
            ``SLURMEnvironment(auto_requeue=False)``); None: detected from the environment variables (torchrun, then
            SLURM, else tandem's launcher). Also given as ``Trainer(plugins=[...])``.
    """

    max_devices = None

    def __init__(
        self,
        devices: list[torch.device] | None = None,
        precision: str | Precision | None = None,
        process_group_backend: str | None = None,
        timeout: datetime.timedelta = datetime.timedelta(minutes=30),
        use_distributed_sampler: bool | None = None,
        start_method: str = "popen",
        collective_check_timeout: datetime.timedelta | None = datetime.timedelta(seconds=60),
        *,
        hang_timeout: datetime.timedelta | None = datetime.timedelta(minutes=5),
        sync_batchnorm: bool | None = None,
        cluster_environment: ClusterEnvironment | None = None,
    ) -> None:
        super().__init__(
            devices=devices,
            precision=precision,
            use_distributed_sampler=use_distributed_sampler,
            sync_batchnorm=sync_batchnorm,
        )
        if cluster_environment is not None and not isinstance(cluster_environment, ClusterEnvironment):
            raise out_of_range(
                "cluster_environment", cluster_environment, "a tandem.strategies.environments.ClusterEnvironment"
            )
        self.cluster_environment = cluster_environment
        if start_method not in START_METHODS:
            raise bad_choice("start_method", start_method, START_METHODS)
        if not isinstance(timeout, datetime.timedelta):
            raise out_of_range("timeout", timeout, "a datetime.timedelta, e.g. timedelta(minutes=5)")
        if collective_check_timeout is not None and not isinstance(collective_check_timeout, datetime.timedelta):
            raise out_of_range(
                "collective_check_timeout", collective_check_timeout, "a datetime.timedelta, or None for no check"
            )
        if hang_timeout is not None and not (
            isinstance(hang_timeout, datetime.timedelta) and hang_timeout.total_seconds() > 0
        ):
            raise out_of_range("hang_timeout", hang_timeout, "a positive datetime.timedelta, or None for no watch")
        self.collective_check_timeout = collective_check_timeout
        self.hang_timeout = hang_timeout
        self.process_group_backend = process_group_backend
        self.timeout = timeout
        self.start_method = start_method
        self._environment: ClusterEnvironment | None = None

    def _check_configuration(self) -> None:
        super()._check_configuration()
        devices = self.parallel_devices
        assert devices is not None  # _configure sets them before this check
        types = {d.type for d in devices}
        cuda = [d for d in devices if d.type == "cuda"]
        if len(types) > 1 or len(cuda) != len({(d.index or 0) for d in cuda}):
            shown = ", ".join(str(d) for d in devices)
            raise TandemConfigError(
                f"strategy={self.name!r} runs one process per device, but devices=[{shown}] lists a CUDA device "
                "twice or mixes device types: several devices in one process is DataParallel's way. Give each "
                "process its own device (e.g. devices=2 with accelerator='cuda'), or use strategy='dp'."
            )
        device_type = devices[0].type
        if self.process_group_backend is None:
            self.process_group_backend = "nccl" if device_type == "cuda" else "gloo"
        if self.process_group_backend == "nccl" and device_type != "cuda":
            raise TandemConfigError("process_group_backend='nccl' needs CUDA devices; on the CPU use 'gloo'.")
        if isinstance(self.cluster_environment, LocalEnvironment):  # a given one learns the job's shape here
            self.cluster_environment.num_processes = self.num_processes
            self.cluster_environment.num_nodes = self.num_nodes

    # ------------------------------------------------------------------ topology
    @property
    def num_processes(self) -> int:
        """Processes on this node: one per device."""
        return len(self.parallel_devices) if self.parallel_devices else 1

    @property
    def environment(self) -> ClusterEnvironment:
        """How this process learns its rank: the given ``cluster_environment``, else torchrun, SLURM or tandem's
        launcher, as the environment variables say."""
        if self._environment is None:
            return self._select_environment()
        return self._environment

    def _select_environment(self) -> ClusterEnvironment:
        if self.cluster_environment is not None:
            return self.cluster_environment
        if joined_external_group():
            return ProcessGroupEnvironment(self.num_processes)
        return select_environment(self.num_processes, self.num_nodes)

    @property
    def global_rank(self) -> int:
        return self.environment.global_rank

    @property
    def local_rank(self) -> int:
        return self.environment.local_rank

    @property
    def node_rank(self) -> int:
        return self.environment.node_rank

    @property
    def world_size(self) -> int:
        return self.environment.world_size

    @property
    def root_device(self) -> torch.device:
        if not self.parallel_devices:
            return torch.device("cpu")
        return self.parallel_devices[min(self.local_rank, len(self.parallel_devices) - 1)]

    @property
    def launcher(self) -> ScriptLauncher | SpawnLauncher | None:
        environment = self.environment
        if not isinstance(environment, LocalEnvironment) or self.world_size == 1:
            return None  # torchrun / srun started the processes, or there is only one
        if self.start_method in PER_STAGE_START_METHODS:
            return (
                None
                if environment.creates_processes_externally
                else SpawnLauncher(environment, self.num_processes, self.start_method)
            )
        return ScriptLauncher(environment, self.num_processes)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        if self.world_size == 1:
            return None
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    # ------------------------------------------------------------------ set-up
    def setup_environment(self) -> None:
        """Seed again (the ``seed_everything`` seed, as Lightning), find the environment, join the process group (once
        per process), set threads, device and rank."""
        reset_seed()
        self._environment = environment = self._select_environment()
        self._check_environment(environment)
        threads = threads_per_process(self.num_processes)
        if threads is not None:
            torch.set_num_threads(threads)
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
        if not dist.is_initialized():
            environment.export_rendezvous()
            dist.init_process_group(
                self.process_group_backend,
                init_method="env://",
                rank=environment.global_rank,
                world_size=environment.world_size,
                timeout=self.timeout,
            )
            _GROUPS_CREATED.add(id(dist.distributed_c10d._get_default_group()))
            atexit.register(leave_process_group)
            self._open_side_channel()
        elif dist.get_world_size() != environment.world_size:
            raise TandemConfigError(
                f"this process already joined a process group of {dist.get_world_size()} processes, but "
                f"strategy={self.name!r} expects {environment.world_size}. Use the same devices and num_nodes "
                "for every Trainer in a script."
            )
        elif current_channel() is None and joined_external_group():
            self._open_side_channel()  # a group Ray Train or the script created: tandem never destroys it
            atexit.register(close_channel)
        set_rank(self.global_rank)

    def _check_environment(self, environment: ClusterEnvironment) -> None:
        expected = self.num_processes * self.num_nodes
        if isinstance(environment, ProcessGroupEnvironment) and environment.world_size != expected:
            raise TandemConfigError(
                f"this process joined a process group of world size {environment.world_size} before the fit (Ray "
                f"Train, or init_process_group in the script), but the Trainer expects devices × num_nodes = "
                f"{self.num_processes} × {self.num_nodes} = {expected}. Set devices and num_nodes so that their "
                f"product is {environment.world_size} (with Ray Train: devices=<workers per node>, "
                "num_nodes=<nodes>), or start the group with that many processes."
            )
        if environment.world_size != expected:
            raise TandemConfigError(
                f"the {environment.name} environment describes {environment.world_size} processes, but the "
                f"Trainer expects devices × num_nodes = {self.num_processes} × {self.num_nodes} = {expected}. "
                f"{environment.shape_hint}"
            )
        if not isinstance(environment, LocalEnvironment):
            return
        if self.num_nodes > 1 and not environment.rendezvous_given:
            raise TandemConfigError(
                f"num_nodes={self.num_nodes} with tandem's launcher needs MASTER_ADDR, MASTER_PORT and "
                "NODE_RANK set on every node. Set them, or start the job with torchrun or srun."
            )
        started = environment.creates_processes_externally or processes_started()
        if self.world_size > 1 and self.num_processes > 1 and not started:
            raise TandemConfigError(
                f"{type(self).__name__}.setup_environment() ran before the other ranks were started, so it would "
                "wait for them forever. Run the stage through strategy.launcher.launch(function, ...)."
            )

    def setup(self, module: nn.Module, compiler: Compiler | None = None) -> None:
        self._check("setup")  # wrapping the module (DDP, FSDP) starts with collectives: agree on it first
        super().setup(module, compiler)

    def _module_to_device(self, module: nn.Module) -> nn.Module:
        """Move the module, and give this process its own copy of any tensor it shares with another process:
        ddp_spawn receives the caller's module through shared memory, and without a copy every rank would
        step the same parameters."""
        module = super()._module_to_device(module)
        with torch.no_grad():
            for tensor in itertools.chain(module.parameters(), module.buffers()):
                if tensor.device.type == "cpu" and tensor.is_shared():  # CUDA tensors always say shared
                    tensor.data = tensor.data.clone()
        return module

    def teardown(self) -> None:
        """Drop the wrapper. The process group stays: code after ``fit()`` (``trainer.test()``, another
        Trainer) runs on every rank and uses it again; torch cannot re-create it on the same port
        reliably, and a new port would need a new rendezvous."""
        self._model = self._module
        self._compiled = None

    # ------------------------------------------------------------------ collectives
    def _open_side_channel(self) -> None:
        """Give the new process group its side channel (every rank calls this right after joining it; an
        earlier group's channel is closed)."""
        try:
            store = dist.distributed_c10d._get_default_store()
        except (AttributeError, RuntimeError, ValueError):  # a private torch API; a group without a store
            rank_zero_warn(
                "tandem found no store in the existing process group, so the collective check and the hang "
                "watch are off (collective_check_timeout and hang_timeout have no effect)."
            )
            return
        # One run id per group (an earlier group's keys are never read) and the secret that signs every value the
        # channel writes: broadcast over the group's backend, never through the store (anyone may read the store)
        run_id, secret = self._broadcast((new_run_id(), new_secret()), 0)
        channel = open_channel(store, dist.get_rank(), dist.get_world_size(), run_id, secret)
        channel.hang_timeout = self.hang_timeout.total_seconds() if self.hang_timeout is not None else None

    def _check(self, op: str) -> None:
        """Agree with the other ranks that this collective is the one they enter next (the side channel's
        collective check)."""
        channel = current_channel()
        if channel is not None and self.collective_check_timeout is not None:
            channel.collective_check.check(CallSite.here(op, depth=2), self.collective_check_timeout.total_seconds())

    def _to_collective_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.root_device) if self.process_group_backend == "nccl" else tensor

    def _reduce(self, tensor: torch.Tensor | float, reduce_op: ReduceOp) -> torch.Tensor | float:
        if not dist.is_initialized():
            return tensor
        self._check("reduce")
        result = self._to_collective_device(torch.as_tensor(tensor)).clone()
        if reduce_op == "mean" and not result.is_floating_point():
            result = result.float()
        dist.all_reduce(result, op=_REDUCE_OPS[reduce_op])
        if reduce_op == "mean":
            result /= dist.get_world_size()
        return result.to(tensor.device) if isinstance(tensor, torch.Tensor) else result

    def _all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        if not dist.is_initialized():
            return tensor.unsqueeze(0)
        self._check("all_gather")
        local = self._to_collective_device(tensor).contiguous()
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local)
        return torch.stack(parts).to(tensor.device)

    def _broadcast(self, obj: Any, src: int) -> Any:
        if not dist.is_initialized():
            return obj
        self._check("broadcast")
        box = [obj]
        dist.broadcast_object_list(box, src, device=self._to_collective_device(torch.empty(0)).device)
        return box[0]

    def _barrier(self, name: str | None) -> None:
        if not dist.is_initialized():
            return
        self._check(f"barrier {name!r}" if name else "barrier")
        if self.process_group_backend == "nccl":
            dist.barrier(device_ids=[self.root_device.index])
        else:
            dist.barrier()

    def _ranks_with_batch(self, has_batch: bool) -> list[bool]:
        """Not agreed on through the store first (see ``_check``): the loop asks this before every training
        batch of an epoch of unknown length, on every rank at the same batch, so it is per-step hot path. One
        all-reduce of one number (how many ranks have a batch: its size does not grow with the ranks); only when
        some have one and some not (once, at the end of such an epoch) a second one says which."""
        if not dist.is_initialized():
            return [has_batch]
        world = dist.get_world_size()
        count = self._to_collective_device(torch.tensor([int(has_batch)], dtype=torch.int32))
        dist.all_reduce(count, op=dist.ReduceOp.SUM)
        have = int(count.item())
        if have in (0, world):  # the same on every rank: all take the same branch
            return [bool(have)] * world
        flags = torch.zeros(world, dtype=torch.int32)
        flags[dist.get_rank()] = int(has_batch)
        flags = self._to_collective_device(flags)
        dist.all_reduce(flags, op=dist.ReduceOp.SUM)
        return [bool(flag) for flag in flags.tolist()]

    def _reduce_if_agreed(
        self, layout: int, flags: torch.Tensor, sums: torch.Tensor, maxes: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """One checked max all-reduce of the layout, the sizes (each with its bitwise complement: the smallest
        comes back with the largest) and the flags; only when all agree, a sum and a max all-reduce of the values."""
        if not dist.is_initialized():
            return flags, sums, maxes
        self._check("reduce_if_agreed")
        mine = [layout, sums.numel(), maxes.numel()]
        mine += [~n for n in mine]
        first = self._to_collective_device(torch.cat([torch.tensor(mine, dtype=torch.int64), flags.to(torch.int64)]))
        dist.all_reduce(first, op=dist.ReduceOp.MAX)
        first = first.cpu()
        if first[:6].tolist() != mine:  # some rank's layout differs: the same verdict everywhere
            return None
        reduced = []
        for values, op in ((sums, dist.ReduceOp.SUM), (maxes, dist.ReduceOp.MAX)):
            if values.numel():  # the sizes agree: every rank takes the same branch
                values = self._to_collective_device(values.to(torch.float64, copy=True))
                dist.all_reduce(values, op=op)
                values = values.cpu()
            reduced.append(values)
        return first[6:], reduced[0], reduced[1]

    def _all_gather_object(self, obj: Any) -> list[Any]:
        if not dist.is_initialized():
            return [obj]
        self._check("all_gather_object")
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, obj)
        return gathered

    # ------------------------------------------------------------------ data
    def _process_dataloader(self, dataloader: DataLoader, stage: str) -> DataLoader:
        """Shard ``dataloader`` with ``distributed_sampler_kwargs``; even the training batch counts.

        Call after [`setup_environment`][tandem.strategies.ParallelStrategy.setup_environment] on every rank: for "fit"
        it compares batch counts across ranks.
        """
        shardable = isinstance(dataloader, DataLoader) and not is_iterable_style(dataloader)
        shards = self.distributed_sampler_kwargs
        if self.use_distributed_sampler and shardable and shards is not None:
            replicas, rank = shards["num_replicas"], shards["rank"]
            if stage == "fit":  # rank 0's seed: ranks seeded differently must still shard one permutation
                seed = self.broadcast(global_seed())
                dataloader = shard_training(dataloader, replicas, rank, seed, self.data_order)
            else:  # a shuffling loader is sharded in an order of rank 0's seed (Lightning's evaluation sampler)
                seed = self.broadcast(global_seed()) if _shuffles(dataloader) else 0
                dataloader = shard_evaluation(dataloader, replicas, rank, seed)
        elif shards is None:  # one process: the order several would share, as on a single device
            dataloader = super()._process_dataloader(dataloader, stage)
        if stage == "fit" and shards is not None:
            dataloader = self._even_batches(dataloader, shardable)
        return dataloader

    def _even_batches(self, loader: DataLoader, rebuildable: bool) -> DataLoader:
        """Ranks with different training batch counts would wait for each other: keep the smallest count.
        Loaders of unknown length on every rank are evened by the loop as it trains."""
        local = torch.tensor(len(loader) if has_len(loader) else -1)
        counts = [int(c) for c in self.all_gather(local).tolist()]
        fewest = min(counts)
        if fewest == max(counts) or max(counts) < 0:
            return loader
        if fewest < 0 or not rebuildable:
            shown = [c if c >= 0 else "unknown" for c in counts]
            raise incompatible(
                f"The training loaders of the ranks have these lengths (batches per epoch): {shown}",
                "tandem can even them only when every rank's length is known and its DataLoader can be rebuilt, "
                "or when no rank's length is known (then each epoch ends at the first batch a rank lacks)",
                "Give every rank the same kind of loader with the same number of batches, or leave __len__ out "
                "of all of them.",
            )
        rank_zero_warn(
            f"The ranks have different numbers of training batches per epoch ({counts}); each rank trains on "
            f"its first {fewest}, dropping {sum(counts) - fewest * len(counts)} batches in all. Give every "
            "rank the same number of batches (e.g. use_distributed_sampler=True) to train on all of them."
        )
        if loader.batch_sampler is not None:
            return rebuild_dataloader(loader, batch_sampler=FirstItems(loader.batch_sampler, fewest))
        return rebuild_dataloader(loader, sampler=FirstItems(loader.sampler, fewest))

    def gather_predictions(self, predictions: list[Any], dataloader: DataLoader) -> list[Any]:
        """Every rank's predict outputs, in dataset order, batched as one process would have: on every rank.

        Outputs are moved to the CPU. Without tandem's evaluation sampler (``use_distributed_sampler=False``)
        each rank keeps its own predictions.
        """
        layout = evaluation_layout(dataloader)
        if not dist.is_initialized() or layout is None:
            return predictions
        local = apply_to_collection(predictions, torch.Tensor, lambda t: t.detach().cpu())
        return interleave_predictions(self.all_gather_object(local), layout)


def _shuffles(loader: DataLoader) -> bool:
    """The loader draws a RandomSampler's order (``shuffle=True``)."""
    return type(loader.batch_sampler) is BatchSampler and type(find_sampler(loader)) is RandomSampler
