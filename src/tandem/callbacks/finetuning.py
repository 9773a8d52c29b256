"""BaseFinetuning and BackboneFinetuning: freeze parts of the module before training and unfreeze them later,
each as a new parameter group of the optimizer."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Union

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim import Optimizer

from tandem.callbacks.callback import Callback
from tandem.utilities.exceptions import TandemConfigError, incompatible, out_of_range
from tandem.utilities.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer

Modules = Union[nn.Module, Iterable[Union[nn.Module, Iterable]]]


def multiplicative(epoch: int) -> float:
    """BackboneFinetuning's default ``lambda_func``: double the backbone's learning rate every epoch."""
    return 2.0


class BaseFinetuning(Callback):
    """The base of finetuning callbacks:
    [`freeze_before_training`][tandem.callbacks.BaseFinetuning.freeze_before_training] freezes modules before the
    optimizers are configured, [`finetune_function`][tandem.callbacks.BaseFinetuning.finetune_function] runs at the
    start of every training epoch (once per optimizer) and unfreezes them, typically with
    [`unfreeze_and_add_param_group`][tandem.callbacks.BaseFinetuning.unfreeze_and_add_param_group], which adds their
    parameters to the optimizer as a new parameter group.

    The parameter groups added this way, and which parameters are frozen, are kept in checkpoints: a resumed fit
    gets them back before the optimizer's state is loaded. ``configure_optimizers`` must leave frozen
    parameters out (``filter(lambda p: p.requires_grad, self.parameters())``); otherwise they are in a group
    already and are not added again. With DDP, parameters frozen when the module is wrapped get no gradient
    synchronisation later; finetune on one device or unfreeze before fit.

    Example:
        ```python
        class FeatureExtractorFreezeUnfreeze(BaseFinetuning):
            def __init__(self, unfreeze_at_epoch=10):
                super().__init__()
                self._unfreeze_at_epoch = unfreeze_at_epoch

            def freeze_before_training(self, module):
                self.freeze(module.feature_extractor)

            def finetune_function(self, module, current_epoch, optimizer):
                if current_epoch == self._unfreeze_at_epoch:
                    self.unfreeze_and_add_param_group(module.feature_extractor, optimizer, train_bn=True)
        ```
    """

    def __init__(self) -> None:
        # optimizer index -> its parameter groups, parameters by name (what a resumed fit rebuilds)
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._fitting = False

    # ------------------------------------------------------------------ to override
    def freeze_before_training(self, module: TrainingModule) -> None:
        """Freeze modules here (called in ``setup``, before ``configure_optimizers``)."""
        raise NotImplementedError(f"{type(self).__name__} must override freeze_before_training(module).")

    def finetune_function(self, module: TrainingModule, epoch: int, optimizer: Optimizer) -> None:
        """Unfreeze here (called at the start of each training epoch, once per optimizer)."""
        raise NotImplementedError(f"{type(self).__name__} must override finetune_function(module, epoch, optimizer).")

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def flatten_modules(modules: Modules) -> list[nn.Module]:
        """The leaf modules of ``modules`` (a module, or an iterable or ModuleDict of them), and the modules
        that hold parameters of their own."""
        if isinstance(modules, nn.ModuleDict):
            modules = modules.values()
        if isinstance(modules, Iterable):
            found: Iterable[nn.Module] = [m for item in modules for m in BaseFinetuning.flatten_modules(item)]
        else:
            found = modules.modules()
        return [m for m in found if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(modules: Modules, train_bn: bool = True, requires_grad: bool = True) -> Iterator[nn.Parameter]:
        """The parameters of ``modules`` whose ``requires_grad`` is ``requires_grad`` (BatchNorm layers' only
        when ``train_bn``)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and not train_bn:
                continue
            for param in module.parameters(recurse=False):  # a parent's own parameters once, not again per child
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules: Modules) -> None:
        """Unfreeze ``modules`` (BatchNorm layers track their running statistics again)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: nn.Module) -> None:
        """Freeze ``module``'s own parameters (a BatchNorm layer also stops tracking running statistics)."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: Modules, train_bn: bool = True) -> None:
        """Freeze ``modules``; with ``train_bn`` their BatchNorm layers stay trainable."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(module)
            else:
                BaseFinetuning.freeze_module(module)

    @staticmethod
    def filter_on_optimizer(optimizer: Optimizer, params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
        """``params`` without those already in one of ``optimizer``'s groups (with a warning naming the cause)."""
        present = {id(p) for group in optimizer.param_groups for p in group["params"]}
        params = list(params)
        kept = [p for p in params if id(p) not in present]
        if len(kept) < len(params):
            rank_zero_warn(
                f"{len(params) - len(kept)} of the parameters to unfreeze are in a group of the optimizer already and "
                "are skipped. Leave frozen parameters out of configure_optimizers: "
                f"{type(optimizer).__name__}(filter(lambda p: p.requires_grad, self.parameters()), ...)."
            )
        return kept

    @staticmethod
    def unfreeze_and_add_param_group(
        modules: Modules,
        optimizer: Optimizer,
        lr: float | None = None,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
    ) -> None:
        """Unfreeze ``modules`` and add their parameters to ``optimizer`` as a new group.

        Args:
            modules: a module or an iterable of modules.
            optimizer: the optimizer that gets the group.
            lr: the group's learning rate; None: the first group's divided by ``initial_denom_lr``.
            initial_denom_lr: see ``lr``.
            train_bn: add the BatchNorm layers' parameters too.
        """
        # parameters trainable all along (BatchNorm under train_bn) may be in a group already: no warning for them
        present = {id(p) for group in optimizer.param_groups for p in group["params"]}
        trained = {id(p) for p in BaseFinetuning.filter_params(modules, train_bn=train_bn) if id(p) in present}
        BaseFinetuning.make_trainable(modules)
        group_lr = optimizer.param_groups[0]["lr"] / initial_denom_lr if lr is None else float(lr)
        params = BaseFinetuning.filter_on_optimizer(
            optimizer, [p for p in BaseFinetuning.filter_params(modules, train_bn=train_bn) if id(p) not in trained]
        )
        if params:
            optimizer.add_param_group({"params": params, "lr": group_lr})

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: Trainer, module: TrainingModule, stage: str) -> None:
        self._fitting = stage == "fit"
        self.freeze_before_training(module)

    def on_train_epoch_start(self, trainer: Trainer, module: TrainingModule) -> None:
        for index, optimizer in enumerate(trainer.optimizers):
            groups_before = len(optimizer.param_groups)
            self.finetune_function(module, trainer.current_epoch, optimizer)
            self._store(module, index, groups_before, optimizer.param_groups)

    def _store(self, module: nn.Module, index: int, groups_before: int, groups: list[dict[str, Any]]) -> None:
        names = {p: n for n, p in module.named_parameters()}
        if index not in self._internal_optimizer_metadata:
            self._internal_optimizer_metadata[index] = _by_name(groups, names)
        elif len(groups) != groups_before:  # groups added in this epoch (by finetune_function or the user)
            self._internal_optimizer_metadata[index].extend(_by_name(groups[groups_before:], names))

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"internal_optimizer_metadata": self._internal_optimizer_metadata}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._internal_optimizer_metadata = state["internal_optimizer_metadata"]

    def on_save_checkpoint(self, trainer: Trainer, module: TrainingModule, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("callbacks", {}).get(self.state_key)
        if state is not None:  # what is frozen now: a resumed fit's setup freezes again, this says what is not
            state["frozen"] = {
                "parameters": [n for n, p in module.named_parameters() if not p.requires_grad],
                "batch_norms": [
                    n for n, m in module.named_modules() if isinstance(m, _BatchNorm) and not m.track_running_stats
                ],
            }

    def on_load_checkpoint(self, trainer: Trainer, module: TrainingModule, checkpoint: dict[str, Any]) -> None:
        # Called before the optimizers' states are loaded, which need the groups this callback added.
        state = checkpoint.get("callbacks", {}).get(self.state_key)
        if state is None or not self._fitting:
            return
        self.load_state_dict(state)
        named = dict(module.named_parameters())
        for index, optimizer in enumerate(trainer.optimizers):
            saved = self._internal_optimizer_metadata.get(index)
            if saved is not None:
                optimizer.param_groups = [{**g, "params": [named[n] for n in g["params"]]} for g in saved]
        frozen = state.get("frozen")
        if frozen is not None:
            frozen_params, frozen_norms = set(frozen["parameters"]), set(frozen["batch_norms"])
            for name, param in named.items():
                param.requires_grad = name not in frozen_params
            for name, layer in module.named_modules():
                if isinstance(layer, _BatchNorm):
                    layer.track_running_stats = name not in frozen_norms


def _by_name(groups: list[dict[str, Any]], names: dict[nn.Parameter, str]) -> list[dict[str, Any]]:
    """Parameter groups with each parameter replaced by its name (what a checkpoint can hold)."""
    return [
        {**{k: v for k, v in g.items() if k != "params"}, "params": [names[p] for p in g["params"]]} for g in groups
    ]


class BackboneFinetuning(BaseFinetuning):
    """Train the module's ``backbone`` (an ``nn.Module`` attribute) only from epoch
    ``unfreeze_backbone_at_epoch`` on, with a learning rate of its own that grows each epoch.

    Before training the backbone is frozen. At the unfreeze epoch its parameters join the optimizer as a new
    group with learning rate ``backbone_initial_lr``, or the first group's rate times
    ``backbone_initial_ratio_lr``. At each later epoch that rate is multiplied by ``lambda_func(epoch + 1)``;
    with ``should_align`` it never exceeds the first group's rate.

    Args:
        unfreeze_backbone_at_epoch: the epoch (0-based) at which the backbone starts training.
        lambda_func: ``epoch -> factor`` for the backbone's learning rate each epoch (default: 2.0).
        backbone_initial_ratio_lr: the backbone's first rate as a fraction of the first group's.
        backbone_initial_lr: the backbone's first rate (overrides ``backbone_initial_ratio_lr``).
        should_align: cap the backbone's rate at the first group's.
        initial_denom_lr: kept for Lightning compatibility; the backbone's rate is always given explicitly,
            so it has no effect here (see
            [`unfreeze_and_add_param_group`][tandem.callbacks.BaseFinetuning.unfreeze_and_add_param_group]).
        train_bn: add the backbone's BatchNorm layers to its group at the unfreeze epoch (they are not frozen
            before it, as in Lightning: configure_optimizers may already hold them).
        verbose: report the learning rates each epoch from the unfreeze epoch on.
        rounding: digits of the reported learning rates.

    Example:
        ```python
        trainer = Trainer(callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=5, lambda_func=lambda e: 1.5)])
        ```
    """

    def __init__(
        self,
        unfreeze_backbone_at_epoch: int = 10,
        lambda_func: Callable[[int], float] = multiplicative,
        backbone_initial_ratio_lr: float = 10e-2,
        backbone_initial_lr: float | None = None,
        should_align: bool = True,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
        verbose: bool = False,
        rounding: int = 12,
    ) -> None:
        super().__init__()
        epoch = unfreeze_backbone_at_epoch
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise out_of_range("BackboneFinetuning: unfreeze_backbone_at_epoch", epoch, "an int >= 0 (an epoch)")
        if not callable(lambda_func):
            raise TandemConfigError(
                f"BackboneFinetuning: lambda_func must be a function epoch -> factor, got {lambda_func!r}."
            )
        for name, value in (
            ("backbone_initial_ratio_lr", backbone_initial_ratio_lr),
            ("backbone_initial_lr", backbone_initial_lr),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise out_of_range(f"BackboneFinetuning: {name}", value, "a float > 0")
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.previous_backbone_lr = state["previous_backbone_lr"]
        super().load_state_dict(state)

    def setup(self, trainer: Trainer, module: TrainingModule, stage: str) -> None:
        if not isinstance(getattr(module, "backbone", None), nn.Module):
            raise incompatible(
                "BackboneFinetuning",
                f"{type(module).__name__} has no nn.Module attribute `backbone`",
                "Give the module one (self.backbone = ...), or subclass BaseFinetuning to name other layers.",
            )
        super().setup(trainer, module, stage)

    def freeze_before_training(self, module: TrainingModule) -> None:
        self.freeze(module.backbone)

    def finetune_function(self, module: TrainingModule, epoch: int, optimizer: Optimizer) -> None:
        if epoch < self.unfreeze_backbone_at_epoch:
            return
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            backbone_lr = self.backbone_initial_lr
            if backbone_lr is None:
                backbone_lr = current_lr * self.backbone_initial_ratio_lr
            self.unfreeze_and_add_param_group(
                module.backbone,
                optimizer,
                backbone_lr,
                train_bn=self.train_bn,
                initial_denom_lr=self.initial_denom_lr,
            )
        else:
            previous = self.previous_backbone_lr
            assert previous is not None  # set at the unfreezing epoch (and restored with the epochs after it)
            backbone_lr = self.lambda_func(epoch + 1) * previous
            if self.should_align and backbone_lr > current_lr:
                backbone_lr = current_lr
            optimizer.param_groups[-1]["lr"] = backbone_lr
        self.previous_backbone_lr = backbone_lr
        if self.verbose:
            rank_zero_info(
                f"BackboneFinetuning: epoch {epoch}: lr {round(current_lr, self.rounding)}, "
                f"backbone lr {round(backbone_lr, self.rounding)}"
            )
