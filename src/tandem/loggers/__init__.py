"""Loggers: where metrics and hyperparameters go. TensorBoard and CSV write into
``<save_dir>/<name>/version_<n>``; MLflow and W&B log to a run of their service. Each logger's module is
imported when its name is first read, and its service's package only when such a logger is made."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.utilities.lazy import lazy_attributes

if TYPE_CHECKING:
    from tandem.loggers.csv import CSVLogger
    from tandem.loggers.logger import DummyLogger, Logger
    from tandem.loggers.mlflow import MLFlowLogger
    from tandem.loggers.tensorboard import TensorBoardLogger
    from tandem.loggers.wandb import WandbLogger

_LAZY = {
    "CSVLogger": "tandem.loggers.csv",
    "DummyLogger": "tandem.loggers.logger",
    "Logger": "tandem.loggers.logger",
    "MLFlowLogger": "tandem.loggers.mlflow",
    "TensorBoardLogger": "tandem.loggers.tensorboard",
    "WandbLogger": "tandem.loggers.wandb",
}

__all__ = [
    "CSVLogger",
    "DummyLogger",
    "Logger",
    "MLFlowLogger",
    "TensorBoardLogger",
    "WandbLogger",
]

if not TYPE_CHECKING:  # type checkers read the imports above, and flag a misspelt name as unknown
    __getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
