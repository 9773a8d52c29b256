"""The Trainer's arguments that are more than numbers (``config.py`` checks those): the loggers, the callbacks with
Lightning's defaults and order (and the module's ``configure_callbacks``), ``max_time``'s ``Timer``, and the
signature that the unknown-argument guard of ``Trainer.__new__`` reads."""

from __future__ import annotations

import functools
import inspect
import sys
from typing import TYPE_CHECKING, Any

from tandem.callbacks.callback import Callback, Checkpoint
from tandem.module import TrainingModule, calls_hook
from tandem.utilities.exceptions import TandemConfigError, TandemUserCodeError, incompatible
from tandem.utilities.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from tandem.loggers.logger import Logger


# (called with a variable typed ``type``: mypy does not see ``type[Trainer]`` as the Hashable that the cache takes)
@functools.cache
def _init_signature(cls: type[Any]) -> inspect.Signature:
    signature = inspect.signature(cls.__init__)
    return signature.replace(parameters=list(signature.parameters.values())[1:])


@functools.cache
def _init_arguments(cls: type[Any]) -> frozenset[str] | None:
    """The names ``cls.__init__`` takes; None when it takes any (``**kwargs``)."""
    kind: type = cls
    parameters = _init_signature(kind).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters)


def _build_loggers(logger: Any, root: str) -> list[Logger]:
    from tandem.loggers.logger import Logger

    if logger is True:
        from tandem.loggers.tensorboard import TensorBoardLogger

        return [TensorBoardLogger(save_dir=root)]
    if logger is False or logger is None:
        return []
    loggers = list(logger) if isinstance(logger, (list, tuple)) else [logger]
    for item in loggers:
        if not isinstance(item, Logger):
            raise TandemConfigError(
                f"logger={item!r} is not a tandem Logger; pass True, False, a Logger (TensorBoardLogger, CSVLogger, "
                "MLFlowLogger, WandbLogger, a subclass of tandem.loggers.Logger) or a list of them."
            )
    return loggers


def _add_timer(callbacks: list[Callback], max_time: Any) -> None:
    """``max_time`` is a [`Timer`][tandem.callbacks.Timer] checked every batch, unless the user gave a Timer (as
    Lightning)."""
    if max_time is None:
        return
    from tandem.callbacks.timer import Timer

    if any(isinstance(c, Timer) for c in callbacks):
        rank_zero_info("Ignoring Trainer(max_time=...): the callbacks already contain a Timer, whose duration counts.")
        return
    callbacks.append(Timer(duration=max_time, interval="step", verbose=True))


def _build_callbacks(
    callbacks: Any, checkpointing: bool, fast_dev_run: bool, progress_bar: bool, model_summary: bool
) -> list[Callback]:
    if callbacks is None:
        callbacks = []
    elif isinstance(callbacks, Callback):
        callbacks = [callbacks]
    callbacks = list(callbacks)
    for callback in callbacks:
        if not isinstance(callback, Callback):
            raise TandemConfigError(f"callbacks must be tandem.Callback instances; got {type(callback).__name__}.")
    given: list[str] = []
    if callbacks or checkpointing:  # no callback and checkpointing off: the module is not needed (nor imported)
        from tandem.callbacks.model_checkpoint import ModelCheckpoint

        given = [type(c).__name__ for c in callbacks if isinstance(c, ModelCheckpoint)]
    if given and not checkpointing:
        raise incompatible(
            f"Trainer(enable_checkpointing=False, callbacks=[{given[0]}(...)])",
            "enable_checkpointing=False turns checkpointing off, but the callbacks hold a ModelCheckpoint",
            "Remove the ModelCheckpoint from callbacks, or leave enable_checkpointing at True.",
            lead="Trainer was configured with `enable_checkpointing=False` but found `ModelCheckpoint` in callbacks "
            "list.",
        )
    if checkpointing and not fast_dev_run and not given:
        # Lightning's default: the latest epoch's checkpoint (epoch=N-step=M.ckpt), which best_model_path names
        callbacks.append(ModelCheckpoint())
    if progress_bar:
        from tandem.callbacks.progress_bar import ProgressBar
        from tandem.callbacks.tqdm_progress import TQDMProgressBar

        if not any(isinstance(c, ProgressBar) for c in callbacks):
            callbacks.append(TQDMProgressBar())
    if model_summary:
        from tandem.callbacks.model_summary import ModelSummary

        if not any(isinstance(c, ModelSummary) for c in callbacks):
            callbacks.insert(0, _default_summary(callbacks))
    keys = [c.state_key for c in callbacks]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise TandemConfigError(
            f"Two callbacks share the checkpoint state key {duplicates[0]!r}; give them different settings."
        )
    return _lightning_order(callbacks)


def _default_summary(callbacks: list[Callback]) -> Callback:
    """Lightning's default summary: a rich table beside a ``RichProgressBar``, the plain one otherwise."""
    from tandem.callbacks.model_summary import ModelSummary
    from tandem.callbacks.rich_model_summary import RichModelSummary
    from tandem.callbacks.rich_progress import RichProgressBar

    return RichModelSummary() if any(isinstance(c, RichProgressBar) for c in callbacks) else ModelSummary()


def _lightning_order(callbacks: list[Callback]) -> list[Callback]:
    """Lightning's order of the callbacks: the tuner's (``BatchSizeFinder``, ``LearningRateFinder``) first, the
    checkpoint callbacks last (a checkpoint sees what the others logged), each group in the order given."""
    # a tuner's class exists only once its module was imported (tandem.callbacks imports each on first use)
    tuner_classes = (("batch_size_finder", "BatchSizeFinder"), ("lr_finder", "LearningRateFinder"))
    found = ((sys.modules.get(f"tandem.callbacks.{module}"), kind) for module, kind in tuner_classes)
    tuners = tuple(getattr(module, kind) for module, kind in found if module is not None)
    # a stable sort: each group keeps the order given
    return sorted(callbacks, key=lambda c: 0 if isinstance(c, tuners) else 2 if isinstance(c, Checkpoint) else 1)


def _with_module_callbacks(callbacks: list[Callback], module: TrainingModule) -> list[Callback]:
    """The Trainer's callbacks with the module's ``configure_callbacks()`` added; a Trainer callback whose class
    one of them is (a subclass of) is replaced (Lightning's rule)."""
    if not calls_hook(module, "configure_callbacks"):
        return callbacks
    extra = module.configure_callbacks()
    extra = [extra] if isinstance(extra, Callback) else list(extra or [])
    for callback in extra:
        if not isinstance(callback, Callback):
            raise TandemUserCodeError(
                f"{type(module).__name__}.configure_callbacks returned {type(callback).__name__}; return "
                "tandem.Callback instances (one or a list)."
            )
    replaced = {type(c) for c in callbacks if type(c) is not Callback and any(isinstance(e, type(c)) for e in extra)}
    return _lightning_order([c for c in callbacks if type(c) not in replaced and c not in extra] + extra)
