"""Optimizers and schedulers: parsing what ``configure_optimizers`` returns, the optimizers the module sees
(``self.optimizers()``), and the record of how a fit optimizes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, Union

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, OneCycleLR, ReduceLROnPlateau
from typing_extensions import NotRequired, Required, TypedDict

from tandem.utilities.exceptions import TandemConfigError, TandemUserCodeError, incompatible
from tandem.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.strategies.strategy import Strategy
    from tandem.trainer.config import TrainerConfig

INTERVALS = ("epoch", "step")
_SCHEDULER_KEYS = ("scheduler", "interval", "frequency", "monitor", "strict", "name", "reduce_on_plateau")
_SHAPES = (
    "an optimizer; a list of optimizers; {'optimizer': opt, 'lr_scheduler': scheduler, 'monitor': 'val_loss'} "
    "(lr_scheduler may be a dict {'scheduler': scheduler, 'interval': 'epoch' | 'step', 'frequency': 1, "
    "'monitor': ...}); ([optimizers], [schedulers]); or a list of such dicts"
)


@dataclass
class LRSchedulerConfig:
    """One scheduler and when it steps (Lightning's names). ``reduce_on_plateau`` schedulers get the
    ``monitor`` value when they step."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None
    strict: bool = True
    name: str | None = None
    reduce_on_plateau: bool = False


# What ``configure_optimizers`` returns, as Lightning types it (``lightning.pytorch.utilities.types``). A scheduler
# that is not torch's also runs (the module then overrides ``lr_scheduler_step``), as in Lightning, whose types
# name torch's alone.
LRSchedulerTypeUnion: TypeAlias = Union[LRScheduler, ReduceLROnPlateau]


class LRSchedulerConfigType(TypedDict, total=False):
    """``{"scheduler": ..., "interval": "epoch" | "step", "frequency": 1, "monitor": "val_loss", ...}``."""

    scheduler: Required[LRSchedulerTypeUnion]
    name: str | None
    interval: str
    frequency: int
    reduce_on_plateau: bool
    monitor: str | None
    strict: bool


class OptimizerConfig(TypedDict):
    """``{"optimizer": opt}``."""

    optimizer: Optimizer


class OptimizerLRSchedulerConfig(TypedDict):
    """``{"optimizer": opt, "lr_scheduler": scheduler or its config dict, "monitor": "val_loss"}``."""

    optimizer: Optimizer
    lr_scheduler: LRSchedulerTypeUnion | LRSchedulerConfigType
    monitor: NotRequired[str]


OptimizerLRScheduler: TypeAlias = Union[
    Optimizer,
    Sequence[Optimizer],
    tuple[Sequence[Optimizer], Sequence[Union[LRSchedulerTypeUnion, LRSchedulerConfig]]],
    OptimizerConfig,
    OptimizerLRSchedulerConfig,
    Sequence[OptimizerConfig],
    Sequence[OptimizerLRSchedulerConfig],
    None,
]


def check_manual_optimization(module: TrainingModule, strategy: Strategy, config: TrainerConfig) -> None:
    """Trainer settings that manual optimization cannot honour, refused before anything runs."""
    if module.automatic_optimization:
        return
    if config.accumulate_grad_batches != 1:
        raise incompatible(
            f"Trainer(accumulate_grad_batches={config.accumulate_grad_batches}) with manual optimization",
            "the Trainer cannot accumulate gradients for optimizers the module steps itself",
            "Remove accumulate_grad_batches, or step the optimizers every N batches in training_step.",
        )
    if config.gradient_clip_val is not None:
        raise incompatible(
            f"Trainer(gradient_clip_val={config.gradient_clip_val}) with manual optimization",
            "the Trainer does not step the optimizers, so it cannot clip before the steps",
            "Remove gradient_clip_val and call self.clip_gradients(opt, gradient_clip_val=...) before opt.step().",
        )
    if not strategy.supports_manual_optimization:
        raise incompatible(
            f"strategy={strategy.name!r} with manual optimization",
            "the step runs in replicas of the module, so manual_backward and opt.step() would run once per replica",
            "Use strategy='ddp' (one process per device).",
        )


#: Lightning's first sentence of each mistake, kept at the start of tandem's message (programs and tests match it)
_UNKNOWN = "Unknown configuration for model optimizers"
_NO_SCHEDULER_KEY = 'The lr scheduler dict must have the key "scheduler" with its item being an lr scheduler'
_NOT_ATTACHED = "Some schedulers are attached with an optimizer that wasn't returned from `configure_optimizers`"
_STATELESS = (
    "The provided lr scheduler `{}` is invalid. It should have `state_dict` and `load_state_dict` methods defined."
)
_NOT_TORCH = (
    "The provided lr scheduler `{}` doesn't follow PyTorch's LRScheduler API. You should override the "
    "`LightningModule.lr_scheduler_step` hook with your own logic if you are using a custom LR scheduler."
)


def _wrong(got: Any, why: str, lead: str = _UNKNOWN) -> TandemUserCodeError:
    return TandemUserCodeError(f"{lead}: configure_optimizers returned {got!r}: {why}. Return {_SHAPES}.")


class _NoOptimizer(Optimizer):
    """What a fit steps when ``configure_optimizers`` returned None (Lightning's ``_MockOptimizer``): a real
    optimizer over one placeholder tensor whose ``step`` changes nothing, so the loop, ``global_step`` and the
    checkpoints go on as with any optimizer."""

    def __init__(self) -> None:
        super().__init__([torch.zeros(1)], {})

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        return closure() if closure is not None else None


def parse_optimizers(
    result: Any, automatic: bool = True, steps_schedulers: bool = False, late: str = ""
) -> tuple[list[Optimizer], list[LRSchedulerConfig]]:
    """Validate the return value of ``configure_optimizers``: the optimizers and their scheduler configs.

    Several optimizers need manual optimization (``automatic=False``); with automatic optimization they
    are an error that says so. A scheduler is any object with ``state_dict`` and ``load_state_dict`` (the
    checkpoint's); under automatic optimization one that is not torch's also needs the module's own
    ``lr_scheduler_step`` (``steps_schedulers``), as in Lightning. ``late``: what the several-optimizers error adds
    when ``automatic_optimization`` was changed after the fit chose its mode.
    """
    if result is None:
        rank_zero_warn(
            "`configure_optimizers` returned `None`, this fit will run with no optimizer: the steps run, the weights "
            "do not change. Return an optimizer (torch.optim.SGD(self.parameters(), lr=0.1)) to train."
        )
        return ([_NoOptimizer()] if automatic else []), []
    optimizers, schedulers, monitor = _split(result)
    for optimizer in optimizers:
        if not isinstance(optimizer, Optimizer):
            raise _wrong(result, f"{type(optimizer).__name__} is not a torch.optim.Optimizer")
    if automatic and len(optimizers) > 1:
        raise TandemUserCodeError(
            f"configure_optimizers returned {len(optimizers)} optimizers; training with several optimizers needs "
            f"manual optimization.{late} Set self.automatic_optimization = False in __init__, then step them in "
            "training_step: opt_a, opt_b = self.optimizers(); self.manual_backward(loss); opt_a.step(); "
            "opt_a.zero_grad()."
        )
    if not optimizers:
        raise _wrong(result, "no optimizer in it")
    configs = [_parse_scheduler(s, monitor, automatic) for s in schedulers]
    for config in configs:
        _check_scheduler_api(config.scheduler, automatic and not steps_schedulers)
        if getattr(config.scheduler, "optimizer", optimizers[0]) not in optimizers:
            raise _wrong(result, "a scheduler was built for another optimizer than those returned", _NOT_ATTACHED)
    return optimizers, configs


def _split(result: Any) -> tuple[list[Any], list[Any], str | None]:
    """The optimizers, the schedulers (configs or objects) and the top-level monitor."""
    if isinstance(result, Optimizer):
        return [result], [], None
    if isinstance(result, Mapping):
        return _from_dict(result)
    if isinstance(result, Sequence) and not isinstance(result, str) and len(result) > 0:
        items = list(result)
        if len(items) == 2 and all(isinstance(i, Sequence) and not isinstance(i, str) for i in items):
            optimizers, schedulers = list(items[0]), items[1]
            return optimizers, list(schedulers) if isinstance(schedulers, Sequence) else [schedulers], None
        if all(isinstance(i, Mapping) for i in items):
            optimizers, schedulers = [], []
            for item in items:
                opts, scheds, monitor = _from_dict(item)
                optimizers += opts
                for scheduler in scheds:  # each dict's own "monitor" goes with its scheduler
                    if monitor is not None and not isinstance(scheduler, Mapping):
                        scheduler = {"scheduler": scheduler, "monitor": monitor}
                    schedulers.append(scheduler)
            return optimizers, schedulers, None
        return items, [], None
    raise _wrong(result, "that is not an optimizer")


def _from_dict(result: Mapping[str, Any]) -> tuple[list[Any], list[Any], str | None]:
    if "optimizer" not in result:
        raise _wrong(dict(result), "a dict needs the key 'optimizer'")
    unknown = set(result) - {"optimizer", "lr_scheduler", "monitor"}
    if unknown:
        rank_zero_warn(
            f"Found unsupported keys in the optimizer configuration: {unknown}. They are ignored; the keys are "
            "'optimizer', 'lr_scheduler' and 'monitor' (a misspelt one does nothing).",
            category=RuntimeWarning,
        )
    scheduler = result.get("lr_scheduler")
    return [result["optimizer"]], [scheduler] if scheduler is not None else [], result.get("monitor")


def _parse_scheduler(entry: Any, monitor: str | None, automatic: bool) -> LRSchedulerConfig:
    if isinstance(entry, Mapping):
        if "scheduler" not in entry:
            raise _wrong(dict(entry), "an lr_scheduler dict needs the key 'scheduler'", _NO_SCHEDULER_KEY)
        unknown = set(entry) - set(_SCHEDULER_KEYS)
        if unknown:
            rank_zero_warn(
                f"Found unsupported keys in the lr scheduler dict: {unknown}. They are ignored; the keys are "
                f"{', '.join(map(repr, _SCHEDULER_KEYS))} (a misspelt one does nothing).",
                category=RuntimeWarning,
            )
        config = LRSchedulerConfig(**{k: v for k, v in entry.items() if k in _SCHEDULER_KEYS})
        if "reduce_on_plateau" not in entry:
            config.reduce_on_plateau = isinstance(config.scheduler, ReduceLROnPlateau)
    else:
        config = LRSchedulerConfig(scheduler=entry, reduce_on_plateau=isinstance(entry, ReduceLROnPlateau))
    if config.monitor is None and config.reduce_on_plateau:
        config.monitor = monitor  # the top-level "monitor" of {"optimizer", "lr_scheduler", "monitor"}
    if config.interval not in INTERVALS:
        raise TandemConfigError(
            f'The "interval" key in lr scheduler dict must be "step" or "epoch" but is "{config.interval}": '
            "'step' steps the scheduler after every optimizer step, 'epoch' after every epoch."
        )
    if isinstance(config.scheduler, OneCycleLR) and config.interval == "epoch":
        rank_zero_warn(
            "A `OneCycleLR` scheduler is using 'interval': 'epoch'. Are you sure you didn't mean 'interval': 'step'? "
            "OneCycleLR counts optimizer steps (total_steps=trainer.estimated_stepping_batches).",
            category=RuntimeWarning,
        )
    if not isinstance(config.frequency, int) or config.frequency < 1:
        raise _wrong(entry, f"'frequency' must be an int >= 1, got {config.frequency!r}")
    if automatic and config.reduce_on_plateau and config.monitor is None:
        owner = "The lr scheduler dict" if isinstance(entry, Mapping) else "`configure_optimizers`"
        raise _wrong(
            entry,
            "ReduceLROnPlateau needs a metric: add 'monitor': 'val_loss' (a key you self.log), beside "
            "'optimizer' or inside the lr_scheduler dict",
            f"{owner} must include a monitor when a `ReduceLROnPlateau` scheduler is used",
        )
    return config


def _check_scheduler_api(scheduler: Any, trainer_steps_it: bool) -> None:
    """Lightning's rules for a scheduler: a checkpoint's methods always, torch's API where the Trainer steps it."""
    name = type(scheduler).__name__
    if not all(callable(getattr(scheduler, method, None)) for method in ("state_dict", "load_state_dict")):
        raise TandemUserCodeError(
            f"{_STATELESS.format(name)} A checkpoint saves each scheduler with the first and a resume restores it "
            f"with the second: add both to {name} (state_dict returning a dict of plain values), or use a "
            "torch.optim.lr_scheduler class."
        )
    if trainer_steps_it and not isinstance(scheduler, (LRScheduler, ReduceLROnPlateau)):
        raise TandemConfigError(
            f"{_NOT_TORCH.format(name)} Under automatic optimization the Trainer steps each scheduler, and it can "
            f"step only torch's: override TrainingModule.lr_scheduler_step(self, scheduler, metric) to step {name} "
            "(e.g. scheduler.step()), or step it yourself under manual optimization (self.automatic_optimization "
            "= False, then self.lr_schedulers().step() in training_step)."
        )


# ---------------------------------------------------------------------- the optimizers the module sees
_SUBCLASSES: dict[type, type] = {}
_OWN = frozenset({"_optimizer", "_step", "_zeroed", "step"})


class TrainingOptimizer:
    """A torch optimizer as ``self.optimizers()`` returns it (Lightning's ``LightningOptimizer``).

    ``step()`` goes to the fit's optimization object, then the strategy: the strategy's precision (a float16 step unscales and uses the
    ``GradScaler``), the ``on_before_optimizer_step`` hook, and one more ``trainer.global_step``. Everything
    else (``zero_grad``, ``param_groups``, ``state_dict``, ...) is the wrapped optimizer's, and
    ``isinstance(opt, torch.optim.Adam)`` still holds. ``opt.optimizer`` is the torch optimizer. Under manual
    optimization ``zero_grad()`` also tells the fit's optimization object (``zeroed``, held weakly), which warns when
    an optimizer steps again on gradients no zero_grad cleared.
    """

    def __new__(
        cls, optimizer: Optimizer, step: Callable[..., Any], zeroed: Callable[..., Any] | None = None
    ) -> TrainingOptimizer:
        kind = type(optimizer)
        subclass = _SUBCLASSES.get(kind)
        if subclass is None:  # also an instance of the optimizer's own class
            subclass = _SUBCLASSES[kind] = type(f"Training{kind.__name__}", (cls, kind), {})
        return object.__new__(subclass)

    def __init__(
        self, optimizer: Optimizer, step: Callable[..., Any], zeroed: Callable[..., Any] | None = None
    ) -> None:
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_step", step)
        object.__setattr__(self, "_zeroed", zeroed)

    @property
    def optimizer(self) -> Optimizer:
        return self._optimizer

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """Run ``closure`` (if given), then step through the strategy; counts toward ``global_step``."""
        step = self._step()  # the optimization object's step, held weakly
        if step is None:
            raise RuntimeError("optimizer.step(): the fit whose Trainer wrapped this optimizer no longer exists.")
        return step(self._optimizer, closure, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)
        if self._zeroed is not None:
            zeroed = self._zeroed()  # the optimization object's, held weakly
            if zeroed is not None:
                zeroed(self._optimizer)

    def __iter__(self) -> Any:
        """One optimizer is not a sequence: ``opt_a, opt_b = self.optimizers()`` with a single optimizer lands here."""
        name = type(self._optimizer).__name__
        raise TandemUserCodeError(
            f"self.optimizers() returned one optimizer ({name}), which cannot be unpacked or iterated: when "
            "configure_optimizers returns one optimizer, self.optimizers() returns it alone, not a list (as in "
            "Lightning). Write opt = self.optimizers(). To train with several, return them all from "
            "configure_optimizers (return opt_a, opt_b); self.optimizers() then returns a list of them."
        )

    def __getattr__(self, name: str) -> Any:  # only for names not found on the wrapper
        return getattr(object.__getattribute__(self, "_optimizer"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        # The wrapper keeps its own step (a scheduler built on it may wrap it); all else is the optimizer's.
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._optimizer, name, value)

    def __repr__(self) -> str:
        return f"TrainingOptimizer({self._optimizer!r})"
