"""The Strategy base: where the module lives, how batches get there, and how processes talk.

A strategy with one process uses the defaults here unchanged: its collectives return their input and
its barrier passes. Distributed strategies (``tandem.strategies.parallel``) override only the
private hooks of what differs; the public methods check their arguments first, so every strategy
accepts and refuses the same inputs.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, overload

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from tandem.strategies.checkpoint_io import AsyncCheckpointIO
from tandem.strategies.environments.cluster_environment import ClusterEnvironment
from tandem.strategies.precision import Precision, for_device
from tandem.strategies.samplers import DATA_ORDERS, ordered_training
from tandem.strategies.steps import CompiledSteps, _start_graphs_at_the_steps
from tandem.utilities.checkpoint import atomic_save, is_sharded_checkpoint, load_checkpoint_file
from tandem.utilities.cloud_io import remove_file
from tandem.utilities.compile import Compiler
from tandem.utilities.data import end_workers_with_process, seed_workers
from tandem.utilities.exceptions import (
    CheckpointError,
    TandemConfigError,
    TandemUserCodeError,
    bad_choice,
    incompatible,
    out_of_range,
)
from tandem.utilities.rank_zero import set_rank
from tandem.utilities.seed import order_seed

if TYPE_CHECKING:
    from tandem.strategies.launchers.launcher import Launcher
    from tandem.strategies.replica_groups import ReplicaGroups

_NO_CONTEXT = contextlib.nullcontext()
_T = TypeVar("_T")
ReduceOp = str  # "mean" | "sum" | "max" | "min"
REDUCE_OPS = ("mean", "sum", "max", "min")
STAGES = ("fit", "validate", "test", "predict")
CLIP_ALGORITHMS = ("norm", "value")


class Strategy:
    """Base class of every strategy.

    Args:
        devices: the devices this process may use (one for most strategies, several for
            DataParallel). ``None`` lets the Trainer choose from its ``accelerator`` and ``devices``.
        precision: a precision name (see [`Precision`][tandem.strategies.Precision]) or instance.
            ``None`` means "32-true" until a Trainer gives its own ``precision``.
        use_distributed_sampler: whether [`process_dataloader`][tandem.strategies.Strategy.process_dataloader] may
            replace samplers to shard the data. ``None`` (not given) takes the Trainer's ``use_distributed_sampler``
            (True by default).
        sync_batchnorm: turn BatchNorm layers into SyncBatchNorm (strategies with one process ignore it).
            ``None`` (not given) takes the Trainer's ``sync_batchnorm`` (False by default).

    A strategy is complete when constructed: its precision, devices (when given) and options are set, and
    ``resolve_strategy`` only fills in, from the Trainer's arguments, what
    the instance left open (``None``); a Trainer argument that is not its default yet disagrees with the
    instance is an error. Nothing is set on a strategy after that one phase. Subclasses set ``name``
    and override the private hooks (``_reduce``, ``_process_dataloader``, ...) and the properties below;
    the public methods validate their arguments first. Capabilities are data:
    ``distributed_sampler_kwargs`` says whether the data must be sharded, ``launcher`` whether other
    processes must be started.

    Example:
        ```python
        trainer = Trainer(strategy=SingleDeviceStrategy(device="cpu"), max_epochs=1)
        ```
    """

    name: ClassVar[str] = ""
    #: accelerators this strategy runs on; the first error names the fix
    supported_accelerators: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    #: most devices this strategy can use on one node (None: any number)
    max_devices: ClassVar[int | None] = 1
    #: whether ``training_step`` may step the optimizers itself (manual optimization)
    supports_manual_optimization: ClassVar[bool] = True
    #: whether every process holds the whole module and all must stay identical (DDP; not FSDP's shards): with
    #: several processes the Trainer then compares them at epoch ends and saves (``tandem.trainer.replicas``)
    identical_replicas: ClassVar[bool] = False
    #: whether a ``torch.compile``'d module can run (compiled again around this strategy's wrapper)
    #: ``follow_module`` has work to do (the loops call it at step boundaries; never when False)
    follows_module: ClassVar[bool] = False
    supports_compile: ClassVar[bool] = True
    #: the replica groups this process's group trains with (``ddp_ft``: a
    #: `ReplicaGroups`), or None: the Trainer then has every fit join them,
    #: runs again a step they did not commit, and reduces logged values over them
    replica_groups: ReplicaGroups | None = None

    def __init__(
        self,
        devices: list[torch.device] | None = None,
        precision: str | Precision | None = None,
        *,
        use_distributed_sampler: bool | None = None,
        sync_batchnorm: bool | None = None,
    ) -> None:
        self.parallel_devices: list[torch.device] | None = devices
        self.precision: Precision = precision if isinstance(precision, Precision) else Precision(precision or "32-true")
        self.use_distributed_sampler: bool = True if use_distributed_sampler is None else use_distributed_sampler
        self.sync_batchnorm: bool = False if sync_batchnorm is None else sync_batchnorm
        #: the Trainer's ``data_order``: "sampler" (Lightning's order) or "global" (one order for any process count)
        self.data_order = "sampler"
        #: where this process sits in the job, when given (``Trainer(plugins=[...])``, or the strategy's
        #: ``cluster_environment`` argument); None: read from the environment variables. One process uses it only
        #: for what a pre-emption stop does (``SLURMEnvironment(auto_requeue=False)``).
        self.cluster_environment: ClusterEnvironment | None = None
        #: ``AsyncCheckpointIO()`` from ``Trainer(plugins=[...])``: rank 0 writes checkpoints in the background;
        #: None: it writes them before ``save_checkpoint`` returns
        self.checkpoint_io: AsyncCheckpointIO | None = None
        # what the instance was built with (None: left open to the Trainer's arguments)
        self._given: dict[str, Any] = {
            "precision": None if precision is None else self.precision.precision,
            "use_distributed_sampler": use_distributed_sampler,
            "sync_batchnorm": sync_batchnorm,
        }
        self.num_nodes = 1
        self._module: nn.Module | None = None  # the user's module, unwrapped
        self._model: nn.Module | None = None  # what steps run through (may be a wrapper)
        self._compiled: Callable[..., Any] | None = None  # called as ``_model``; set when the module came compiled

    # ------------------------------------------------------------------ configuration (no side effects)
    @classmethod
    def _check_devices(cls, accelerator: str, count: int) -> None:
        """Raise a clear error if this strategy cannot run ``count`` devices of ``accelerator`` in one process."""
        if accelerator not in cls.supported_accelerators:
            supported = " or ".join(repr(a) for a in cls.supported_accelerators)
            raise TandemConfigError(f"strategy={cls.name!r} runs on accelerator={supported}, not {accelerator!r}.")
        if cls.max_devices is not None and count > cls.max_devices:
            raise TandemConfigError(
                f"strategy={cls.name!r} uses at most {cls.max_devices} device; got devices={count}. "
                "Use strategy='ddp' to train on several devices."
            )

    def _configure(
        self,
        devices: list[torch.device],
        num_nodes: int,
        precision: str | Precision,
        use_distributed_sampler: bool = True,
        sync_batchnorm: bool = False,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: AsyncCheckpointIO | None = None,
        data_order: str = "sampler",
    ) -> None:
        """Fill in what the Trainer's arguments decide and the instance left open (called once, by
        ``resolve_strategy``), then ``_check_configuration``. ``precision`` is a name (the Trainer's
        ``precision``) or a ``Precision`` instance (from ``plugins``, kept as given)."""
        if self.parallel_devices is None:
            self.parallel_devices = devices
        self.num_nodes = num_nodes
        trainer_precision = precision if isinstance(precision, Precision) else Precision(precision)
        _settle("precision", self._given["precision"], trainer_precision.precision, "32-true")  # refuses a conflict
        if self._given["precision"] is None:
            given = isinstance(precision, Precision)  # a plugin: asked for explicitly, so 16-mixed stays on the CPU
            self.precision = trainer_precision if given else for_device(trainer_precision, self.root_device.type)
        if cluster_environment is not None:
            if self.cluster_environment is not None and self.cluster_environment is not cluster_environment:
                raise incompatible(
                    f"Trainer(plugins=[{type(cluster_environment).__name__}(...)]) with a strategy built with "
                    f"cluster_environment={type(self.cluster_environment).__name__}(...)",
                    "a job has one cluster environment",
                    "Give it in one place: in plugins=[...] or the strategy's cluster_environment argument.",
                )
            self.cluster_environment = cluster_environment
        if checkpoint_io is not None:
            self.checkpoint_io = checkpoint_io
        self.use_distributed_sampler = _settle(
            "use_distributed_sampler", self._given["use_distributed_sampler"], use_distributed_sampler, True
        )
        self.sync_batchnorm = _settle("sync_batchnorm", self._given["sync_batchnorm"], sync_batchnorm, False)
        if data_order not in DATA_ORDERS:
            raise bad_choice("data_order", data_order, DATA_ORDERS)
        self.data_order = data_order
        self.precision.set_device_type(self.root_device.type)
        self._check_configuration()

    def _check_configuration(self) -> None:
        """Refuse (or adapt to) what the completed configuration cannot run; subclasses extend it."""

    # ------------------------------------------------------------------ capabilities and topology
    @property
    def root_device(self) -> torch.device:
        return self.parallel_devices[0] if self.parallel_devices else torch.device("cpu")

    @property
    def devices_per_process(self) -> int:
        """Devices one process drives (DataParallel: several; everyone else: one)."""
        return 1

    @property
    def launcher(self) -> Launcher | None:
        """A ``Launcher`` when other processes must be started, else None."""
        return None

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """``num_replicas`` and ``rank`` of this process's share of the data, or None when the data needs no
        sharding (one process). [`process_dataloader`][tandem.strategies.Strategy.process_dataloader] shards with
        these."""
        return None

    @property
    def global_rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    # ------------------------------------------------------------------ set-up
    def setup_environment(self) -> None:
        """Join the process group (distributed strategies) and record this process's rank."""
        set_rank(self.global_rank)

    @contextlib.contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        """Where the module's tensors are created in ``with trainer.init_module():`` — directly on this
        process's device, in the precision's dtype ("64-true": float64).

        Args:
            empty_init: ``True`` asks for the module to be built without memory (on the meta device) and
                initialised when the strategy sets it up; only sharding strategies (FSDP) do that, the others
                build on the device as for ``None``.
        """
        with torch.device(self.root_device), self.precision.module_init_context():
            yield

    def setup(self, module: nn.Module, compiler: Compiler | None = None) -> None:
        """Move the module to its device, convert its precision, and wrap it for the steps.

        Args:
            module: the user's module (not a ``torch.compile`` wrapper: see
                ``unwrap_compiled``).
            compiler: the settings of the ``torch.compile`` call the module came in, or None. The steps then run
                through the strategy's wrapper compiled with them (DDP: the DDP module, so that dynamo splits
                the graph at its gradient buckets; FSDP: the root, whose groups' hooks run between the compiled
                pieces), or, unwrapped, as the module's step methods compiled (``CompiledSteps``); the
                module itself stays plain.
        """
        if not isinstance(module, nn.Module):
            raise TandemUserCodeError(f"Strategy.setup expects a torch.nn.Module, got {type(module).__name__}.")
        self._setup(module)
        self._compiled = None if compiler is None else self._compile(compiler)

    def _setup(self, module: nn.Module) -> None:
        self._module = self.precision.convert_module(self._module_to_device(module))
        self._model = self._wrap_module(self._module)

    def _module_to_device(self, module: nn.Module) -> nn.Module:
        return module.to(self.root_device)

    def _wrap_module(self, module: nn.Module) -> nn.Module:
        """The object the steps run through; the default is the module itself."""
        return module

    def _compile(self, compiler: Compiler) -> Callable[..., Any]:
        """What the steps run through, compiled after wrapping: the wrapper (DDP, FSDP), or for a module that is
        not wrapped, its step methods one by one (``torch.compile`` of a module compiles its ``forward`` only;
        the steps are what run, and ``forward`` is compiled where they call it)."""
        if self._model is self._module:
            return CompiledSteps(self.module, compiler)
        _start_graphs_at_the_steps()
        return compiler(self.model)

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        return optimizers

    def follow_module(self, only_if_created: bool = False) -> None:
        """Called at step boundaries when ``follows_module`` (the fit's start, each epoch's start, after an
        overridden ``on_train_batch_start``, and each step with ``only_if_created``): adapt the wrapper to changes of
        the module's trainable parameters (DDP builds its wrapper again). Nothing to do by default."""

    def teardown(self) -> None:
        """Release what setup took; the module stays on its device."""
        self._compiled = None

    @property
    def module(self) -> nn.Module:
        """The user's module, unwrapped (None until ``setup``)."""
        return self._module  # type: ignore[return-value]  # None only before setup, which the Trainer's readers follow

    @property
    def model(self) -> nn.Module:
        """The module as the steps see it (a DDP, FSDP or DataParallel wrapper, or the module itself; None until
        ``setup``)."""
        return self._model  # type: ignore[return-value]  # None only before setup, which the Trainer's readers follow

    # ------------------------------------------------------------------ data
    def process_dataloader(self, dataloader: DataLoader, stage: str) -> DataLoader:
        """Adapt a dataloader to this strategy (DDP and FSDP shard it).

        Args:
            dataloader: the user's loader (or any iterable of batches).
            stage: "fit" for the training loader; "validate", "test" or "predict" for evaluation loaders
                (including validation during fit).
        """
        if stage not in STAGES:
            raise bad_choice("stage", stage, STAGES)
        processed = self._process_dataloader(dataloader, stage)
        seed_workers(processed, self.global_rank)  # seed_everything(workers=True), as Lightning
        end_workers_with_process(processed)  # no worker outlives a killed rank
        return processed

    def _process_dataloader(self, dataloader: DataLoader, stage: str) -> DataLoader:
        """One process: the training loader draws its order through a sampler a checkpoint can continue on any
        number of processes (``ordered_training``)."""
        if stage != "fit" or not self.use_distributed_sampler:
            return dataloader
        return ordered_training(dataloader, order_seed(), self.data_order)

    def before_evaluation(self, fitting: bool) -> None:
        """Called on every process as an evaluation pass begins (``fitting``: a validation inside ``fit``, the
        sanity check's too). Nothing here; DDP gives every rank rank 0's buffers there, as its wrapper's forward
        does in Lightning's validation."""

    def evaluation_batches(self, dataloader: Iterable[Any], limit: int | float) -> Iterator[Any]:
        """The batches one evaluation pass runs in this process: the first ``limit`` of ``dataloader``
        (``math.inf``: all). A strategy whose evaluation steps are collectives keeps the ranks in step here
        (FSDP: a rank that has run out of batches joins the others' parameter gathers until all are done).
        """
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit >= 0:
            raise out_of_range("limit", limit, "a number of batches >= 0, or math.inf")
        return itertools.islice(dataloader, None if limit == math.inf else int(limit))

    def batch_to_device(self, batch: Any) -> Any:
        # moves_batches (end of this file) tells the training loop when this returns the batch untouched, so that
        # the loop can skip the call: a change here that touches CPU batches at full precision must change it too
        device = self.root_device
        if device.type != "cpu":  # loaders yield CPU tensors: on the CPU there is nothing to move
            batch = apply_to_collection(batch, torch.Tensor, lambda t: t.to(device, non_blocking=True))
        return self.precision.convert_input(batch)

    def gather_predictions(self, predictions: list[Any], dataloader: Any) -> list[Any]:
        """Per-batch predict outputs of every process, in dataset order (one process: as they are)."""
        return predictions

    # ------------------------------------------------------------------ steps
    def run_step(self, method: str, *args: Any) -> Any:
        """Call ``training_step`` / ``validation_step`` / ``test_step`` / ``predict_step`` in the precision's
        forward context (autocast, or the default dtype of a "true" precision)."""
        if self._compiled is not None:
            step = partial(self._compiled, method)
        elif self._model is self._module:
            step = getattr(self._module, method)
        else:
            step = partial(self._model, method)  # type: ignore[arg-type, misc]  # set up before any step runs
        if not self.precision.has_forward_context:
            return step(*args)
        with self.precision.forward_context():
            return step(*args)

    def no_backward_sync(self, module: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
        """Skip gradient synchronisation inside this block when ``enabled`` (accumulation micro-steps, and
        ``manual_backward`` calls that are not the last before a step)."""
        return _NO_CONTEXT

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward of ``loss`` (scaled under "16-mixed"), with ``loss.backward``'s arguments: what the loop and
        ``manual_backward`` call."""
        self.precision.backward(loss, *args, **kwargs)

    def clip_gradients(self, optimizer: Optimizer, value: float, algorithm: str = "norm") -> None:
        """Clip ``optimizer``'s gradients; call after ``precision.unscale_gradients(optimizer)``.

        Args:
            optimizer: whose parameters' gradients to clip.
            value: the largest total norm (``"norm"``) or absolute value (``"value"``).
            algorithm: ``"norm"`` (the norm of all gradients together, across processes for a sharding
                strategy) or ``"value"`` (elementwise).
        """
        if algorithm not in CLIP_ALGORITHMS:
            raise bad_choice("gradient_clip_algorithm", algorithm, CLIP_ALGORITHMS)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise out_of_range("gradient_clip_val", value, "a number >= 0")
        self._clip_gradients(optimizer, float(value), algorithm)

    def _clip_gradients(self, optimizer: Optimizer, value: float, algorithm: str) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if algorithm == "norm":
            torch.nn.utils.clip_grad_norm_(params, value)
        else:
            torch.nn.utils.clip_grad_value_(params, value)

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any) -> bool:
        """Step (running ``closure`` first, or inside ``optimizer.step`` where the precision allows); False
        when the step was skipped (float16 loss scaling found inf/NaN)."""
        return self.precision.optimizer_step(optimizer, closure, **kwargs)

    # ------------------------------------------------------------------ collectives (identity for one process)
    @overload
    def reduce(self, tensor: torch.Tensor, reduce_op: ReduceOp = "mean") -> torch.Tensor: ...

    @overload
    def reduce(self, tensor: float, reduce_op: ReduceOp = "mean") -> torch.Tensor | float: ...

    def reduce(self, tensor: torch.Tensor | float, reduce_op: ReduceOp = "mean") -> torch.Tensor | float:
        """Combine ``tensor`` across processes with ``reduce_op`` ("mean", "sum", "max" or "min").

        Every process must call this. One process gets its input back unchanged; several give a number back as a
        tensor.
        """
        if reduce_op not in REDUCE_OPS:
            raise bad_choice("reduce_op", reduce_op, REDUCE_OPS)
        if isinstance(tensor, bool) or not isinstance(tensor, (torch.Tensor, int, float)):
            raise TandemUserCodeError(f"reduce expects a tensor or a number, got {type(tensor).__name__}.")
        return self._reduce(tensor, reduce_op)

    def _reduce(self, tensor: torch.Tensor | float, reduce_op: ReduceOp) -> torch.Tensor | float:
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack ``tensor`` (the same shape on every process) from every rank along a new dim 0."""
        if not isinstance(tensor, torch.Tensor):
            raise TandemUserCodeError(
                f"all_gather expects a tensor, got {type(tensor).__name__}; use all_gather_object for other values."
            )
        return self._all_gather(tensor)

    def _all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.unsqueeze(0)

    def all_gather_object(self, obj: _T) -> list[_T]:
        """Every rank's picklable ``obj``, in rank order."""
        return self._all_gather_object(obj)

    def _all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast(self, obj: _T, src: int = 0) -> _T:
        """Rank ``src``'s picklable ``obj``, on every rank."""
        if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < self.world_size:
            raise out_of_range("src", src, f"a rank in 0..{self.world_size - 1}")
        return self._broadcast(obj, src)

    def _broadcast(self, obj: Any, src: int) -> Any:
        return obj

    def ranks_with_batch(self, has_batch: bool) -> list[bool]:
        """Which ranks have a next training batch, in rank order; every process calls this. One small
        all-reduce, asked before each batch of an epoch of unknown length when several processes train."""
        return self._ranks_with_batch(bool(has_batch))

    def _ranks_with_batch(self, has_batch: bool) -> list[bool]:
        return [has_batch]

    def reduce_if_agreed(
        self, layout: int, flags: torch.Tensor, sums: torch.Tensor, maxes: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Reduce packed values when every process packed them alike; every process calls this.

        ``layout`` names what the tensors hold, position by position (a hash of the sorted names they pack). When
        it is the same on every rank, the int64 ``flags`` and the float64 ``maxes`` come back reduced by max and
        the float64 ``sums`` by sum, each on the CPU: one checked collective and a reduction per non-empty tensor,
        their sizes independent of the number of ranks. When some rank's layout differs, None on every rank (the
        caller then gathers what each sent, by name). One process gets its tensors back unchanged.
        """
        return self._reduce_if_agreed(int(layout), flags, sums, maxes)

    def _reduce_if_agreed(
        self, layout: int, flags: torch.Tensor, sums: torch.Tensor, maxes: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        # several processes through a strategy that does not override this: its callers gather instead
        return (flags, sums, maxes) if self.world_size == 1 else None

    def barrier(self, name: str | None = None) -> None:
        """Wait until every process reaches a barrier; ``name`` says which, for debugging."""
        if name is not None and not isinstance(name, str):
            raise out_of_range("name", name, "a string or None")
        self._barrier(name)

    def _barrier(self, name: str | None) -> None:
        pass

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """Whether every rank (``all=True``) or any rank (``all=False``) decided ``True``; every process calls
        this (one ``reduce`` of one number)."""
        votes = int(self.reduce(torch.tensor(int(bool(decision))), "sum"))
        return votes == self.world_size if all else votes > 0

    # ------------------------------------------------------------------ checkpoint state
    def module_state_dict(self) -> dict[str, Any]:
        """The module's state for a checkpoint, in the format
        [`save_checkpoint`][tandem.strategies.Strategy.save_checkpoint] writes. Every rank calls this (a sharding
        strategy gathers or shards here)."""
        return self.full_module_state_dict()

    def full_module_state_dict(self) -> dict[str, Any]:
        """The module's whole state as plain tensors, on global rank 0 at least (other ranks may get an
        empty dict), whatever the checkpoint format. Every rank calls this: a sharding strategy gathers here.
        ``ddp_spawn`` sends it back to the calling process."""
        return self.module.state_dict()

    def load_module_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Load a checkpoint's module state into the module this strategy set up."""
        self.module.load_state_dict(state_dict, strict=strict)

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """``optimizer``'s state for a checkpoint. Every rank calls this."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: Optimizer, state: dict[str, Any]) -> None:
        """Load a checkpoint's state of one optimizer."""
        optimizer.load_state_dict(state)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path) -> None:
        """Every rank calls this with the state it built; global rank 0 writes atomically (with
        ``AsyncCheckpointIO``: copies it and writes in the background); all ranks meet after."""
        if self.is_global_zero:
            if self.checkpoint_io is not None:
                self.checkpoint_io.save_checkpoint(checkpoint, path)
            else:
                atomic_save(checkpoint, path)
        self.barrier("save_checkpoint")

    def load_checkpoint(self, path: str | Path, weights_only: bool | None = None) -> dict[str, Any]:
        """Read a checkpoint file onto the CPU (a sharded checkpoint directory needs the strategy that wrote it);
        as tensors and plain data only unless ``weights_only=False`` says the file is trusted."""
        if self.checkpoint_io is not None:
            self.checkpoint_io.wait_for(path)  # a file still being written in the background
        if is_sharded_checkpoint(path):
            raise sharded_checkpoint_error(path, self.name)
        return load_checkpoint_file(path, weights_only)  # a plain folder is named as one there

    def remove_checkpoint(self, path: str | Path) -> None:
        """Delete a checkpoint file (or a sharded checkpoint's directory), on global rank 0."""
        if self.is_global_zero:
            if self.checkpoint_io is not None:
                self.checkpoint_io.wait_for(path)
            remove_file(path)


