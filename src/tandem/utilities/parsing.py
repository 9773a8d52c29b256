"""Hyperparameters found by name where Lightning looks for them: the module, its ``hparams``, the Trainer's
DataModule and its ``hparams`` (``lightning.pytorch.utilities.parsing``'s ``lightning_*attr``). The tuner finds
``lr`` and ``batch_size`` this way."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any


def _holders(model: Any, attribute: str) -> list[Any]:
    """Every object or dict holding ``attribute``, in Lightning's order: the module, ``module.hparams``, the
    DataModule of the module's Trainer, its ``hparams``."""
    holders: list[Any] = []
    if hasattr(model, attribute):
        holders.append(model)
    hparams = getattr(model, "hparams", None)
    if isinstance(hparams, MutableMapping) and attribute in hparams:
        holders.append(hparams)
    try:
        datamodule = model.trainer.datamodule
    except (AttributeError, RuntimeError):  # not attached to a Trainer
        datamodule = None
    if datamodule is not None:
        if hasattr(datamodule, attribute):
            holders.append(datamodule)
        hparams = getattr(datamodule, "hparams", None)
        if isinstance(hparams, MutableMapping) and attribute in hparams:
            holders.append(hparams)
    return holders


def _not_found(model: Any, attribute: str) -> AttributeError:
    return AttributeError(
        f"{attribute!r} is neither an attribute of {type(model).__name__} nor of its hparams, nor of the Trainer's "
        f"DataModule or its hparams. Set self.{attribute} (or save_hyperparameters() with an {attribute} argument) "
        "in the module or the DataModule."
    )


def lightning_hasattr(model: Any, attribute: str) -> bool:
    """Whether the module, its hparams, its Trainer's DataModule or that one's hparams has ``attribute``."""
    return bool(_holders(model, attribute))


def lightning_getattr(model: Any, attribute: str) -> Any:
    """``attribute``'s value; the last holder in Lightning's order wins (the DataModule's over the module's)."""
    holders = _holders(model, attribute)
    if not holders:
        raise _not_found(model, attribute)
    holder = holders[-1]
    return holder[attribute] if isinstance(holder, MutableMapping) else getattr(holder, attribute)


def lightning_setattr(model: Any, attribute: str, value: Any) -> None:
    """Set ``attribute`` to ``value`` everywhere it is found (module, hparams, DataModule, its hparams)."""
    holders = _holders(model, attribute)
    if not holders:
        raise _not_found(model, attribute)
    for holder in holders:
        if isinstance(holder, MutableMapping):
            holder[attribute] = value
        else:
            setattr(holder, attribute, value)
