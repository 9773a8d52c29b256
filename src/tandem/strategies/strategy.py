"""The Strategy base: where the module lives, how batches get there, and how processes talk.

A strategy with one process uses the defaults here unchanged: its collectives return their input and
its barrier passes. Distributed strategies override only what differs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader

from tandem.strategies.precision import Precision
from tandem.utilities.checkpoint import atomic_save, load_checkpoint_file
from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.rank_zero import set_rank

_NO_CONTEXT = contextlib.nullcontext()
ReduceOp = str  # "mean" | "sum" | "max" | "min"
_STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")


class StepForward(nn.Module):
    """Routes ``forward`` to the module's step method, so wrappers (DDP, DataParallel) see each step as a
    forward call: DDP prepares its gradient reduction there, DataParallel splits the batch there."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.module, method)(*args, **kwargs)


class Strategy:
    """Base class of every strategy.

    Args:
        devices: the devices this process may use (one for most strategies, several for
            DataParallel). ``None`` lets the Trainer choose from its ``accelerator`` and ``devices``.
        precision: a precision name (see :class:`~tandem.strategies.precision.Precision`) or instance.

    Subclasses set ``name`` and may override the properties and methods below. Capabilities are data:
    ``distributed_sampler_kwargs`` says whether the training data must be sharded, ``launcher``
    whether other processes must be started.

    Example::

        trainer = Trainer(strategy=SingleDeviceStrategy(device="cpu"), max_epochs=1)
    """

    name: ClassVar[str] = ""
    #: accelerators this strategy runs on; the first error names the fix
    supported_accelerators: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    #: most devices this strategy can use on one node (None: any number)
    max_devices: ClassVar[int | None] = 1
    #: whether process_dataloader may replace samplers to shard data (``Trainer(use_distributed_sampler=...)``)
    use_distributed_sampler: bool = True
    #: turn BatchNorm layers into SyncBatchNorm (``Trainer(sync_batchnorm=True)``); strategies with one process ignore it
    sync_batchnorm: bool = False
    #: whether ``training_step`` may step the optimizers itself (manual optimization)
    supports_manual_optimization: ClassVar[bool] = True

    def __init__(self, devices: list[torch.device] | None = None, precision: str | Precision | None = None) -> None:
        self.parallel_devices: list[torch.device] | None = devices
        self.precision: Precision | None = Precision(precision) if isinstance(precision, (str, int)) else precision
        self.num_nodes = 1
        self._module: nn.Module | None = None  # the user's module, unwrapped
        self._model: nn.Module | None = None  # what steps run through (may be a wrapper)

    # ------------------------------------------------------------------ configuration (no side effects)
    @classmethod
    def check_devices(cls, accelerator: str, count: int) -> None:
        """Raise a clear error if this strategy cannot run ``count`` devices of ``accelerator`` in one process."""
        if accelerator not in cls.supported_accelerators:
            supported = " or ".join(repr(a) for a in cls.supported_accelerators)
            raise TandemConfigError(f"strategy={cls.name!r} runs on accelerator={supported}, not {accelerator!r}.")
        if cls.max_devices is not None and count > cls.max_devices:
            raise TandemConfigError(
                f"strategy={cls.name!r} uses at most {cls.max_devices} device; got devices={count}. "
                "Use strategy='ddp' to train on several devices."
            )

    def configure(self, devices: list[torch.device], num_nodes: int, precision: str | Precision) -> None:
        """Fill in what the Trainer's arguments decide and the user's instance left open."""
        if self.parallel_devices is None:
            self.parallel_devices = devices
        self.num_nodes = num_nodes
        if self.precision is None:
            self.precision = precision if isinstance(precision, Precision) else Precision(precision)
        self.precision.set_device_type(self.root_device.type)

    # ------------------------------------------------------------------ capabilities and topology
    @property
    def root_device(self) -> torch.device:
        return self.parallel_devices[0] if self.parallel_devices else torch.device("cpu")

    @property
    def devices_per_process(self) -> int:
        """Devices one process drives (DataParallel: several; everyone else: one)."""
        return 1

    @property
    def launcher(self) -> Any:
        """An object with ``launch(fn, *args, trainer=...)`` when other processes must be started, else None."""
        return None

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int] | None:
        """``num_replicas`` and ``rank`` for a DistributedSampler, or None when data needs no sharding."""
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

    def setup(self, module: nn.Module) -> None:
        """Move the module to its device, convert its precision, and wrap it for the steps."""
        self._module = self.precision.convert_module(self.module_to_device(module))
        self._model = self.wrap_module(self._module)

    def module_to_device(self, module: nn.Module) -> nn.Module:
        return module.to(self.root_device)

    def wrap_module(self, module: nn.Module) -> nn.Module:
        """The object the steps run through; the default is the module itself."""
        return module

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        return optimizers

    def teardown(self) -> None:
        """Release what setup took; the module stays on its device."""

    @property
    def module(self) -> nn.Module:
        """The user's module, unwrapped."""
        return self._module

    @property
    def model(self) -> nn.Module:
        """The module as the steps see it (a DDP or DataParallel wrapper, or the module itself)."""
        return self._model

    # ------------------------------------------------------------------ data
    def process_dataloader(self, dataloader: DataLoader, stage: str) -> DataLoader:
        """Adapt a dataloader to this strategy (DDP shards it); ``stage`` is "fit", "validate", "test" or "predict"."""
        return dataloader

    def batch_to_device(self, batch: Any) -> Any:
        device = self.root_device
        if device.type != "cpu":  # loaders yield CPU tensors: on the CPU there is nothing to move
            batch = apply_to_collection(batch, torch.Tensor, lambda t: t.to(device, non_blocking=True))
        return self.precision.convert_input(batch)

    def gather_predictions(self, predictions: list[Any], dataloader: Any) -> list[Any]:
        """Per-batch predict outputs of every process, in dataset order (one process: as they are)."""
        return predictions

    # ------------------------------------------------------------------ steps
    def run_step(self, method: str, *args: Any) -> Any:
        """Call ``training_step`` / ``validation_step`` / ``test_step`` / ``predict_step`` under autocast."""
        step = getattr(self._module, method) if self._model is self._module else partial(self._model, method)
        if self.precision.autocast_dtype is None:
            return step(*args)
        with self.precision.forward_context():
            return step(*args)

    def no_backward_sync(self, module: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
        """Skip gradient synchronisation inside this block when ``enabled`` (accumulation micro-steps)."""
        return _NO_CONTEXT

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``loss.backward(*args, **kwargs)``, scaled by the precision (float16)."""
        self.precision.backward(loss, *args, **kwargs)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Undo float16 loss scaling once per step, before hooks and clipping read the gradients."""
        self.precision.unscale_gradients(optimizer)

    def clip_gradients(self, optimizer: Optimizer, value: float, algorithm: str) -> None:
        """Clip by total norm (``"norm"``) or elementwise (``"value"``); call after :meth:`unscale_gradients`."""
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if algorithm == "norm":
            torch.nn.utils.clip_grad_norm_(params, value)
        else:
            torch.nn.utils.clip_grad_value_(params, value)

    def optimizer_step(self, optimizer: Optimizer, closure: Any = None, **kwargs: Any) -> bool:
        """Step (running ``closure`` first, or inside ``optimizer.step`` where the precision allows); False
        when the step was skipped (float16 loss scaling found inf/NaN)."""
        return self.precision.optimizer_step(optimizer, closure, **kwargs)

    # ------------------------------------------------------------------ collectives (identity for one process)
    def reduce(self, tensor: torch.Tensor, reduce_op: ReduceOp = "mean") -> torch.Tensor:
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Stack ``tensor`` from every rank along a new dim 0."""
        return tensor.unsqueeze(0)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable ``obj``, in rank order."""
        return [obj]

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def barrier(self, name: str | None = None) -> None:
        pass

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        return decision

    # ------------------------------------------------------------------ checkpoint state
    def module_state_dict(self) -> dict[str, Any]:
        """The module's state for a checkpoint. Every rank calls this (a sharding strategy gathers here)."""
        return self.module.state_dict()

    def load_module_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Load a checkpoint's module state into the module this strategy set up."""
        self.module.load_state_dict(state_dict, strict=strict)

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """``optimizer``'s state for a checkpoint. Every rank calls this."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: Optimizer, state: Mapping[str, Any]) -> None:
        """Load a checkpoint's state of one optimizer."""
        optimizer.load_state_dict(state)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path) -> None:
        """Every rank calls this with the state it built; global rank 0 writes atomically; all ranks meet after."""
        if self.is_global_zero:
            atomic_save(checkpoint, path)
        self.barrier("save_checkpoint")

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        return load_checkpoint_file(path)

    def remove_checkpoint(self, path: str | Path) -> None:
        if self.is_global_zero:
            Path(path).unlink(missing_ok=True)
