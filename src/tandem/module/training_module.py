"""TrainingModule: a model together with how to train, evaluate and optimize it (Lightning's ``LightningModule``).

This file holds the user's steps, the module's link to its Trainer and what it reads of the run, export and loading;
its other parts are base classes of their own files, as Lightning's ``LightningModule(ModelHooks, DataHooks,
CheckpointHooks, ...)``: ``optimization.py`` (``OptimizationMixin``: the optimizers, ``manual_backward``, clipping),
``logging.py`` (``LoggingMixin``: ``self.log``) and ``hooks.py`` (``ModelHooks``, ``DataHooks``, ``CheckpointHooks``).
"""

from __future__ import annotations

import functools
import itertools
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn

from tandem.module.export import export_onnx, export_torchscript
from tandem.module.hooks import CheckpointHooks, DataHooks, ModelHooks, logs_per_step
from tandem.module.hyperparameters import AttributeDict, HyperparametersMixin
from tandem.module.loading import load_module
from tandem.module.logging import LoggingMixin
from tandem.module.optimization import OptimizationMixin
from tandem.utilities.exceptions import TandemConfigError

if TYPE_CHECKING:
    from typing import TypeAlias

    from typing_extensions import Self

    from tandem.callbacks.callback import Callback
    from tandem.loggers.logger import Logger
    from tandem.trainer.optim import OptimizerLRScheduler
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


def _weights_loaded(module: nn.Module, incompatible_keys: Any) -> None:
    """``load_state_dict`` on a TrainingModule (a post-hook: ``load_from_checkpoint`` and the Trainer's restores pass
    here too): its weights are no longer the ones it was built with."""
    if isinstance(module, TrainingModule):
        module._note_weights_from("load_state_dict")


class TrainingModule(
    HyperparametersMixin, OptimizationMixin, LoggingMixin, ModelHooks, DataHooks, CheckpointHooks, nn.Module
):
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

    def _stepped_model(self) -> nn.Module:
        """The model the steps run (a strategy's wrapper, or this module)."""
        trainer = self._trainer
        model = trainer.model if trainer is not None else None
        return self if model is None else model


def _gather_with_grads(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor`` stacked on a new dim 0, differentiable: the gradient of each rank's slice flows back
    to that rank (``self.all_gather(..., sync_grads=True)``)."""
    from torch.distributed.nn.functional import all_gather

    return torch.stack(all_gather(tensor))
