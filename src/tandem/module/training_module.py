"""TrainingModule: a model together with how to train, evaluate and optimize it (Lightning's ``LightningModule``)."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast, overload

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn

from tandem.module.export import export_onnx, export_torchscript
from tandem.module.hooks import DataHooks, logs_per_step
from tandem.module.hyperparameters import AttributeDict, HyperparametersMixin
from tandem.module.loading import load_module
from tandem.strategies.strategy import CLIP_ALGORITHMS
from tandem.utilities.exceptions import (
    TandemConfigError,
    TandemUserCodeError,
    bad_choice,
)
from tandem.utilities.logged_values import CURRENT_HOOK
from tandem.utilities.rank_zero import rank_zero_print, rank_zero_warn

if TYPE_CHECKING:
    from typing import TypeAlias

    from torch.optim import Optimizer
    from torchmetrics import Metric
    from typing_extensions import Self

    from tandem.callbacks.callback import Callback
    from tandem.loggers.logger import Logger
    from tandem.trainer.optim import LRSchedulerTypeUnion, OptimizerLRScheduler, TrainingOptimizer
    from tandem.trainer.trainer import Trainer

#: what a step returns (Lightning's ``STEP_OUTPUT``): the loss (a scalar tensor), a dict with ``"loss"``, or None
STEP_OUTPUT: TypeAlias = torch.Tensor | Mapping[str, Any] | None


class _ClassOnly:
    """A classmethod that refuses to be called on an instance (Lightning's ``_restricted_classmethod``).

    ``model.load_from_checkpoint(path)`` builds and returns a *new* module and leaves ``model`` as it was; the
    call on an instance is nearly always the mistake of expecting ``model`` to change, so it raises a TypeError
    naming the fix. Reading the attribute (``inspect.signature(model.load_from_checkpoint)``) still works.
    """

    def __init__(self, func: Callable[..., Any]) -> None:
        self.__func__ = func
        # the descriptor takes the function's name, docstring and __wrapped__ (it is not itself called)
        functools.update_wrapper(cast("Callable[..., Any]", self), func)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        owner = type(instance) if owner is None else owner
        bound = self.__func__.__get__(owner, type(owner))  # as classmethod binds it
        if instance is None:
            return bound

        @functools.wraps(self.__func__)
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise TypeError(_instance_call_message(owner, self.__func__.__name__))

        return refuse


if TYPE_CHECKING:  # type checkers read it as what it is on the class, a classmethod (``Model.load_from_checkpoint``)
    class_only = classmethod
else:
    class_only = _ClassOnly


def _instance_call_message(cls: type, method: str) -> str:
    name, module = cls.__name__, issubclass(cls, TrainingModule)
    fix = f"Call it on the class and keep what it returns: `{'model' if module else 'datamodule'} = {name}.{method}(path)`"
    if module:
        fix += ', or load the weights into this instance: `model.load_state_dict(torch.load(path)["state_dict"])`'
    return (
        f"{name}.{method} was called on an instance: it is a classmethod that returns a new {name} and leaves the "
        f"instance unchanged, so the loaded state would be lost. {fix}."
    )


def changed_too_late(module: nn.Module, automatic: bool) -> str:
    """The sentence an error about the optimization mode adds when the fit runs in mode ``automatic`` but the
    module's ``automatic_optimization`` says the other now: it was changed after the fit chose its mode (and in which
    hook); else ""."""
    if not isinstance(module, TrainingModule) or module.automatic_optimization == automatic:
        return ""
    where = module.__dict__.get("_mode_set_in")
    return (
        f" self.automatic_optimization was set to {module.automatic_optimization}"
        + (f" in {where}" if where else "")
        + f", after this fit had started in {'automatic' if automatic else 'manual'} optimization: the Trainer "
        "reads it once, when the fit starts (before configure_optimizers), so the change came too late."
    )


def _weights_loaded(module: nn.Module, incompatible_keys: Any) -> None:
    """``load_state_dict`` on a TrainingModule (a post-hook: ``load_from_checkpoint`` and the Trainer's restores pass
    here too): its weights are no longer the ones it was built with."""
    if isinstance(module, TrainingModule):
        module._note_weights_from("load_state_dict")


class TrainingModule(HyperparametersMixin, DataHooks, nn.Module):
    """A model together with how to train, evaluate and optimize it (Lightning's ``LightningModule``).

    Override ``training_step`` and ``configure_optimizers``; the rest is optional. Hooks run on every
    process; ``self.log`` collects values and the Trainer routes them to loggers on rank zero.

    Set ``self.automatic_optimization = False`` to step the optimizers yourself in ``training_step``
    (GANs, several optimizers): ``self.optimizers()``, ``self.manual_backward(loss)``, ``opt.step()``.

    Example:
        ```python
        class Classifier(TrainingModule):
            def __init__(self, lr: float = 0.1):
                super().__init__()
                self.save_hyperparameters()
                self.net = nn.Linear(32, 10)

            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = F.cross_entropy(self.net(x), y)
                self.log("train_loss", loss, prog_bar=True)
                return loss

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        ```
    """

    #: run ``prepare_data`` on local rank 0 of every node (False: on global rank 0 only)
    prepare_data_per_node: bool = True
    #: ``ckpt_path`` restores demand that every saved key fit the module (False: missing / unexpected keys are skipped)
    strict_loading: bool = True
    #: an example input (a tensor, or a tuple of them) for ``to_torchscript`` / ``to_onnx`` and graph logging
    example_input_array = None  # (not annotated: TorchScript reads class annotations)

    #: properties TorchScript must not compile (they read the Trainer), as Lightning lists its own
    __jit_unused_properties__ = [
        "hparams",
        "hparams_initial",
        "_trainer",
        "automatic_optimization",
        "trainer",
        "device",
        "dtype",
        "on_gpu",
        "logger",
        "loggers",
        "global_rank",
        "local_rank",
        "current_epoch",
        "global_step",
    ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer = None
        self._hparams: AttributeDict = AttributeDict()
        self._log_hyperparams = False  # True once save_hyperparameters() asks for the loggers
        self._automatic_optimization = True
        self._param_requires_grad_state: dict[nn.Parameter, bool] = {}
        self.register_load_state_dict_post_hook(_weights_loaded)  # trainer.test says when it tests built weights

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_trainer_ref"] = None  # pickled for spawned processes or deep copies: never drag the Trainer along
        return state

    @property
    def _trainer(self) -> Trainer | None:
        """The Trainer running this module, or None. Held weakly: the Trainer holds the module (``trainer.test()``
        after ``fit`` reuses it), and a reference back would make a cycle that only Python's garbage collector
        frees, keeping the module's memory after a finished fit."""
        ref = self.__dict__.get("_trainer_ref")
        return None if ref is None else ref()

    @_trainer.setter
    def _trainer(self, trainer: Trainer | None) -> None:
        self.__dict__["_trainer_ref"] = None if trainer is None else weakref.ref(trainer)

    # ------------------------------------------------------------------ the user's steps
    @logs_per_step
    def training_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        """``training_step(self, batch, batch_idx)``: return the loss (a scalar tensor), a dict with ``"loss"``, or
        None to skip this batch. ``batch_idx`` may be left out (``training_step(self, batch)``).

        With manual optimization, do the backward and the steps here; the return value is optional. (Declared with
        ``*args`` as Lightning declares it, so that an override with any of these signatures type-checks.)
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no training_step. Define training_step(self, batch, batch_idx) "
            "returning the loss to use Trainer.fit."
        )

    def validation_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        """``validation_step(self, batch, batch_idx)``: compute and ``self.log`` validation metrics for one batch.
        ``dataloader_idx`` is passed only when there are several validation loaders (declare it as
        ``dataloader_idx=0``)."""
        return None

    def test_step(self, *args: Any, **kwargs: Any) -> STEP_OUTPUT:
        """``test_step(self, batch, batch_idx)``: compute and ``self.log`` test metrics for one batch
        (``dataloader_idx`` as in ``validation_step``)."""
        return None

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """``predict_step(self, batch, batch_idx, dataloader_idx=0)``: return the prediction for one batch; the
        default calls ``self(batch)`` on the inputs."""
        batch = args[0] if args else kwargs["batch"]
        if isinstance(batch, (list, tuple)) and len(batch) > 0:
            batch = batch[0]
        return self(batch)

    def configure_model(self) -> None:
        """Build layers late, at the start of every stage, on the device and once the processes exist (a
        sharding strategy may call ``fully_shard`` on them here). Runs once per stage: make it idempotent
        (``if self.layers is not None: return``)."""

    def configure_optimizers(self) -> OptimizerLRScheduler:
        """Return an optimizer, ``{"optimizer": opt, "lr_scheduler": scheduler or {"scheduler": ...,
        "interval": "epoch" | "step", "frequency": 1, "monitor": "val_loss"}, "monitor": ...}``, a list of
        optimizers, ``([optimizers], [schedulers])`` or a list of such dicts. Several optimizers need manual
        optimization."""
        raise NotImplementedError(
            f"{type(self).__name__} has no configure_optimizers. Define it to return an optimizer, e.g. "
            "torch.optim.Adam(self.parameters(), lr=1e-3)."
        )

    def configure_callbacks(self) -> Sequence[Callback] | Callback:
        """Callbacks this module needs (a callback or a list), added to the Trainer's at every run; one whose
        class is (a subclass of) a Trainer callback's replaces it, as in Lightning."""
        return []

    # ------------------------------------------------------------------ optimization
    @property
    def automatic_optimization(self) -> bool:
        """False: ``training_step`` steps the optimizers itself (``self.optimizers()``, ``manual_backward``)."""
        return self.__dict__.get("_automatic_optimization", True)

    @automatic_optimization.setter
    def automatic_optimization(self, value: bool) -> None:
        self.__dict__["_automatic_optimization"] = bool(value)
        if self._trainer is not None:  # set while a Trainer runs the module: remember in which hook (a late change)
            self._note_mode_set_in(CURRENT_HOOK.get())

    def _note_mode_set_in(self, where: str | None) -> None:
        """Record where ``automatic_optimization`` was last set while a Trainer ran this module (a hook; the Trainer
        names ``configure_optimizers``, which it calls outside the hooks), for the errors of a change that came
        after the fit chose its mode."""
        self.__dict__["_mode_set_in"] = where

    @overload
    def optimizers(self, use_pl_optimizer: Literal[True] = True) -> TrainingOptimizer | list[TrainingOptimizer]: ...
    @overload
    def optimizers(self, use_pl_optimizer: Literal[False]) -> Optimizer | list[Optimizer]: ...
    @overload
    def optimizers(
        self, use_pl_optimizer: bool
    ) -> TrainingOptimizer | list[TrainingOptimizer] | Optimizer | list[Optimizer]: ...
    def optimizers(
        self, use_pl_optimizer: bool = True
    ) -> TrainingOptimizer | list[TrainingOptimizer] | Optimizer | list[Optimizer]:
        """The optimizers from ``configure_optimizers``: one, or a list when there are several.

        Each is wrapped so that ``step()`` goes through the strategy's precision (the float16 scaler) and
        counts toward ``trainer.global_step``; ``use_pl_optimizer=False`` gives the torch optimizers.

        Example:
            ```python
            opt = self.optimizers()  # manual optimization, one optimizer
            assert not isinstance(opt, list)  # a type checker then knows it is one optimizer
            ```
        """
        optimization = self.trainer.fit_loop.optimization
        if use_pl_optimizer:
            wrapped = optimization.training_optimizers
            return wrapped[0] if len(wrapped) == 1 else list(wrapped)
        found = optimization.optimizers
        return found[0] if len(found) == 1 else list(found)

    def lr_schedulers(self) -> LRSchedulerTypeUnion | list[LRSchedulerTypeUnion] | None:
        """The schedulers from ``configure_optimizers``: None, one, or a list. Step them yourself under manual
        optimization."""
        schedulers = [config.scheduler for config in self.trainer.lr_scheduler_configs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``loss.backward(*args, **kwargs)`` through the strategy: float16 loss scaling and DDP's gradient
        all-reduce, with the ``on_before_backward`` / ``on_after_backward`` hooks. Manual optimization only."""
        trainer = self.trainer
        if trainer.fit_loop.optimization.automatic:
            raise TandemUserCodeError(
                "manual_backward is for manual optimization, and this fit runs automatic optimization."
                f"{changed_too_late(self, automatic=True)} Set self.automatic_optimization = False in __init__, "
                "or return the loss from training_step and let the Trainer call backward."
            )
        trainer.call_hook("on_before_backward", loss)
        trainer.fit_loop.optimization.backward(loss, *args, **kwargs)  # the strategy's (timed when profiling)
        trainer.call_hook("on_after_backward")

    def toggle_optimizer(self, optimizer: Optimizer | TrainingOptimizer) -> None:
        """Let only ``optimizer``'s parameters take gradients (the others' ``requires_grad`` is set False until
        [`untoggle_optimizer`][tandem.TrainingModule.untoggle_optimizer]), so each loss of a GAN reaches only the
        network it trains."""
        state: dict[nn.Parameter, bool] = {}
        for opt in self.trainer.optimizers:
            for group in opt.param_groups:
                for param in group["params"]:
                    if param not in state:
                        state[param] = param.requires_grad
                        param.requires_grad = False
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.requires_grad = state[param]
        self._param_requires_grad_state = state

    def untoggle_optimizer(self, optimizer: Optimizer | TrainingOptimizer) -> None:
        """Restore the ``requires_grad`` flags that [`toggle_optimizer`][tandem.TrainingModule.toggle_optimizer]
        changed."""
        inner = getattr(optimizer, "optimizer", optimizer)
        for opt in self.trainer.optimizers:
            if opt is inner:
                continue
            for group in opt.param_groups:
                for param in group["params"]:
                    if param in self._param_requires_grad_state:
                        param.requires_grad = self._param_requires_grad_state[param]
        self._param_requires_grad_state = {}

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: Optimizer | TrainingOptimizer) -> Iterator[None]:
        """[`toggle_optimizer`][tandem.TrainingModule.toggle_optimizer] for the block,
        [`untoggle_optimizer`][tandem.TrainingModule.untoggle_optimizer] after it (even on error)."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def clip_gradients(
        self,
        optimizer: Optimizer | TrainingOptimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip ``optimizer``'s gradients by total norm (``"norm"``) or elementwise (``"value"``).

        Float16 gradients are unscaled first. Without arguments, the Trainer's ``gradient_clip_val`` and
        ``gradient_clip_algorithm`` apply; giving a different value than the Trainer's is an error.
        """
        trainer = self.trainer
        value, algorithm = _resolve_clipping(
            gradient_clip_val, gradient_clip_algorithm, trainer.gradient_clip_val, trainer.gradient_clip_algorithm
        )
        if not value:
            return
        inner = cast("Optimizer", getattr(optimizer, "optimizer", optimizer))  # a TrainingOptimizer's torch optimizer
        trainer.strategy.precision.unscale_gradients(inner)
        trainer.strategy.clip_gradients(inner, value, algorithm)
        optimization = trainer.fit_loop.optimization
        if not optimization.automatic:  # changed in place, not zeroed: a later missing zero_grad is still seen
            optimization.gradients_changed(inner)

    @logs_per_step
    def configure_gradient_clipping(
        self, optimizer: Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> None:
        """Called before each optimizer step (automatic optimization) with the Trainer's clipping settings.
        Override to clip your own way; the default calls [`clip_gradients`][tandem.TrainingModule.clip_gradients]."""
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    @logs_per_step
    def optimizer_step(
        self,
        epoch: int,
        batch_idx: int,
        optimizer: Optimizer | TrainingOptimizer,
        optimizer_closure: Callable[[], Any] | None = None,
    ) -> None:
        """Step ``optimizer`` (automatic optimization). ``optimizer_closure`` runs ``training_step`` and
        backward: call ``optimizer.step(closure=optimizer_closure)``. Override to add warm-up or a schedule
        of your own (tandem calls the override only when there is one)."""
        optimizer.step(closure=optimizer_closure)

    @logs_per_step
    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Optimizer) -> None:
        """Clear the gradients after each optimizer step (automatic optimization)."""
        optimizer.zero_grad()

    def lr_scheduler_step(self, scheduler: Any, metric: Any | None) -> None:
        """Step one scheduler: ``scheduler.step()``, or ``scheduler.step(metric)`` for a monitored one. (``scheduler``
        is typed ``Any``: an override steps a scheduler that is not torch's, e.g. timm's, in its own way.)"""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    # ------------------------------------------------------------------ logging
    def log(
        self,
        name: str,
        value: torch.Tensor | float | Metric,
        *,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        prog_bar: bool = False,
        logger: bool = True,
        sync_dist: bool = False,
        reduce_fx: str | Callable[..., Any] = "mean",
        batch_size: int | None = None,
        rank_zero_only: bool = False,
        add_dataloader_idx: bool = True,
        metric_attribute: str | None = None,
    ) -> None:
        """Record a metric. Floats, scalar tensors and torchmetrics ``Metric`` objects are accepted.

        Args:
            name: key in ``trainer.callback_metrics`` and in the loggers.
            value: the value; a ``Metric`` is computed (and synchronised by torchmetrics) at epoch end.
            on_step / on_epoch: log every step / the epoch's aggregate. Defaults: step in training
                hooks, epoch in evaluation and epoch-end hooks. Both: keys ``name_step`` and ``name_epoch``.
            prog_bar: show in the progress bar.
            logger: send to the loggers.
            sync_dist: reduce across processes (by sums and counts, then divide). Epoch values are
                reduced once per epoch; in evaluation, step values stay per process (ranks see
                different numbers of batches there, so a per-step collective could never complete).
            reduce_fx: how the epoch value combines the steps': ``"mean"`` (weighted by batch size), ``"sum"``,
                ``"max"`` or ``"min"``, as Lightning reads them: in any case, ``"avg"`` for ``"mean"``, or as
                ``torch.mean`` / ``torch.sum`` / ``torch.max`` / ``torch.min`` or the builtins ``sum`` / ``max`` /
                ``min``. For another reduction, log a torchmetrics ``Metric``.
            batch_size: weight for the epoch mean; inferred from the batch when omitted.
            rank_zero_only: the call is made on rank 0 only (the value is never reduced across processes).
            add_dataloader_idx: with several evaluation loaders, name the value ``name/dataloader_idx_N``.
            metric_attribute: the module attribute that holds a logged torchmetrics ``Metric``; needed only when
                the logged object is not one of the module's submodules (found by itself otherwise). A ``Metric``
                that is neither is refused: the module would not move it to its device nor save it.
        """
        ref = self.__dict__.get("_trainer_ref")  # self._trainer, inline: this runs for every logged value
        trainer = None if ref is None else ref()
        if trainer is None:  # outside a Trainer run (e.g. a unit test calling training_step): nothing to collect
            _warn_log_without_trainer(name)
            return
        trainer.metric_collector.log(
            name,
            value,
            on_step,
            on_epoch,
            prog_bar,
            logger,
            sync_dist,
            reduce_fx,
            batch_size,
            rank_zero_only,
            add_dataloader_idx,
            metric_attribute,
        )  # positional: this runs every step

    def log_dict(
        self,
        values: Mapping[str, torch.Tensor | float | Metric],
        *,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        prog_bar: bool = False,
        logger: bool = True,
        sync_dist: bool = False,
        reduce_fx: str | Callable[..., Any] = "mean",
        batch_size: int | None = None,
        rank_zero_only: bool = False,
        add_dataloader_idx: bool = True,
        metric_attribute: str | None = None,
    ) -> None:
        """``self.log`` for each item, with the same options."""
        for name, value in values.items():
            self.log(
                name,
                value,
                on_step=on_step,
                on_epoch=on_epoch,
                prog_bar=prog_bar,
                logger=logger,
                sync_dist=sync_dist,
                reduce_fx=reduce_fx,
                batch_size=batch_size,
                rank_zero_only=rank_zero_only,
                add_dataloader_idx=add_dataloader_idx,
                metric_attribute=metric_attribute,
            )

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once, on global rank 0."""
        rank_zero_print(*args, **kwargs)

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Gather tensors (or numbers, or collections of them) from every process: each tensor gets a new
        dim 0 of size ``world_size`` (with one process, the data comes back unchanged). Every process must
        call it with the same shapes."""
        if group is not None:
            raise TandemConfigError(
                "self.all_gather(group=...) is not supported by tandem; gather over all processes, or call "
                "torch.distributed.all_gather_into_tensor on your group."
            )
        trainer = self.trainer
        device = self.device
        data = apply_to_collection(data, (int, float), lambda v: torch.tensor(v, device=device))
        if trainer.world_size == 1:
            return data
        if sync_grads:  # gradients flow back to every rank's input (torch.distributed.nn's differentiable gather)
            return apply_to_collection(data, torch.Tensor, _gather_with_grads)
        return apply_to_collection(data, torch.Tensor, trainer.strategy.all_gather)

    def freeze(self) -> None:
        """No parameter takes gradients, and the module is in eval mode."""
        for param in self.parameters():
            param.requires_grad = False
        self.eval()

    def unfreeze(self) -> None:
        """Every parameter takes gradients again, and the module is in train mode."""
        for param in self.parameters():
            param.requires_grad = True
        self.train()

    # ------------------------------------------------------------------ export
    @torch.no_grad()
    def to_torchscript(
        self,
        file_path: str | os.PathLike | None = None,
        method: str = "script",
        example_inputs: Any = None,
        **kwargs: Any,
    ) -> Any:
        """The module compiled to TorchScript (in eval mode; the module's mode is restored), saved to ``file_path``
        when given, as Lightning's.

        Args:
            file_path: where to ``torch.jit.save`` it (None: do not save).
            method: ``"script"`` (``torch.jit.script``) or ``"trace"`` (``torch.jit.trace`` over ``example_inputs``,
                default ``self.example_input_array``).
            example_inputs: the inputs to trace with.
            kwargs: passed to ``torch.jit.script`` / ``torch.jit.trace``.
        """
        return export_torchscript(self, file_path, method, example_inputs, **kwargs)

    @torch.no_grad()
    def to_onnx(self, file_path: str | os.PathLike, input_sample: Any = None, **kwargs: Any) -> None:
        """Export the module to ONNX at ``file_path`` with ``torch.onnx.export`` (eval mode; the module's mode is
        restored), as Lightning's. Needs the ``onnx`` package (and ``onnxscript`` for torch's default exporter).

        Args:
            file_path: the ``.onnx`` file to write.
            input_sample: the inputs to export with (default ``self.example_input_array``).
            kwargs: passed to ``torch.onnx.export``.
        """
        export_onnx(self, file_path, input_sample, **kwargs)

    # ------------------------------------------------------------------ loading
    def _has_own_weights(self) -> bool:
        """Whether this module's weights came from somewhere: a fit, a checkpoint or ``load_state_dict`` (else they
        are the ones it was built with)."""
        return self.__dict__.get("_weights_from") is not None

    def _note_weights_from(self, source: str) -> None:
        """The module's weights now come from ``source`` ("fit", "load_state_dict")."""
        self.__dict__["_weights_from"] = source

    @class_only
    def load_from_checkpoint(
        cls,
        checkpoint_path: str | os.PathLike,
        map_location: str | torch.device | None = None,
        strict: bool = True,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> Self:
        """A module rebuilt from a checkpoint: ``cls(**saved hparams, **kwargs)`` with the saved weights.

        Args:
            checkpoint_path: a file written by the Trainer (``ModelCheckpoint``, ``trainer.save_checkpoint``).
            map_location: the device to put the module on (default: the CPU).
            strict: the saved weights must match the module's parameters and buffers exactly.
            weights_only: ``False`` says the file is trusted: it is unpickled in full, which can run any code it
                holds (needed only for files of other programs or of earlier tandem versions). ``None`` (default)
                or ``True``: read as tensors and plain data only, as tandem writes it; a file holding anything
                else is refused, naming what it holds.
            kwargs: ``__init__`` arguments that replace saved ones, or that were not saved
                (``save_hyperparameters(ignore=[...])``, or added to ``__init__`` since). A saved hyperparameter
                that ``__init__`` no longer takes (a renamed argument) is an error while an argument would fall
                back to its default: pass that argument (``hidden_dim=...``), and the old saved name is left out.

        Example:
            ```python
            model = Classifier.load_from_checkpoint("runs/.../checkpoints/last.ckpt")
            model.eval()
            with torch.no_grad():
                prediction = model(x)
            ```
        """
        return load_module(cls, checkpoint_path, map_location, strict, weights_only, kwargs)

    # ------------------------------------------------------------------ read-only views of the run
    @property
    def trainer(self) -> Trainer:
        """The Trainer running this module, or the one of its latest run while that Trainer exists (the module
        refers to it weakly, so that a finished fit's memory is freed as soon as both go out of scope)."""
        trainer = self._trainer
        if trainer is None:
            if self.__dict__.get("_jit_is_scripting", False):  # scripting reads every property: it gets None
                return None  # type: ignore[return-value]  # only TorchScript's compiler, never a user, reads this None
            raise RuntimeError(
                f"{type(self).__name__} is not attached to a Trainer: call trainer.fit(model) first, and keep the "
                "Trainer while you use model.trainer (the module does not keep it alive)."
            )
        return trainer

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        """Attach the module, and the ``TrainingModule`` modules inside it, to ``trainer`` (Lightning's setter; a run
        attaches its module itself). The module refers to it weakly, as above."""
        for child in self.children():
            if isinstance(child, TrainingModule):
                child.trainer = trainer
        self._trainer = trainer

    @property
    def device(self) -> torch.device:
        for parameter in self.parameters():
            return parameter.device
        for module in self.modules():  # a DataParallel replica keeps its parameters here
            for former in getattr(module, "_former_parameters", {}).values():
                return former.device
        for buffer in self.buffers():
            return buffer.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The floating-point type of the module's parameters (``torch.get_default_dtype()`` without any)."""
        for tensor in itertools.chain(self.parameters(), self.buffers()):
            if tensor.is_floating_point():
                return tensor.dtype
        return torch.get_default_dtype()

    @property
    def on_gpu(self) -> bool:
        """The module's parameters are on a CUDA device."""
        return self.device.type == "cuda"

    @property
    def logger(self) -> Logger | None:
        """The Trainer's first logger (None without a Trainer or logger)."""
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self) -> list[Logger]:
        return self._trainer.loggers if self._trainer is not None else []

    @property
    def global_rank(self) -> int:
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        return self._trainer.local_rank if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer is not None else 0

    # ------------------------------------------------------------------ hooks (all optional)
    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    @logs_per_step
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        """Return -1 to skip the rest of this epoch (Lightning's)."""
        return None

    @logs_per_step
    def on_train_batch_end(self, outputs: STEP_OUTPUT, batch: Any, batch_idx: int) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(
        self, outputs: STEP_OUTPUT, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(self, outputs: STEP_OUTPUT, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Lightning's hook for the backward pass the Trainer runs (automatic optimization) and
        ``manual_backward``: ``loss.backward(*args, **kwargs)``. Override it to run the backward otherwise (e.g.
        ``loss.backward(retain_graph=True)``); under float16 scaling ``loss`` is already scaled."""
        loss.backward(*args, **kwargs)

    @logs_per_step
    def on_before_backward(self, loss: torch.Tensor) -> None: ...
    @logs_per_step
    def on_after_backward(self) -> None: ...
    @logs_per_step
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...
    @logs_per_step
    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...

    # ------------------------------------------------------------------ the module's mode around an evaluation
    # The loops record every submodule's ``training`` flag before an evaluation and give each its own back after it
    # (a frozen BatchNorm stays in eval mode); the fit itself never calls ``train()``. Override to change the switch.
    def on_validation_model_zero_grad(self) -> None:
        """Called by the fit before a validation that follows an optimizer step: releases the gradients."""
        self.zero_grad()

    def on_validation_model_eval(self) -> None:
        """Called as validation starts: puts the model in eval mode (see
        [`on_validation_model_train`][tandem.TrainingModule.on_validation_model_train])."""
        self._stepped_model().eval()

    def on_validation_model_train(self) -> None:
        """Called as validation ends, only when overridden: by default each submodule gets back the mode it had
        before validation. An override takes that over (``super()`` puts the whole model in training mode)."""
        self._stepped_model().train()

    def on_test_model_eval(self) -> None:
        """Called as testing starts: puts the model in eval mode (see
        [`on_test_model_train`][tandem.TrainingModule.on_test_model_train])."""
        self._stepped_model().eval()

    def on_test_model_train(self) -> None:
        """Called as testing ends, only when overridden: by default each submodule gets back the mode it had
        before testing. An override takes that over (``super()`` puts the whole model in training mode)."""
        self._stepped_model().train()

    def on_predict_model_eval(self) -> None:
        """Called as prediction starts: puts the model in eval mode (each submodule's mode returns after it)."""
        self._stepped_model().eval()

    def _stepped_model(self) -> nn.Module:
        """The model the steps run (a strategy's wrapper, or this module)."""
        trainer = self._trainer
        model = trainer.model if trainer is not None else None
        return self if model is None else model


_LOG_WITHOUT_TRAINER_WARNED = False


def _warn_log_without_trainer(name: str) -> None:
    """Once per process: ``self.log`` was called on a module no Trainer runs, so the value went nowhere."""
    global _LOG_WITHOUT_TRAINER_WARNED
    if not _LOG_WITHOUT_TRAINER_WARNED:
        _LOG_WITHOUT_TRAINER_WARNED = True
        rank_zero_warn(
            f"self.log({name!r}, ...) was called on a module that is not attached to a Trainer, so the value is "
            "dropped (as are later ones). Logging works inside trainer.fit / validate / test; outside a Trainer "
            "(e.g. calling training_step in a unit test) this is expected. (Shown once.)"
        )


def _resolve_clipping(
    value: float | None, algorithm: str | None, trainer_value: float | None, trainer_algorithm: str | None
) -> tuple[float, str]:
    """The clipping ``self.clip_gradients`` applies: its arguments, else the Trainer's; both set and
    different is an error (as in Lightning)."""
    if value is None:
        value = trainer_value or 0.0
    elif trainer_value is not None and trainer_value != value:
        raise TandemConfigError(
            f"Trainer(gradient_clip_val={trainer_value!r}) and clip_gradients(gradient_clip_val={value!r}) disagree; "
            "set clipping in one place only."
        )
    if algorithm is None:
        algorithm = trainer_algorithm or "norm"
    elif trainer_algorithm is not None and trainer_algorithm != algorithm:
        raise TandemConfigError(
            f"Trainer(gradient_clip_algorithm={trainer_algorithm!r}) and clip_gradients(gradient_clip_algorithm="
            f"{algorithm!r}) disagree; set clipping in one place only."
        )
    if algorithm not in CLIP_ALGORITHMS:
        raise bad_choice("gradient_clip_algorithm", algorithm, CLIP_ALGORITHMS)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise TandemConfigError(f"gradient_clip_val={value!r} must be a number >= 0.")
    return float(value), algorithm


def _gather_with_grads(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor`` stacked on a new dim 0, differentiable: the gradient of each rank's slice flows back
    to that rank (``self.all_gather(..., sync_grads=True)``)."""
    from torch.distributed.nn.functional import all_gather

    return torch.stack(all_gather(tensor))
