"""DistributedDataParallel: one process per device, gradients all-reduced in backward.

Environment, launchers, process group, collectives and data sharding come from
:class:`~tandem.strategies.parallel.ParallelStrategy`; this module adds DDP's wrapper, its gradient
synchronisation and its error messages.
"""

from __future__ import annotations

import contextlib
import datetime
import re
import weakref
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel.distributed import _find_tensors

from tandem.strategies.environments import ClusterEnvironment
from tandem.strategies.layer_sync import TorchSyncBatchNorm
from tandem.strategies.parallel import ParallelStrategy
from tandem.strategies.precision import Precision
from tandem.strategies.registry import register_strategy
from tandem.strategies.strategy import CompiledSteps, StepForward
from tandem.utilities.compile import Compiler
from tandem.utilities.exceptions import TandemConfigError, out_of_range


class DDPStrategy(ParallelStrategy):
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
        sync_batchnorm: convert BatchNorm layers to SyncBatchNorm (CUDA only). None: the Trainer's
            ``sync_batchnorm`` (False by default).
        use_distributed_sampler: replace the samplers of the dataloaders as described in this module;
            False leaves them alone (shard the data yourself). None: the Trainer's
            ``use_distributed_sampler`` (True by default).
        start_method: "popen" (re-run the script), "spawn" or "fork" (torch.multiprocessing, per stage).
        cluster_environment: how each process learns its rank; None detects it (see
            :class:`~tandem.strategies.parallel.ParallelStrategy`).

    Example::

        trainer = Trainer(strategy=DDPStrategy(find_unused_parameters=True), accelerator="cpu", devices=2)
        trainer.fit(model)  # rank 0 runs this line; it starts rank 1 by re-running the script
    """

    name = "ddp"
    identical_replicas = True

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
        sync_batchnorm: bool | None = None,
        use_distributed_sampler: bool | None = None,
        start_method: str = "popen",
        collective_check_timeout: datetime.timedelta | None = datetime.timedelta(seconds=60),
        hang_timeout: datetime.timedelta | None = datetime.timedelta(minutes=5),
        cluster_environment: ClusterEnvironment | None = None,
    ) -> None:
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
            sync_batchnorm=sync_batchnorm,
        )
        if bucket_cap_mb is not None and not bucket_cap_mb > 0:
            raise out_of_range("bucket_cap_mb", bucket_cap_mb, "a positive number of MB, or None")
        self.ddp_kwargs: dict[str, Any] = {
            "find_unused_parameters": find_unused_parameters,
            "static_graph": static_graph,
            "gradient_as_bucket_view": gradient_as_bucket_view,
        }
        if bucket_cap_mb is not None:
            self.ddp_kwargs["bucket_cap_mb"] = bucket_cap_mb
        self.ddp_comm_hook = ddp_comm_hook
        self.ddp_comm_state = ddp_comm_state
        self._manual = False  # the module uses manual optimization (set when the module is wrapped)
        self._compiled_evaluation: CompiledSteps | None = None  # the step methods compiled, for evaluation

    def _check_configuration(self) -> None:
        super()._check_configuration()
        self._check_sync_batchnorm()

    def _check_sync_batchnorm(self) -> None:
        if self.sync_batchnorm and self.parallel_devices[0].type != "cuda":
            raise TandemConfigError(
                "sync_batchnorm=True needs CUDA devices (torch's SyncBatchNorm does not run on the CPU); "
                "on the CPU set sync_batchnorm=False (and leave TorchSyncBatchNorm() out of plugins)."
            )

    # ------------------------------------------------------------------ set-up
    def _wrap_module(self, module: nn.Module) -> nn.Module:
        if self.sync_batchnorm:  # checked in _configure()
            module = TorchSyncBatchNorm().apply(module)
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        step_forward = StepForward(module)
        model = DistributedDataParallel(step_forward, device_ids=device_ids, **self.ddp_kwargs)
        if self.ddp_comm_hook is not None:
            model.register_comm_hook(state=self.ddp_comm_state, hook=self.ddp_comm_hook)
        self._manual = not getattr(module, "automatic_optimization", True)
        if self._manual:  # the module calls backward inside its training_step: DDP must not prepare after it
            step_forward.register_forward_hook(_no_reduction_after_step(weakref.ref(model)))
        return model

    def _compile(self, compiler: Compiler) -> Callable[..., Any]:
        self._compiled_evaluation = CompiledSteps(self._module, compiler)  # evaluation steps do not run through DDP
        return super()._compile(compiler)

    def teardown(self) -> None:
        self._compiled_evaluation = None
        super().teardown()

    # ------------------------------------------------------------------ steps
    def run_step(self, method: str, *args: Any) -> Any:
        """Training steps run through DDP; evaluation steps call the module directly (ranks may have
        different numbers of evaluation batches, and DDP's forward is a collective)."""
        if method != "training_step" or not isinstance(self._model, DistributedDataParallel):
            evaluation = self._compiled_evaluation
            step = getattr(self._module, method) if evaluation is None else partial(evaluation, method)
            with self.precision.forward_context():
                return step(*args)
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


register_strategy("ddp", DDPStrategy, "one process per device; re-runs the script (or joins torchrun / srun)")
register_strategy("ddp_spawn", DDPStrategy, "one process per device, spawned per stage", start_method="spawn")
register_strategy(
    "ddp_fork",
    DDPStrategy,
    "one process per device, forked per stage (classes defined in __main__ work)",
    start_method="fork",
)
register_strategy(
    "ddp_notebook",
    DDPStrategy,
    "ddp_fork, for Jupyter: the notebook's own classes reach the ranks",
    start_method="fork",
)
register_strategy(
    "ddp_find_unused_parameters_true",
    DDPStrategy,
    "ddp for modules whose steps leave some parameters without a gradient (e.g. GANs with toggle_optimizer)",
    find_unused_parameters=True,
)
