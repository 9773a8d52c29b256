"""The subcommands (``fit``, ``validate``, ``test``, ``predict``): their names, the Trainer method's own arguments
each configures (``ckpt_path``), and the parser's options (``parser_kwargs``), for every subcommand or for one."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from typing import Any

from tandem.cli.arguments import Parameter, docstring_args, function_parameters

SUBCOMMANDS = ("fit", "validate", "test", "predict")
_METHOD_DATA_ARGS = ("model", "train_dataloaders", "val_dataloaders", "dataloaders", "datamodule")
_METHOD_HELP = {
    "ckpt_path": "a checkpoint file to start from; 'last' (the newest last.ckpt of this run's folders) or 'best'.",
}


def subcommand_arguments(trainer_class: type, subcommand: str | None) -> dict[str, Parameter]:
    """The Trainer method's own arguments a subcommand configures (``ckpt_path``), not the data it is given."""
    if subcommand is None:
        return {}
    method = getattr(trainer_class, subcommand)
    docs = {**_METHOD_HELP, **docstring_args(method.__doc__)}
    parameters = function_parameters(method, docs, skip_first=True)
    return {name: p for name, p in parameters.items() if name not in _METHOD_DATA_ARGS}


_PARSER_OPTIONS = ("default_config_files", "description", "exit_on_error", "prog", "parser_mode", "env_prefix")


def parser_options(parser_kwargs: dict[str, Any], subcommand: str | None) -> dict[str, Any]:
    """``parser_kwargs`` for every subcommand, with those of ``subcommand`` over them; options tandem's parser
    does not have are refused rather than ignored."""
    options = {k: v for k, v in parser_kwargs.items() if k not in SUBCOMMANDS}
    if subcommand is not None:
        options.update(parser_kwargs.get(subcommand) or {})
    for name, value in options.items():
        if name == "default_env" and not value:
            continue
        if name not in _PARSER_OPTIONS:
            raise TypeError(
                f"parser_kwargs: {name}={value!r} is not supported by tandem's CLI (it reads no environment "
                f"variables); supported: {', '.join(_PARSER_OPTIONS)}."
            )
        if name == "parser_mode" and value not in ("yaml", "omegaconf", "omegaconf+"):
            raise ValueError(f"parser_kwargs: parser_mode={value!r}: tandem reads YAML with omegaconf interpolation.")
    return options


def default_config_files(patterns: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    if isinstance(patterns, (str, os.PathLike)):
        patterns = [patterns]
    return [path for pattern in patterns for path in sorted(glob.glob(os.path.expanduser(str(pattern))))]
