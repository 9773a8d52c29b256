"""DistributedDataParallel: one process per device, gradients all-reduced in backward.

Environment, launchers, process group, collectives and data sharding come from
[`ParallelStrategy`][tandem.strategies.ParallelStrategy]; this module adds DDP's wrapper, its gradient
synchronisation and its error messages.

DDP follows the module. torch's wrapper averages the gradients of the parameters that required gradients when it
was built, and of those only when every one of them got a gradient in the step. tandem keeps that true when the
module changes under it:

- **the trainable set changes** (a ``BaseFinetuning`` unfreeze, a ``requires_grad_``, a head a callback adds in
  ``on_fit_start``): at the fit's start, each epoch's start, after an overridden ``on_train_batch_start``, and at
  the next step after a parameter was created anywhere (a global registration hook marks it: one flag read a step),
  [`DDPStrategy.follow_module`][tandem.strategies.DDPStrategy.follow_module] builds the wrapper again, which also
  broadcasts rank 0's parameters and buffers so every replica starts equal;
- **parameters get no gradient in a step** (a GAN toggling its optimizers, a target network outside the loss, a head
  trained by a callback's own optimizer): after each synced backward, one cheap check of DDP's reducer finds the
  reduction unfinished; the step's gradients are then averaged by hand (so the step is the one N processes should
  take), and the wrapper is built again: under manual optimization with ``find_unused_parameters=True``, under
  automatic optimization without those parameters, whose gradients are then averaged by a hook whenever a backward
  reaches them (inside the step or outside it, a callback's optimizer). ``DDPStrategy(find_unused_parameters=False)``
  given explicitly keeps the error, now naming the parameters.
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
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parallel.distributed import _find_tensors

from tandem.strategies.environments.cluster_environment import ClusterEnvironment
from tandem.strategies.layer_sync import TorchSyncBatchNorm
from tandem.strategies.parallel import ParallelStrategy
from tandem.strategies.precision import Precision
from tandem.strategies.registry import register_strategy
from tandem.strategies.steps import CompiledSteps, StepForward
from tandem.utilities.compile import Compiler
from tandem.utilities.exceptions import TandemConfigError, out_of_range
from tandem.utilities.rank_zero import rank_zero_info


class DDPStrategy(ParallelStrategy):
    """One process per device; torch's DistributedDataParallel all-reduces gradients in backward.

    ``strategy="ddp"`` starts the other ranks by re-running your script (this process becomes rank 0),
    unless torchrun or SLURM's srun already started them. Everything in the script runs on every rank,
    code after ``trainer.fit()`` included. ``strategy="ddp_spawn"`` spawns the ranks for the fit only and
    brings rank 0's weights, metrics and checkpoint paths back, for code that cannot be re-run.

    Args:
        devices: this node's devices, one process each (the Trainer's ``devices`` when None).
        precision: see [`Precision`][tandem.strategies.Precision].
        process_group_backend: "gloo" (CPU default), "nccl" (CUDA default), or another torch backend.
        timeout: how long a collective may wait for the other ranks before failing.
        find_unused_parameters: let DDP handle parameters that get no gradient in a step (slower). None (the
            default): off until a step leaves parameters without a gradient, then tandem takes care of them (see
            the module's docstring); False: such a step is an error naming them.
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
            [`ParallelStrategy`][tandem.strategies.ParallelStrategy]).

    Example:
        ```python
        trainer = Trainer(strategy=DDPStrategy(find_unused_parameters=True), accelerator="cpu", devices=2)
        trainer.fit(model)  # rank 0 runs this line; it starts rank 1 by re-running the script
        ```
    """

    name = "ddp"
    identical_replicas = True
    follows_module = True

    def __init__(
        self,
        devices: list[torch.device] | None = None,
        precision: str | Precision | None = None,
        process_group_backend: str | None = None,
        timeout: datetime.timedelta = datetime.timedelta(minutes=30),
        find_unused_parameters: bool | None = None,
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
        #: a step without gradients for some parameters is an error (``find_unused_parameters=False`` given)
        self._unused_is_error = find_unused_parameters is False
        self.ddp_kwargs: dict[str, Any] = {
            "find_unused_parameters": bool(find_unused_parameters),
            "static_graph": static_graph,
            "gradient_as_bucket_view": gradient_as_bucket_view,
        }
        if bucket_cap_mb is not None:
            self.ddp_kwargs["bucket_cap_mb"] = bucket_cap_mb
        self.ddp_comm_hook = ddp_comm_hook
        self.ddp_comm_state = ddp_comm_state
        self._manual = False  # the module uses manual optimization (set when the module is wrapped)
        self._compiled_evaluation: CompiledSteps | None = None  # the step methods compiled, for evaluation
        self._compiler: Compiler | None = None  # the torch.compile settings the module came with
        self._wrapped: frozenset[int] = frozenset()  # ids of the parameters trainable when the wrapper was built
        self._outside: dict[nn.Parameter, Any] = {}  # parameters left out of DDP -> their averaging hooks
        self._created = False  # a parameter was created somewhere since the last look (see follow_module)
        self._creations: Any = None  # the global parameter-registration hook that sets it

    def _check_configuration(self) -> None:
        super()._check_configuration()
        self._check_sync_batchnorm()

    def _check_sync_batchnorm(self) -> None:
        devices = self.parallel_devices
        assert devices is not None  # _configure sets them before this check
        if self.sync_batchnorm and devices[0].type != "cuda":
            raise TandemConfigError(
                "sync_batchnorm=True needs CUDA devices (torch's SyncBatchNorm does not run on the CPU); "
                "on the CPU set sync_batchnorm=False (and leave TorchSyncBatchNorm() out of plugins)."
            )

    # ------------------------------------------------------------------ set-up
    def _wrap_module(self, module: nn.Module) -> nn.Module:
        if self.sync_batchnorm:  # checked in _configure()
            module = TorchSyncBatchNorm().apply(module)
        if self._creations is None:
            self._creations = nn.modules.module.register_module_parameter_registration_hook(
                _mark_created(weakref.ref(self))
            )
        return self._ddp(module)

    def _ddp(self, module: nn.Module) -> DistributedDataParallel:
        """DDP over ``module``'s trainable parameters (as they are outside ``toggle_optimizer``), less those left to
        the averaging hooks; building it broadcasts rank 0's parameters and buffers."""
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        step_forward = StepForward(module)
        outside = {id(p) for p in self._outside}
        ignored = [f"module.{name}" for name, p in module.named_parameters() if id(p) in outside]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(step_forward, ignored)
        with _untoggled(module):  # a re-wrap inside a GAN's toggled step still takes both networks
            self._wrapped = _trainable(module)
            model = DistributedDataParallel(step_forward, device_ids=device_ids, **self.ddp_kwargs)
        if self.ddp_comm_hook is not None:
            model.register_comm_hook(state=self.ddp_comm_state, hook=self.ddp_comm_hook)
        self._manual = not getattr(module, "automatic_optimization", True)
        if self._manual:  # the module calls backward inside its training_step: DDP must not prepare after it
            step_forward.register_forward_hook(_no_reduction_after_step(weakref.ref(model)))
        return model

    def _compile(self, compiler: Compiler) -> Callable[..., Any]:
        self._compiler = compiler
        self._compiled_evaluation = CompiledSteps(self.module, compiler)  # evaluation steps do not run through DDP
        return super()._compile(compiler)

    def teardown(self) -> None:
        self._compiled_evaluation = self._compiler = None
        for handle in self._outside.values():
            handle.remove()
        self._outside = {}
        if self._creations is not None:
            self._creations.remove()
            self._creations = None
        super().teardown()

    # ------------------------------------------------------------------ following the module
    def follow_module(self, only_if_created: bool = False) -> None:
        """At a step boundary: if the trainable parameters are no longer those the wrapper was built for (an
        unfreeze, a freeze, a layer added), build it again. One pass over the parameter list, nothing more when the
        set is unchanged; ``only_if_created`` (every step): only when a parameter was created since the last look,
        else one flag read."""
        if only_if_created and not self._created:
            return
        self._created = False
        if not isinstance(self._model, DistributedDataParallel):
            return
        module = self.module
        now = _trainable(module)
        if now == self._wrapped:
            return
        gained, lost = now - self._wrapped, self._wrapped - now
        added = [n for n, p in module.named_parameters() if id(p) in gained]
        dropped = [n for n, p in module.named_parameters() if id(p) in lost]
        for param in [p for p in self._outside if id(p) not in now]:  # frozen or gone: no more averaging
            self._outside.pop(param).remove()
        self._rewrap(_changed(added, dropped))

    def _rewrap(self, why: str) -> None:
        """Build the DDP wrapper again (and its compiled form), saying why on rank 0."""
        old = self._model
        self._model = self._ddp(self.module)
        if self._compiler is not None:
            self._compiled = super()._compile(self._compiler)
        if isinstance(old, DistributedDataParallel):
            old.reducer._remove_autograd_hooks()  # the old wrapper may live on until its forward returns
        rank_zero_info(f"[tandem] DDP's wrapper was built again: {why}.")

    def _finish_reduction(self) -> None:
        """After a synced backward that left DDP's reduction unfinished (some trainable parameters got no
        gradient): average every gradient by hand, so the optimizer step that follows is the one N processes
        should take, then build the wrapper again so the next steps need no rescue (see the module docstring)."""
        params = [p for p in self.module.parameters() if id(p) in self._wrapped]
        have = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=self.root_device)
        dist.all_reduce(have)  # a gradient on any rank: averaged, zeros where a rank has none
        world, counts = dist.get_world_size(), have.tolist()
        grads: list[torch.Tensor] = []
        for param, count in zip(params, counts):
            if not count:
                continue
            grad = param.grad
            if grad is None:
                grad = param.grad = torch.zeros_like(param)
            grads.append(grad)
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat.div_(world)
            offset = 0
            for grad in grads:
                grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
                offset += grad.numel()
        names = {id(p): n for n, p in self.module.named_parameters()}
        missing = [p for p, count in zip(params, counts) if not count]
        if self._manual:
            self.ddp_kwargs["find_unused_parameters"] = True
            how = (
                "with find_unused_parameters=True: each manual_backward now searches the graph for the parameters "
                "it reaches (toggle_optimizer leaves the other networks without gradients)"
            )
        else:
            for param in missing:
                self._outside[param] = param.register_post_accumulate_grad_hook(_average_gradient)
            how = (
                "without them; their gradients are averaged by a hook of their own whenever a backward reaches them "
                "(a callback's optimizer, a later step), and nothing is done for them otherwise"
            )
        which = ", ".join(names[id(p)] for p in missing) or "(none on every rank)"
        self._rewrap(
            f"a training step left parameters without a gradient on every rank ({which}); the step's "
            f"gradients were averaged by hand, and DDP now runs {how}"
        )

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

    def before_evaluation(self, fitting: bool) -> None:
        """Lightning's validation inside ``fit`` runs its steps through the DDP wrapper, whose first forward after a
        training step (``broadcast_buffers``) gives every rank rank 0's buffers (a BatchNorm's running statistics),
        and leaves the next training forward without that broadcast. tandem's evaluation steps call the module (the
        ranks' batch counts may differ): the same broadcast happens here, once per pass. ``validate`` / ``test`` /
        ``predict`` on their own: each rank keeps its buffers, as in Lightning (no wrapper there)."""
        model = self._model
        if not fitting or not isinstance(model, DistributedDataParallel) or not model.will_sync_module_buffers():
            return
        self._check("evaluation buffers")
        model._sync_buffers()  # torch's own broadcast (coalesced, from rank 0), as its forward calls it
        model.require_forward_param_sync = False  # as the no-grad forward leaves it

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
        if isinstance(model, DistributedDataParallel) and not model.find_unused_parameters:
            try:  # one call into the reducer: raises only when the step's reduction did not finish
                model.reducer._check_reducer_finalized()
            except RuntimeError as err:
                if self._unused_is_error or model.gradient_as_bucket_view:
                    raise self._explain(err, self._no_gradient()) from err
                self._finish_reduction()

    def _no_gradient(self) -> list[str]:
        """The wrapped parameters that got no gradient in this process's step (a failed step only)."""
        return [n for n, p in self.module.named_parameters() if id(p) in self._wrapped and p.grad is None]

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool) -> Iterator[None]:
        model = module if isinstance(module, DistributedDataParallel) else self._model
        if enabled and isinstance(model, DistributedDataParallel):
            with model.no_sync():
                yield
        else:
            yield

    def _explain(self, err: RuntimeError, unused: list[str] | None = None) -> RuntimeError:
        """DDP's "Expected to have finished reduction" error, told with the unused parameters' names."""
        text = str(err)
        if "Expected to have finished reduction" not in text:
            return err
        if not unused:
            names = [n for n, p in self.module.named_parameters() if p.requires_grad]
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
            "DDPStrategy(find_unused_parameters=True) (strategy='ddp_find_unused_parameters_true'), leave "
            "find_unused_parameters unset (tandem then takes care of them; not with gradient_as_bucket_view=True), "
            "or remove or freeze (requires_grad=False) those parameters."
        )


