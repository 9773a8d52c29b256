"""DistributedDataParallel: one process per device, gradients all-reduced in backward.

Launch: see :mod:`tandem.strategies.launchers` (who starts the processes) and
:mod:`tandem.strategies.environments` (how a process learns its rank).

Data: see :mod:`tandem.strategies.samplers`. The training loader is sharded with a DistributedSampler
that keeps the user's shuffle / drop_last / custom sampler; evaluation and predict loaders give every
sample to exactly one rank (rank r: samples r, r+N, r+2N, ...), so metrics reduced across ranks as
sums and counts equal single-device results. ``trainer.predict`` returns every sample's prediction,
in dataset order, on every rank.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import gc
import itertools
import re
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel.distributed import _find_tensors
from torch.utils.data import DataLoader

from tandem.strategies import launchers
from tandem.strategies.environments import (
    ClusterEnvironment,
    LocalEnvironment,
    global_seed,
    select_environment,
    threads_per_process,
)
from tandem.strategies.precision import Precision
from tandem.strategies.registry import register_strategy
from tandem.strategies.samplers import (
    FirstItems,
    evaluation_layout,
    interleave_predictions,
    shard_evaluation,
    shard_training,
)
from tandem.strategies.strategy import ReduceOp, StepForward, Strategy
from tandem.utilities.data import has_len, is_iterable_style, rebuild_dataloader
from tandem.utilities.exceptions import TandemConfigError, bad_choice, out_of_range
from tandem.utilities.rank_zero import rank_zero_warn, set_rank

START_METHODS = ("popen", "spawn")
STAGES = ("fit", "validate", "test", "predict")
_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


class DDPStrategy(Strategy):
    """One process per device; torch's DistributedDataParallel all-reduces gradients in backward.

    ``strategy="ddp"`` starts the other ranks by re-running your script (this process becomes rank 0),
    unless torchrun or SLURM's srun already started them. Everything in the script runs on every rank,
    code after ``trainer.fit()`` included. ``strategy="ddp_spawn"`` spawns the ranks for the fit only and
    brings rank 0's weights, metrics and checkpoint paths back, for code that cannot be re-run.

    Args:
        devices: this node's devices, one process each (the Trainer's ``devices`` when None).
        precision: see :class:`~tandem.strategies.precision.Precision`.
        process_group_backend: "gloo" (CPU default), "nccl" (CUDA default), or another torch backend.
        timeout: how long a collective may wait for the other ranks before failing.
        find_unused_parameters: let DDP handle parameters that get no gradient in a step (slower).
        static_graph: tell DDP the set of used parameters never changes (faster, allows some reentrancy).
        gradient_as_bucket_view: gradients are views into DDP's buckets (saves memory).
        bucket_cap_mb: DDP's gradient bucket size; None keeps torch's default (25 MB).
        ddp_comm_hook: a DDP communication hook, e.g.
            ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook``.
        ddp_comm_state: the state passed to ``ddp_comm_hook`` (None: the default process group).
        sync_batchnorm: convert BatchNorm layers to SyncBatchNorm (CUDA only).
        use_distributed_sampler: replace the samplers of the dataloaders as described in this module;
            False leaves them alone (shard the data yourself).
        start_method: "popen" (re-run the script) or "spawn" (torch.multiprocessing).

    Example::

        trainer = Trainer(strategy=DDPStrategy(find_unused_parameters=True), accelerator="cpu", devices=2)
        trainer.fit(model)  # rank 0 runs this line; it starts rank 1 by re-running the script
    """

    name = "ddp"
    max_devices = None

    def __init__(
        self,
        devices: list[torch.device] | None = None,
        precision: str | Precision | None = None,
        process_group_backend: str | None = None,
        timeout: datetime.timedelta = datetime.timedelta(minutes=30),
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        gradient_as_bucket_view: bool = False,
        bucket_cap_mb: float | None = None,
        ddp_comm_hook: Callable[..., Any] | None = None,
        ddp_comm_state: Any = None,
        sync_batchnorm: bool = False,
        use_distributed_sampler: bool = True,
        start_method: str = "popen",
    ) -> None:
        super().__init__(devices=devices, precision=precision)
        if start_method not in START_METHODS:
            raise bad_choice("start_method", start_method, START_METHODS)
        if not isinstance(timeout, datetime.timedelta):
            raise out_of_range("timeout", timeout, "a datetime.timedelta, e.g. timedelta(minutes=5)")
        if bucket_cap_mb is not None and not bucket_cap_mb > 0:
            raise out_of_range("bucket_cap_mb", bucket_cap_mb, "a positive number of MB, or None")
        self.process_group_backend = process_group_backend
        self.timeout = timeout
        self.ddp_kwargs: dict[str, Any] = {
            "find_unused_parameters": find_unused_parameters,
            "static_graph": static_graph,
            "gradient_as_bucket_view": gradient_as_bucket_view,
        }
        if bucket_cap_mb is not None:
            self.ddp_kwargs["bucket_cap_mb"] = bucket_cap_mb
        self.ddp_comm_hook = ddp_comm_hook
        self.ddp_comm_state = ddp_comm_state
        self.sync_batchnorm = sync_batchnorm
        self.use_distributed_sampler = use_distributed_sampler
        self.start_method = start_method
        self._environment: ClusterEnvironment | None = None
        self._manual = False  # the module uses manual optimization (set when the module is wrapped)

    def configure(self, devices: list[torch.device], num_nodes: int, precision: str | Precision) -> None:
        super().configure(devices, num_nodes, precision)
        device_type = self.parallel_devices[0].type
        if self.process_group_backend is None:
            self.process_group_backend = "nccl" if device_type == "cuda" else "gloo"
        if self.process_group_backend == "nccl" and device_type != "cuda":
            raise TandemConfigError("process_group_backend='nccl' needs CUDA devices; on the CPU use 'gloo'.")
        self._check_sync_batchnorm()

    def _check_sync_batchnorm(self) -> None:
        if self.sync_batchnorm and self.parallel_devices[0].type != "cuda":
            raise TandemConfigError(
                "sync_batchnorm=True needs CUDA devices (torch's SyncBatchNorm does not run on the CPU); "
                "set sync_batchnorm=False on the CPU."
            )

    # ------------------------------------------------------------------ topology
    @property
    def num_processes(self) -> int:
        """Processes on this node: one per device."""
        return len(self.parallel_devices) if self.parallel_devices else 1

    @property
    def environment(self) -> ClusterEnvironment:
        """How this process learned its rank (torchrun, SLURM, or tandem's launcher)."""
        if self._environment is None:
            return select_environment(self.num_processes, self.num_nodes)
        return self._environment

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
    def launcher(self) -> launchers.ScriptLauncher | launchers.SpawnLauncher | None:
        environment = self.environment
        if not isinstance(environment, LocalEnvironment) or self.world_size == 1:
            return None  # torchrun / srun started the processes, or there is only one
        if self.start_method == "spawn":
            return (
                None
                if environment.creates_processes_externally
                else launchers.SpawnLauncher(environment, self.num_processes)
            )
        return launchers.ScriptLauncher(environment, self.num_processes)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    # ------------------------------------------------------------------ set-up
    def setup_environment(self) -> None:
        """Find the environment, join the process group (once per process), set threads, device and rank."""
        self._environment = environment = select_environment(self.num_processes, self.num_nodes)
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
            atexit.register(_destroy_process_group)
        elif dist.get_world_size() != environment.world_size:
            raise TandemConfigError(
                f"this process already joined a process group of {dist.get_world_size()} processes, but "
                f"strategy='ddp' expects {environment.world_size}. Use the same devices and num_nodes for "
                "every Trainer in a script."
            )
        set_rank(self.global_rank)

    def _check_environment(self, environment: ClusterEnvironment) -> None:
        expected = self.num_processes * self.num_nodes
        if environment.world_size != expected:
            raise TandemConfigError(
                f"the {environment.name} environment describes {environment.world_size} processes, but the "
                f"Trainer expects devices × num_nodes = {self.num_processes} × {self.num_nodes} = {expected}. "
                "Set devices to the processes per node (torchrun --nproc-per-node, srun --ntasks-per-node) "
                "and num_nodes to the number of nodes."
            )
        if not isinstance(environment, LocalEnvironment):
            return
        if self.num_nodes > 1 and not environment.rendezvous_given:
            raise TandemConfigError(
                f"num_nodes={self.num_nodes} with tandem's launcher needs MASTER_ADDR, MASTER_PORT and "
                "NODE_RANK set on every node. Set them, or start the job with torchrun or srun."
            )
        started = environment.creates_processes_externally or launchers.processes_started()
        if self.world_size > 1 and self.num_processes > 1 and not started:
            raise TandemConfigError(
                "DDPStrategy.setup_environment() ran before the other ranks were started, so it would wait "
                "for them forever. Run the stage through strategy.launcher.launch(function, ...)."
            )

    def module_to_device(self, module: nn.Module) -> nn.Module:
        """Move the module, and give this process its own copy of any tensor it shares with another process:
        ddp_spawn receives the caller's module through shared memory, and without a copy every rank would
        step the same parameters."""
        module = super().module_to_device(module)
        with torch.no_grad():
            for tensor in itertools.chain(module.parameters(), module.buffers()):
                if tensor.device.type == "cpu" and tensor.is_shared():  # CUDA tensors always say shared
                    tensor.data = tensor.data.clone()
        return module

    def wrap_module(self, module: nn.Module) -> nn.Module:
        if self.sync_batchnorm:
            self._check_sync_batchnorm()  # Trainer(sync_batchnorm=True) sets it after configure()
            module = nn.SyncBatchNorm.convert_sync_batchnorm(module)
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        step_forward = StepForward(module)
        model = DistributedDataParallel(step_forward, device_ids=device_ids, **self.ddp_kwargs)
        if self.ddp_comm_hook is not None:
            model.register_comm_hook(state=self.ddp_comm_state, hook=self.ddp_comm_hook)
        self._manual = not getattr(module, "automatic_optimization", True)
        if self._manual:  # the module calls backward inside its training_step: DDP must not prepare after it
            step_forward.register_forward_hook(_no_reduction_after_step(weakref.ref(model)))
        return model

    def teardown(self) -> None:
        """Drop the DDP wrapper. The process group stays: code after ``fit()`` (``trainer.test()``,
        another Trainer) runs on every rank and uses it again; torch cannot re-create it on the same
        port reliably, and a new port would need a new rendezvous."""
        self._model = self._module

    # ------------------------------------------------------------------ steps
    def run_step(self, method: str, *args: Any) -> Any:
        """Training steps run through DDP; evaluation steps call the module directly (ranks may have
        different numbers of evaluation batches, and DDP's forward is a collective)."""
        if method != "training_step" or not isinstance(self._model, DistributedDataParallel):
            with self.precision.forward_context():
                return getattr(self._module, method)(*args)
        if self._manual:  # reset after the previous step (see _no_reduction_after_step)
            self._model.require_backward_grad_sync = self._model.require_forward_param_sync = True
        try:
            return super().run_step(method, *args)
        except RuntimeError as err:
            explained = self._explain(err)
            if explained is err:
                raise
            raise explained from err

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        model = self._model
        if self._manual and isinstance(model, DistributedDataParallel):
            _prepare_for_backward(model, loss)  # each manual_backward is one gradient all-reduce
        try:
            super().backward(loss, *args, **kwargs)
        except RuntimeError as err:
            explained = self._explain(err)
            if explained is err:
                raise
            raise explained from err

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool) -> Iterator[None]:
        model = module if isinstance(module, DistributedDataParallel) else self._model
        if enabled and isinstance(model, DistributedDataParallel):
            with model.no_sync():
                yield
        else:
            yield

    def _explain(self, err: RuntimeError) -> RuntimeError:
        """DDP's "Expected to have finished reduction" error, told with the unused parameters' names."""
        text = str(err)
        if "Expected to have finished reduction" not in text:
            return err
        names = [n for n, p in self._module.named_parameters() if p.requires_grad]
        match = re.search(r"did not receive grad for rank \d+: ([\d ]+)", text)
        unused = [names[int(i)] for i in match.group(1).split() if int(i) < len(names)] if match else []
        which = ", ".join(unused) if unused else "(torch did not say which)"
        manual = (
            " Under manual optimization each manual_backward counts: with toggle_optimizer (a GAN), the other "
            "networks' parameters get no gradient in each backward."
            if self._manual
            else ""
        )
        return RuntimeError(
            f"DDP found parameters that received no gradient in the last training step: {which}. Every "
            f"parameter must take part in the loss on every rank, or DDP waits for its gradient.{manual} Use "
            "DDPStrategy(find_unused_parameters=True) (strategy='ddp_find_unused_parameters_true'), or remove or "
            "freeze (requires_grad=False) those parameters."
        )

    # ------------------------------------------------------------------ collectives
    def _to_collective_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.root_device) if self.process_group_backend == "nccl" else tensor

    def reduce(self, tensor: torch.Tensor, reduce_op: ReduceOp = "mean") -> torch.Tensor:
        if reduce_op not in _REDUCE_OPS:
            raise bad_choice("reduce_op", reduce_op, tuple(_REDUCE_OPS))
        if not dist.is_initialized():
            return tensor
        result = self._to_collective_device(torch.as_tensor(tensor)).clone()
        if reduce_op == "mean" and not result.is_floating_point():
            result = result.float()
        dist.all_reduce(result, op=_REDUCE_OPS[reduce_op])
        if reduce_op == "mean":
            result /= dist.get_world_size()
        return result.to(tensor.device) if isinstance(tensor, torch.Tensor) else result

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack ``tensor`` from every rank along a new dim 0 (the same shape on every rank)."""
        if not dist.is_initialized():
            return tensor.unsqueeze(0)
        local = self._to_collective_device(tensor).contiguous()
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local)
        return torch.stack(parts).to(tensor.device)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if not dist.is_initialized():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src, device=self._to_collective_device(torch.empty(0)).device)
        return box[0]

    def barrier(self, name: str | None = None) -> None:
        if not dist.is_initialized():
            return
        if self.process_group_backend == "nccl":
            dist.barrier(device_ids=[self.root_device.index])
        else:
            dist.barrier()

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        votes = int(self.reduce(torch.tensor(int(bool(decision))), "sum").item())
        return votes == self.world_size if all else votes > 0

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not dist.is_initialized():
            return [obj]
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, obj)
        return gathered

    # ------------------------------------------------------------------ data
    def process_dataloader(self, dataloader: DataLoader, stage: str) -> DataLoader:
        """Shard ``dataloader`` across ranks. ``stage`` is "fit" for the training loader, "validate",
        "test" or "predict" for evaluation loaders (including validation during fit).

        Call after :meth:`setup_environment` on every rank: for "fit" it compares batch counts across ranks.
        """
        if stage not in STAGES:
            raise bad_choice("stage", stage, STAGES)
        shardable = isinstance(dataloader, DataLoader) and not is_iterable_style(dataloader)
        if self.use_distributed_sampler and shardable and self.world_size > 1:
            if stage == "fit":  # rank 0's seed: ranks seeded differently must still shard one permutation
                seed = self.broadcast(global_seed())
                dataloader = shard_training(dataloader, self.world_size, self.global_rank, seed)
            else:
                dataloader = shard_evaluation(dataloader, self.world_size, self.global_rank)
        if stage == "fit" and shardable:
            dataloader = self._even_batches(dataloader)
        return dataloader

    def _even_batches(self, loader: DataLoader) -> DataLoader:
        """Ranks with different training batch counts would wait for each other: keep the smallest count."""
        local = torch.tensor(len(loader) if has_len(loader) else -1)
        counts = [int(c) for c in self.all_gather(local).tolist()]
        fewest = min(counts)
        if fewest < 0 or fewest == max(counts):
            return loader
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


def _no_reduction_after_step(model_ref: Callable[[], DistributedDataParallel | None]) -> Callable[..., None]:
    """A forward hook for manual optimization (as Lightning does it): the backward passes already ran inside
    ``training_step``, so DDP must not prepare for another one when the step returns (the next step would
    fail with "Expected to have finished reduction in the prior iteration")."""

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        model = model_ref()
        if model is not None and torch.is_grad_enabled():
            model.require_backward_grad_sync = False

    return hook


def _prepare_for_backward(model: DistributedDataParallel, loss: torch.Tensor) -> None:
    """Get DDP's reducer ready for one backward of ``loss`` (manual optimization: several per step)."""
    if not (torch.is_grad_enabled() and model.require_backward_grad_sync):
        return
    model.require_forward_param_sync = True
    unused_search = model.find_unused_parameters and not model.static_graph
    model.reducer._rebuild_buckets()
    model.reducer.prepare_for_backward(list(_find_tensors(loss)) if unused_search else [])


def _destroy_process_group() -> None:
    """At exit, while the interpreter is still whole, free the process group that setup_environment joined.

    DistributedDataParallel wrappers sit in reference cycles that hold the group; if they are only freed
    while the interpreter shuts down, a gloo worker thread may need the GIL then, and the process aborts
    ("terminate called without an active exception", SIGABRT) after the script succeeded.
    """
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


register_strategy("ddp", DDPStrategy, "one process per device; re-runs the script (or joins torchrun / srun)")
register_strategy("ddp_spawn", DDPStrategy, "one process per device, spawned per stage", start_method="spawn")
register_strategy(
    "ddp_find_unused_parameters_true",
    DDPStrategy,
    "ddp for modules whose steps leave some parameters without a gradient (e.g. GANs with toggle_optimizer)",
    find_unused_parameters=True,
)
