"""Loggers: where metrics and hyperparameters go. Each writes into ``<save_dir>/<name>/version_<n>``."""

from tandem.loggers.csv import CSVLogger
from tandem.loggers.logger import Logger
from tandem.loggers.tensorboard import TensorBoardLogger

__all__ = ["CSVLogger", "Logger", "TensorBoardLogger"]
