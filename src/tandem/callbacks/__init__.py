"""Callbacks: code that observes or steers a run from outside the module, one callback a file.

The names and arguments are Lightning's (``lightning.pytorch.callbacks``). Each callback's module is imported
when its name is first read (``from tandem.callbacks import ModelCheckpoint`` works as usual), so
``import tandem`` does not pay for the callbacks a run does not use. ``RichProgressBar`` and
``RichModelSummary`` need the ``rich`` package, imported only when they are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.callbacks.callback import Callback, Checkpoint
from tandem.utilities.lazy import lazy_attributes

if TYPE_CHECKING:
    from tandem.callbacks.batch_size_finder import BatchSizeFinder
    from tandem.callbacks.device_stats_monitor import DeviceStatsMonitor
    from tandem.callbacks.early_stopping import EarlyStopping
    from tandem.callbacks.finetuning import BackboneFinetuning, BaseFinetuning
    from tandem.callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler
    from tandem.callbacks.lambda_function import LambdaCallback
    from tandem.callbacks.lr_finder import LearningRateFinder
    from tandem.callbacks.lr_monitor import LearningRateMonitor
    from tandem.callbacks.model_checkpoint import ModelCheckpoint
    from tandem.callbacks.model_summary import ModelSummary
    from tandem.callbacks.on_exception_checkpoint import OnExceptionCheckpoint
    from tandem.callbacks.prediction_writer import BasePredictionWriter
    from tandem.callbacks.progress_bar import ProgressBar
    from tandem.callbacks.rich_model_summary import RichModelSummary
    from tandem.callbacks.rich_progress import RichProgressBar
    from tandem.callbacks.stochastic_weight_avg import StochasticWeightAveraging
    from tandem.callbacks.throughput_monitor import ThroughputMonitor
    from tandem.callbacks.timer import Timer
    from tandem.callbacks.tqdm_progress import TQDMProgressBar
    from tandem.callbacks.weight_averaging import EMAWeightAveraging, WeightAveraging

_LAZY = {
    "BackboneFinetuning": "tandem.callbacks.finetuning",
    "BaseFinetuning": "tandem.callbacks.finetuning",
    "BasePredictionWriter": "tandem.callbacks.prediction_writer",
    "BatchSizeFinder": "tandem.callbacks.batch_size_finder",
    "DeviceStatsMonitor": "tandem.callbacks.device_stats_monitor",
    "EMAWeightAveraging": "tandem.callbacks.weight_averaging",
    "EarlyStopping": "tandem.callbacks.early_stopping",
    "GradientAccumulationScheduler": "tandem.callbacks.gradient_accumulation_scheduler",
    "LambdaCallback": "tandem.callbacks.lambda_function",
    "LearningRateFinder": "tandem.callbacks.lr_finder",
    "LearningRateMonitor": "tandem.callbacks.lr_monitor",
    "ModelCheckpoint": "tandem.callbacks.model_checkpoint",
    "ModelSummary": "tandem.callbacks.model_summary",
    "OnExceptionCheckpoint": "tandem.callbacks.on_exception_checkpoint",
    "ProgressBar": "tandem.callbacks.progress_bar",
    "RichModelSummary": "tandem.callbacks.rich_model_summary",
    "RichProgressBar": "tandem.callbacks.rich_progress",
    "StochasticWeightAveraging": "tandem.callbacks.stochastic_weight_avg",
    "TQDMProgressBar": "tandem.callbacks.tqdm_progress",
    "ThroughputMonitor": "tandem.callbacks.throughput_monitor",
    "Timer": "tandem.callbacks.timer",
    "WeightAveraging": "tandem.callbacks.weight_averaging",
}

__all__ = [
    "BackboneFinetuning",
    "BaseFinetuning",
    "BasePredictionWriter",
    "BatchSizeFinder",
    "Callback",
    "Checkpoint",
    "DeviceStatsMonitor",
    "EMAWeightAveraging",
    "EarlyStopping",
    "GradientAccumulationScheduler",
    "LambdaCallback",
    "LearningRateFinder",
    "LearningRateMonitor",
    "ModelCheckpoint",
    "ModelSummary",
    "OnExceptionCheckpoint",
    "ProgressBar",
    "RichModelSummary",
    "RichProgressBar",
    "StochasticWeightAveraging",
    "TQDMProgressBar",
    "ThroughputMonitor",
    "Timer",
    "WeightAveraging",
]

if not TYPE_CHECKING:  # type checkers read the imports above, and flag a misspelt name as unknown
    __getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
