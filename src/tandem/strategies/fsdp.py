"""Fully sharded data parallel on PyTorch's FSDP2: each of N processes holds 1/N of the parameters,
gradients and optimizer state.

The engine is torch's: ``torch.distributed.fsdp.fully_shard`` over a one-dimensional
``torch.distributed.device_mesh.DeviceMesh``, and ``torch.distributed.checkpoint`` for state dicts
and sharded checkpoints. What tandem adds:

- **Groups.** ``auto_wrap_policy`` (a set of layer classes, or ``callable(module) -> bool``) picks the
  submodules that become FSDP groups, bottom-up; the module's own ``configure_model()`` hook may call
  ``fully_shard`` itself. The root group is a ``StepForward`` around the
  module, so each ``training_step`` / ``validation_step`` / ... is one FSDP forward: its parameters are
  gathered before the step and its gradients reduce-scattered in backward.
- **Evaluation in step.** FSDP's forward is a collective, but evaluation ranks see different numbers of
  batches (every sample exactly once). ``FSDPStrategy.evaluation_batches`` lets a rank that has run out
  of batches join the others' parameter gathers (replaying the last step's gathers) until every rank is
  done, so validation, test and predict equal one process's results and never hang.
- **Checkpoints.** ``state_dict_type="full"`` gathers one file on rank 0 in tandem's normal format
  (loadable on one device and by ``ddp``); ``"sharded"`` writes a directory with
  torch.distributed.checkpoint, each rank its shard, into a temporary directory renamed when every rank has
  finished. A sharded checkpoint loads on any number of ranks. ``weights_only`` checkpoints are always one
  full file.
- **After a stage** the module stays sharded (as in Lightning: gathering it whole on every rank would need
  the memory FSDP saves). Calling it or its ``state_dict()`` outside the Trainer is an error naming
  ``trainer.save_checkpoint(path, weights_only=True)`` and
  [`FSDPStrategy.full_module_state_dict`][tandem.strategies.FSDPStrategy.full_module_state_dict].
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from tandem.strategies.environments.cluster_environment import ClusterEnvironment
from tandem.strategies.fsdp_checkpoint import (
    load_sharded_checkpoint,
    named_state,
    numbered_state,
    save_sharded_checkpoint,
)
from tandem.strategies.fsdp_checks import (
    Policy,
    batch_norms,
    check_dtypes,
    check_policy,
    fsdp1_sharding,
    is_dtensor,
    is_fsdp,
    refuse_data_parallel,
    select_layers,
)
from tandem.strategies.fsdp_guard import READING_ATTRIBUTE, guard, unguard
from tandem.strategies.fsdp_meta_init import check_initialisable, has_meta, parameters_on_meta
from tandem.strategies.parallel import ParallelStrategy
from tandem.strategies.precision import Precision
from tandem.strategies.registry import register_strategy
from tandem.strategies.steps import StepForward
from tandem.utilities.checkpoint import is_sharded_checkpoint, load_checkpoint_file
from tandem.utilities.exceptions import TandemConfigError, TandemUserCodeError, bad_choice

if TYPE_CHECKING:  # torch's FSDP, DTensor and checkpoint modules take ~1 s to import: loaded when used
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy

    from tandem.strategies.fsdp_checks import ShardedModule


STATE_DICT_TYPES = ("full", "sharded")
_ROOT_ATTRIBUTE = "_tandem_fsdp_root"  # the FSDP root built around a module, reused by later stages
_PARAM_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


class FSDPStrategy(ParallelStrategy):
    """One process per device, with parameters, gradients and optimizer state sharded across the processes.

    Launch, data sharding, evaluation, metrics and crash handling are those of ``ddp``
    ([`ParallelStrategy`][tandem.strategies.ParallelStrategy]): the script is re-run for the other ranks, or
    torchrun / srun started them; ``start_method="spawn"`` spawns them per stage.

    Args:
        devices: this node's devices, one process each (the Trainer's ``devices`` when None).
        precision: see [`Precision`][tandem.strategies.Precision]. "bf16-mixed" keeps bfloat16 copies of
            the parameters for compute and reduces gradients in float32 (FSDP's ``MixedPrecisionPolicy``),
            under autocast; "16-mixed" the same with float16 and a sharded gradient scaler. BatchNorm layers
            keep float32 weights (each its own group), as under autocast on one device.
        auto_wrap_policy: which submodules become FSDP groups (all-gathered and freed one by one, the key to
            saving memory): a set of layer classes (e.g. ``{TransformerBlock}``) or ``callable(module) -> bool``.
            None: only the groups ``configure_model()`` made, plus the root.
        activation_checkpointing_policy: layer classes (or a callable) whose activations are recomputed in
            backward instead of stored.
        reshard_after_forward: free the gathered parameters of each group after its forward and gather them
            again in backward (True: less memory); False keeps them until backward (less communication).
        sharding_strategy: Lightning's FSDP1 argument, refused with its FSDP2 equivalent named: ``"FULL_SHARD"`` is
            ``reshard_after_forward=True`` (the default), ``"SHARD_GRAD_OP"`` is ``reshard_after_forward=False``,
            ``"NO_SHARD"`` is ``strategy="ddp"``; the hybrid ones have none here.
        cpu_offload: keep the sharded parameters, gradients and optimizer state in CPU memory; the optimizer
            steps on the CPU.
        sync_module_states: start every rank from rank 0's weights and buffers (like DDP), so ranks seeded
            differently agree. A module built with ``trainer.init_module(empty_init=True)`` is initialised
            consistently anyway; only its buffers are broadcast.
        state_dict_type: "full" (one file, written by rank 0) or "sharded" (a directory, each rank its shard).
        process_group_backend, timeout, use_distributed_sampler, start_method, cluster_environment: as for
            ``DDPStrategy``.

    Example:
        ```python
        trainer = Trainer(strategy=FSDPStrategy(auto_wrap_policy={Block}), accelerator="cuda", devices=4,
                          precision="bf16-mixed")
        with trainer.init_module(empty_init=True):  # no memory until each rank materialises its shard
            model = LanguageModel()
        trainer.fit(model, loader)
        ```
    """

    name = "fsdp"

    def __init__(
        self,
        devices: list[torch.device] | None = None,
        precision: str | Precision | None = None,
        auto_wrap_policy: Policy = None,
        activation_checkpointing_policy: Policy = None,
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        sync_module_states: bool = True,
        state_dict_type: str = "full",
        process_group_backend: str | None = None,
        timeout: datetime.timedelta = datetime.timedelta(minutes=30),
        use_distributed_sampler: bool | None = None,
        start_method: str = "popen",
        collective_check_timeout: datetime.timedelta | None = datetime.timedelta(seconds=60),
        hang_timeout: datetime.timedelta | None = datetime.timedelta(minutes=5),
        cluster_environment: ClusterEnvironment | None = None,
        sharding_strategy: Any = None,
    ) -> None:
        if sharding_strategy is not None:
            raise fsdp1_sharding(sharding_strategy)
        super().__init__(
            devices=devices,
            precision=precision,
            process_group_backend=process_group_backend,
            timeout=timeout,
            use_distributed_sampler=use_distributed_sampler,
            start_method=start_method,
            collective_check_timeout=collective_check_timeout,
            hang_timeout=hang_timeout,
            cluster_environment=cluster_environment,
        )
        self.auto_wrap_policy = check_policy("auto_wrap_policy", auto_wrap_policy)
        self.activation_checkpointing_policy = check_policy(
            "activation_checkpointing_policy", activation_checkpointing_policy
        )
        for flag, value in (
            ("reshard_after_forward", reshard_after_forward),
            ("cpu_offload", cpu_offload),
            ("sync_module_states", sync_module_states),
        ):
            if not isinstance(value, bool):
                raise TandemConfigError(f"FSDPStrategy({flag}={value!r}) must be True or False.")
        if state_dict_type not in STATE_DICT_TYPES:
            raise bad_choice("state_dict_type", state_dict_type, STATE_DICT_TYPES)
        self.reshard_after_forward = reshard_after_forward
        self.cpu_offload = cpu_offload
        self.sync_module_states = sync_module_states
        self.state_dict_type = state_dict_type
        self._mesh: DeviceMesh | None = None
        self._optimizers: list[Optimizer] = []
        self._hooks: list[Any] = []
        self._managed: dict[ShardedModule, str] = {}  # FSDP module -> one parameter its group holds
        self._recording: list[ShardedModule] | None = None
        self._last_step: list[tuple[ShardedModule, bool]] = []  # the gathers of the last evaluation step

    def _check_configuration(self) -> None:
        super()._check_configuration()
        if self.precision.scaler is not None:  # found-inf must agree across the shards: torch's sharded scaler
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self.precision.scaler = ShardedGradScaler(self.root_device.type)

    # ------------------------------------------------------------------ topology
    @property
    def device_mesh(self) -> DeviceMesh:
        """The one-dimensional mesh of every rank (available once the stage has started): pass it to
        ``fully_shard(layer, mesh=self.trainer.strategy.device_mesh)`` in ``configure_model``."""
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(self.root_device.type, (self.world_size,))
        return self._mesh

    @property
    def mixed_precision_policy(self) -> MixedPrecisionPolicy:
        """The groups' policy: parameters gathered in the precision's 16-bit dtype, gradients reduced in float32,
        and the group's floating-point inputs cast to that dtype."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dtype = _PARAM_DTYPES.get(self.precision.precision)
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)

    @property
    def offload_policy(self) -> OffloadPolicy:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

        return CPUOffloadPolicy(pin_memory=self.root_device.type == "cuda") if self.cpu_offload else OffloadPolicy()

    # ------------------------------------------------------------------ set-up
    @contextlib.contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        """``empty_init=True``: parameters are created on the meta device (no memory); each rank materialises
        and initialises only its shard when the stage starts, with each submodule's ``reset_parameters()``.
        Buffers and other tensors are created on the device as usual."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.device(self.root_device))
            stack.enter_context(self.precision.module_init_context())
            if empty_init:
                stack.enter_context(parameters_on_meta())
            yield

    def _setup(self, module: nn.Module) -> None:
        self._optimizers = []
        unguard(module)
        root = module.__dict__.get(_ROOT_ATTRIBUTE)
        if root is None:  # a module sharded by an earlier stage keeps its groups
            root = self._shard(module)
            module.__dict__[_ROOT_ATTRIBUTE] = root
        self._module, self._model = module, root
        self._index(root)
        self._reshard_all()  # an earlier evaluation may have left the root gathered: the optimizer needs the shards

    def _shard(self, module: nn.Module) -> ShardedModule:
        """Check, then shard: activation checkpointing, the policy's groups innermost first, the root last."""
        from torch.distributed._composable import checkpoint
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        refuse_data_parallel(module)
        meta = [m for m in module.modules() if has_meta(m)]
        if meta:
            check_initialisable(module, meta)
        else:
            module = self._module_to_device(module)
        module = self.precision.convert_module(module)
        checkpointed = select_layers(module, self.activation_checkpointing_policy, "activation_checkpointing_policy")
        groups = select_layers(module, self.auto_wrap_policy, "auto_wrap_policy")
        # BatchNorm keeps float32 weights under a 16-bit policy (its statistics are float32), as autocast does
        norms = batch_norms(module) if self.mixed_precision_policy.param_dtype is not None else []
        groups = [g for g in groups if not any(g is n for n in norms)]
        check_dtypes(module, norms + groups)
        if self.sync_module_states and self.world_size > 1 and not meta:
            self._broadcast_tensors(module)
        for layer in checkpointed:
            checkpoint(layer)
        mesh, policy, offload = self.device_mesh, self.mixed_precision_policy, self.offload_policy
        for layer in norms:
            fully_shard(
                layer,
                mesh=mesh,
                reshard_after_forward=self.reshard_after_forward,
                mp_policy=MixedPrecisionPolicy(),
                offload_policy=offload,
            )
        for layer in groups:
            fully_shard(
                layer,
                mesh=mesh,
                reshard_after_forward=self.reshard_after_forward,
                mp_policy=policy,
                offload_policy=offload,
            )
        # the root: torch keeps its parameters gathered after forward (backward needs them at once)
        reshard_root = None if self.reshard_after_forward else False
        # the root's input is the whole batch: targets stay float32 for the loss (autocast casts the layers' inputs)
        root_policy = dataclasses.replace(policy, cast_forward_inputs=False)
        root = cast(
            "ShardedModule",  # the module itself, its class now also an FSDPModule
            fully_shard(
                StepForward(module),
                mesh=mesh,
                reshard_after_forward=reshard_root,
                mp_policy=root_policy,
                offload_policy=offload,
            ),
        )
        if meta:
            self._materialize(root, module, meta)
        return root

    def _broadcast_tensors(self, module: nn.Module, parameters: bool = True) -> None:
        """Rank 0's buffers (and unsharded parameters) on every rank."""
        tensors = list(module.buffers()) + (list(module.parameters()) if parameters else [])
        with torch.no_grad():
            for tensor in tensors:
                if not is_dtensor(tensor) and not tensor.is_meta:
                    dist.broadcast(tensor.data, src=0)

    def _materialize(self, root: nn.Module, module: nn.Module, meta: list[nn.Module]) -> None:
        """Allocate this rank's shards of the meta parameters, then initialise them with ``reset_parameters``.

        Buffers and torchmetrics states were created for real: they are kept as they are.
        """
        from torchmetrics import Metric

        buffers = [(m, name, b) for m in root.modules() for name, b in m._buffers.items() if b is not None]
        metrics = [(m, name, c) for m in root.modules() for name, c in m._modules.items() if isinstance(c, Metric)]
        for parent, name, _ in metrics:
            parent._modules[name] = None  # to_empty would empty their states and defaults
        try:
            root.to_empty(device="cpu" if self.cpu_offload else self.root_device)
        finally:
            for parent, name, child in metrics:
                parent._modules[name] = child
        for owner, name, buffer in buffers:
            owner._buffers[name] = buffer.to(self.root_device)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "DTensor random operators may not have complete support")
            for layer in meta:
                layer.reset_parameters()  # type: ignore[operator]  # check_initialisable found one on each
        if self.sync_module_states and self.world_size > 1:
            self._broadcast_tensors(module, parameters=False)

    def _index(self, root: nn.Module) -> None:
        """Record, per FSDP group, one parameter it holds (to tell whether it is gathered) and hook its forward
        (to know which groups an evaluation step gathers)."""
        for handle in self._hooks:
            handle.remove()
        groups = [m for m in root.modules() if is_fsdp(m)]
        self._managed = {}
        for group in groups:
            nested = {
                id(p) for inner in group.modules() if inner is not group and is_fsdp(inner) for p in inner.parameters()
            }
            name = next((n for n, p in group.named_parameters() if id(p) not in nested), None)
            if name is not None:
                self._managed[group] = name
        self._hooks = [g.register_forward_pre_hook(self._record) for g in self._managed]
        self._last_step = []

    def _record(self, module: ShardedModule, args: Any) -> None:
        if self._recording is not None:
            self._recording.append(module)

    def setup_optimizers(self, optimizers: list[Optimizer]) -> list[Optimizer]:
        for optimizer in optimizers:
            plain = [p for g in optimizer.param_groups for p in g["params"] if not is_dtensor(p)]
            if plain:
                raise TandemUserCodeError(
                    f"The optimizer holds {len(plain)} parameter(s) that FSDP did not shard. Build the optimizer "
                    "in configure_optimizers from self.parameters() (it runs after the module is sharded), not "
                    "from tensors created or saved earlier."
                )
        self._optimizers = list(optimizers)
        return optimizers

    def teardown(self) -> None:
        """The module stays sharded (its parameters are this rank's shards, the gathered copies are freed); a
        later stage reuses its groups. Until then, calling it or its ``state_dict()`` raises an error naming
        the ways to the whole weights (on one rank it would fail with DTensor errors, hang in a gather, or
        return this rank's shards)."""
        self._reshard_all()
        if self._module is not None and is_fsdp(self._model):
            guard(self._module, self.world_size)
        for handle in self._hooks:
            handle.remove()
        self._hooks, self._recording, self._last_step = [], None, []
        super().teardown()

    # ------------------------------------------------------------------ steps
    def run_step(self, method: str, *args: Any) -> Any:
        """Every step is one forward of the FSDP root (parameters gathered around it); evaluation steps also
        record which groups they gathered, for ranks that run out of batches first."""
        root = self._model if self._compiled is None else self._compiled
        if method == "training_step":
            with self.precision.forward_context():
                return root(method, *args)  # type: ignore[misc]  # set up before any step
        gathered: list[ShardedModule] = []
        self._recording = gathered
        try:
            with self.precision.forward_context():
                output = root(method, *args)  # type: ignore[misc]  # set up before any step
        finally:
            self._recording = None
        self._last_step = [(group, self._is_sharded(group)) for group in gathered]
        return output

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool) -> Iterator[None]:
        """Accumulation micro-steps keep their gradients unreduced (``set_requires_gradient_sync(False)``); the
        step that follows reduce-scatters their sum once."""
        root = self._model
        if not enabled or not is_fsdp(root):
            yield
            return
        root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            root.set_requires_gradient_sync(True)

    # ------------------------------------------------------------------ evaluation in step
    def evaluation_batches(self, dataloader: Iterable[Any], limit: int | float) -> Iterator[Any]:
        batches = super().evaluation_batches(dataloader, limit)
        if self.world_size == 1 or not dist.is_initialized() or not is_fsdp(self._model):
            return batches
        return self._in_step(batches)

    def _in_step(self, batches: Iterator[Any]) -> Iterator[Any]:
        """Each round, every rank says whether it runs a step; a rank without a batch replays the last step's
        parameter gathers while any rank still runs one. All ranks leave together."""
        for batch in batches:
            self._running(True)
            yield batch
        while self._running(False):
            self._replay_gathers()

    def _running(self, running: bool) -> int:
        return int(self.reduce(torch.tensor(int(running)), "sum"))

    def _replay_gathers(self) -> None:
        root = self._model
        assert is_fsdp(root)  # evaluation_batches replays only around an FSDP root
        steps = self._last_step or [(g, g is not root and self.reshard_after_forward) for g in self._managed]
        # a rank that has not run a forward yet: torch's root set-up, which the first forward would do (no public API)
        root._get_fsdp_state()._lazy_init()
        for group, resharded in steps:
            group.unshard()
            if resharded:
                group.reshard()

    def _is_sharded(self, group: ShardedModule) -> bool:
        name = self._managed.get(group)
        return name is None or is_dtensor(group.get_parameter(name))

    def _reshard_all(self) -> None:
        """Register the sharded parameters everywhere (local): the state-dict functions map them to names."""
        for group in self._managed:
            group.reshard()

    # ------------------------------------------------------------------ checkpoint state
    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """The sharded parameters registered everywhere (local: the state-dict functions map them to names), and
        the module's state readable between stages (torch's state-dict functions call ``state_dict()``)."""
        self._reshard_all()
        module = self.module
        module.__dict__[READING_ATTRIBUTE] = True
        try:
            yield
        finally:
            module.__dict__.pop(READING_ATTRIBUTE, None)

    def module_state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        if self.state_dict_type == "full":
            return self.full_module_state_dict()
        with self._reading():
            return get_model_state_dict(self.module)

    def full_module_state_dict(self) -> dict[str, Any]:
        """The whole weights, as plain CPU tensors, gathered from every rank's shards: call it on every rank
        (it is a collective); rank 0 receives them, the others get ``{}``. After ``fit`` this is how the
        trained weights leave the sharded module (or ``trainer.save_checkpoint(path, weights_only=True)``).

        Example:
            ```python
            state_dict = trainer.strategy.full_module_state_dict()  # every rank
            if trainer.is_global_zero:
                torch.save(state_dict, "model.pt")
            ```
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        with self._reading():
            return get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def load_module_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        full = not any(is_dtensor(v) for v in state_dict.values())
        try:
            with self._reading():
                set_model_state_dict(
                    self.module, dict(state_dict), options=StateDictOptions(full_state_dict=full, strict=strict)
                )
        except (KeyError, ValueError) as err:
            raise RuntimeError(str(err)) from None

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """Full: the gathered state in torch's usual format (parameters numbered, on rank 0); sharded: the
        shards by parameter name. An optimizer that has not stepped yet has nothing to shard: its plain
        state dict (torch would initialise the state to name it, changing the next step)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        if not optimizer.state:
            return optimizer.state_dict()
        with self._reading():
            if self.state_dict_type == "sharded":
                return get_optimizer_state_dict(self.module, optimizer)
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            state = get_optimizer_state_dict(self.module, optimizer, options=options)
        return numbered_state(state) if state else {}

    def load_optimizer_state(self, optimizer: Optimizer, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        if not state.get("state"):
            optimizer.load_state_dict(state)
            return
        with self._reading():
            if all(isinstance(k, str) for k in state["state"]):  # by name: a sharded checkpoint
                set_optimizer_state_dict(self.module, optimizer, dict(state))
                return
            named = named_state(state, self._parameter_names(optimizer))
            set_optimizer_state_dict(self.module, optimizer, named, options=StateDictOptions(full_state_dict=True))

    def _parameter_names(self, optimizer: Optimizer) -> list[str]:
        names = {id(p): n for n, p in self.module.named_parameters()}
        params = [p for g in optimizer.param_groups for p in g["params"]]
        missing = [i for i, p in enumerate(params) if id(p) not in names]
        if missing:
            raise TandemUserCodeError(
                f"The optimizer holds {len(missing)} parameter(s) that are not the module's; FSDP names each "
                "parameter by its place in the module. Build the optimizer from self.parameters()."
            )
        return [names[id(p)] for p in params]

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path) -> None:
        """A full state dict (``state_dict_type="full"``, or ``weights_only``): rank 0 writes one file. Sharded: a
        directory — every rank writes its shard with torch.distributed.checkpoint into a temporary directory
        (named and locked by rank 0 like a file's temporary, so a later save or resume removes one a killed job
        left), rank 0 adds ``meta.pt`` (everything but the module and optimizer tensors), and the directory is
        renamed onto ``path`` once every rank has finished (``replace_directory``:
        a kill while the previous checkpoint is replaced leaves what the next save or a resume settles)."""
        if not any(is_dtensor(v) for v in checkpoint["state_dict"].values()):  # the same on every rank
            super().save_checkpoint(checkpoint, path)
            return
        save_sharded_checkpoint(self, checkpoint, path)

    def load_checkpoint(self, path: str | Path, weights_only: bool | None = None) -> dict[str, Any]:
        """A file (full, or written by another strategy) as usual; a sharded directory is read into this rank's
        shards, whatever the number of ranks that wrote it. Tensors and plain data only, its ``.metadata`` too
        (``sharded_reader``), unless ``weights_only=False`` says the checkpoint is trusted."""
        path = Path(path)
        if not is_sharded_checkpoint(path):
            return load_checkpoint_file(path, weights_only)  # a file, or a plain folder (named as one there)
        return load_sharded_checkpoint(path, weights_only, self.module, self._optimizers, self._reading)


register_strategy("fsdp", FSDPStrategy, "one process per device; parameters, gradients and optimizer state sharded")
