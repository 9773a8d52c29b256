"""Rebuild a TrainingModule or a DataModule from a checkpoint (``load_from_checkpoint``): the file read weights-only
unless trusted, the class built from the saved hyperparameters and the arguments passed, then its state loaded."""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from tandem.utilities.exceptions import TandemUserCodeError, hyperparameters_missing, hyperparameters_renamed

if TYPE_CHECKING:
    from tandem.module.datamodule import DataModule
    from tandem.module.training_module import TrainingModule

_T = TypeVar("_T")
_Module = TypeVar("_Module", bound="TrainingModule")
_Data = TypeVar("_Data", bound="DataModule")


def load_module(
    cls: type[_Module],
    checkpoint_path: str | os.PathLike,
    map_location: str | torch.device | None,
    strict: bool,
    weights_only: bool | None,
    kwargs: Mapping[str, Any],
) -> _Module:
    """[`TrainingModule.load_from_checkpoint`][tandem.TrainingModule.load_from_checkpoint]'s work."""
    checkpoint = _read_checkpoint(checkpoint_path, weights_only)
    module = _instantiate(cls, checkpoint.get("hparams", {}), kwargs, checkpoint_path)
    module.on_load_checkpoint(checkpoint)
    try:
        module.load_state_dict(checkpoint["state_dict"], strict=strict)
    except RuntimeError as err:
        raise TandemUserCodeError(
            f"Checkpoint {os.fspath(checkpoint_path)!r} does not fit {cls.__name__}: {err}. Pass the __init__ "
            "arguments it was trained with (strict=False skips missing and unexpected keys, not other shapes)."
        ) from None
    return module.to(map_location) if map_location is not None else module


def load_datamodule(
    cls: type[_Data], checkpoint_path: str | os.PathLike, weights_only: bool | None, kwargs: Mapping[str, Any]
) -> _Data:
    """[`DataModule.load_from_checkpoint`][tandem.DataModule.load_from_checkpoint]'s work."""
    checkpoint = _read_checkpoint(checkpoint_path, weights_only)
    datamodule = _instantiate(cls, checkpoint.get("datamodule_hparams", {}), kwargs, checkpoint_path)
    if "datamodule" in checkpoint:
        datamodule.load_state_dict(checkpoint["datamodule"])
    return datamodule


def _read_checkpoint(path: str | os.PathLike, weights_only: bool | None) -> dict[str, Any]:
    from tandem.utilities.checkpoint import load_checkpoint_file

    return load_checkpoint_file(path, weights_only)


def _instantiate(cls: type[_T], saved: Mapping[str, Any], passed: Mapping[str, Any], path: str | os.PathLike) -> _T:
    """``cls(**saved, **passed)``, keeping only the arguments ``__init__`` takes (all of them if it takes
    ``**kwargs``). Refused, naming the fix, when a required argument is neither saved nor passed, or when a saved
    name ``__init__`` does not take (a renamed argument) would be dropped while an argument falls back to its default
    (see ``hyperparameters_renamed``)."""
    parameters = inspect.signature(cls.__init__).parameters
    named = {
        name: p.default
        for name, p in list(parameters.items())[1:]
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    hparams = {**saved, **passed}
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        unknown = {name: value for name, value in saved.items() if name not in named}
        unset = {name: default for name, default in named.items() if name not in hparams}
        if unknown and unset:
            raise hyperparameters_renamed(cls.__name__, path, named, unknown, unset)
        hparams = {k: v for k, v in hparams.items() if k in named}
    missing = [name for name, default in named.items() if default is inspect.Parameter.empty and name not in hparams]
    if missing:
        raise hyperparameters_missing(cls.__name__, path, saved, missing)
    return cls(**hparams)