def _settle(name: str, given: Any, trainer: Any, default: Any) -> Any:
    """Option ``name`` of a strategy: what the instance was built with (``given``; None: left open, so the
    Trainer's value), unless the Trainer asked for something else than its ``default`` that disagrees."""
    if given is None:
        return trainer
    if trainer != default and trainer != given:
        raise incompatible(
            f"Trainer({name}={trainer!r}) with a strategy built with {name}={given!r}",
            "the two disagree",
            f"Give the {name} in one place: Trainer({name}=...) or the strategy's {name} argument.",
        )
    return given


def sharded_checkpoint_error(path: str | Path, strategy: str) -> CheckpointError:
    """A sharded checkpoint (a directory) handed to a strategy that does not shard."""
    return CheckpointError(
        f"Checkpoint {str(path)!r} is a directory: a sharded checkpoint written by "
        f"FSDPStrategy(state_dict_type='sharded'), which strategy={strategy!r} cannot load. Load it with "
        "strategy='fsdp' (on any number of devices), or save with FSDPStrategy(state_dict_type='full') to "
        "get one file that every strategy loads."
    )


def moves_batches(strategy: Strategy) -> bool:
    """Whether ``strategy.batch_to_device`` changes a batch; False on the CPU at the precision's own dtype with the
    method as [`Strategy`][tandem.strategies.Strategy] writes it (loaders yield CPU tensors): the training loop then
    skips the call."""
    if type(strategy).batch_to_device is not Strategy.batch_to_device or strategy.root_device.type != "cpu":
        return True
    precision = strategy.precision
    return type(precision).convert_input is not Precision.convert_input or precision.parameter_dtype is not None