def _trainable(module: nn.Module) -> frozenset[int]:
    """The ids of ``module``'s parameters that take gradients, as outside ``toggle_optimizer``."""
    saved = getattr(module, "_param_requires_grad_state", None) or {}
    return frozenset(id(p) for p in module.parameters() if saved.get(p, p.requires_grad))


@contextlib.contextmanager
def _untoggled(module: nn.Module) -> Iterator[None]:
    """``requires_grad`` as outside ``toggle_optimizer`` for the block (DDP takes the parameters that require it)."""
    saved = getattr(module, "_param_requires_grad_state", None) or {}
    toggled = {p: p.requires_grad for p in saved if p.requires_grad != saved[p]}
    for param in toggled:
        param.requires_grad = saved[param]
    try:
        yield
    finally:
        for param, flag in toggled.items():
            param.requires_grad = flag


def _changed(added: list[str], dropped: list[str]) -> str:
    parts = []
    if added:
        parts.append(
            f"{len(added)} parameter(s) now take gradients ({', '.join(added[:4])}{', ...' if len(added) > 4 else ''})"
        )
    if dropped:
        parts.append(f"{len(dropped)} no longer do ({', '.join(dropped[:4])}{', ...' if len(dropped) > 4 else ''})")
    return "the trainable parameters changed: " + "; ".join(parts) + "; rank 0's parameters were broadcast"


def _mark_created(strategy_ref: Callable[[], DDPStrategy | None]) -> Callable[..., None]:
    """The global parameter-registration hook: marks that a parameter was created (a layer built by a callback or a
    hook), so the next step boundary looks at the trainable set."""

    def hook(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        strategy = strategy_ref()
        if strategy is not None:
            strategy._created = True

    return hook


def _average_gradient(param: nn.Parameter) -> None:
    """A parameter DDP does not own: its gradient, accumulated by this backward, averaged over the ranks (every rank
    runs the same backwards). Averaging is linear, so gradients accumulated over several backwards stay right."""
    grad = param.grad
    assert grad is not None  # the hook runs after its accumulation
    dist.all_reduce(grad)
    grad.div_(dist.get_world_size())


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
register_strategy(
    "ddp_find_unused_parameters_false",
    DDPStrategy,
    "ddp where a step that leaves parameters without a gradient is an error naming them (no rescue)",
    find_unused_parameters=False,
)
