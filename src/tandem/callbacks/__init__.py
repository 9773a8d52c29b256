"""Callbacks: code that observes or steers a run from outside the module, one callback a file."""

from tandem.callbacks.callback import Callback
from tandem.callbacks.early_stopping import EarlyStopping
from tandem.callbacks.lr_monitor import LearningRateMonitor
from tandem.callbacks.model_checkpoint import ModelCheckpoint
from tandem.callbacks.model_summary import ModelSummary
from tandem.callbacks.progress_bar import ProgressBar
from tandem.callbacks.throughput_monitor import ThroughputMonitor

__all__ = [
    "Callback",
    "EarlyStopping",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelSummary",
    "ProgressBar",
    "ThroughputMonitor",
]
