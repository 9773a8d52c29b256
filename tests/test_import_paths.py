"""The import paths a Lightning program uses, with ``lightning.pytorch`` read as ``tandem``."""

from __future__ import annotations

import pytest

from helpers import run_python

pytestmark = pytest.mark.timeout(60)

PORTED_IMPORTS = """
import sys
import tandem
assert "rich" not in sys.modules  # imported only when a rich callback is used
assert "cProfile" not in sys.modules  # imported only when an AdvancedProfiler is used
from tandem import Callback, DataModule, Trainer, TrainingModule, seed_everything
from tandem.core import DataModule as CoreDataModule, TrainingModule as CoreTrainingModule
from tandem.trainer import Trainer as TrainerFromTrainer
from tandem.utilities import rank_zero_info, rank_zero_only, rank_zero_warn
from tandem.utilities.seed import seed_everything as seed_from_utilities
assert "tandem.tuner" not in sys.modules  # imported only when used
from tandem.callbacks import (
    BackboneFinetuning, BaseFinetuning, BasePredictionWriter, BatchSizeFinder, Callback as CallbackFromCallbacks,
    DeviceStatsMonitor, EarlyStopping, EMAWeightAveraging, GradientAccumulationScheduler, LambdaCallback,
    LearningRateFinder, LearningRateMonitor,
    ModelCheckpoint, ModelSummary, OnExceptionCheckpoint, ProgressBar, RichModelSummary, RichProgressBar,
    StochasticWeightAveraging, ThroughputMonitor, Timer, TQDMProgressBar, WeightAveraging,
)
assert "psutil" not in sys.modules  # imported only when CPU statistics are read
from tandem.loggers import CSVLogger, Logger, TensorBoardLogger
from tandem.profilers import AdvancedProfiler, PassThroughProfiler, Profiler, PyTorchProfiler, SimpleProfiler
from tandem.tuner import Tuner
from tandem.strategies import AsyncCheckpointIO, DDPStrategy, DataParallelStrategy, SingleDeviceStrategy, Strategy
assert "rich" not in sys.modules
assert CoreTrainingModule is TrainingModule and CoreDataModule is DataModule and TrainerFromTrainer is Trainer
assert seed_from_utilities is seed_everything and CallbackFromCallbacks is Callback
for statement in ("from tandem import LightningModule", "from tandem.core import LightningDataModule"):
    try:
        exec(statement)
    except ImportError as error:
        print(error)
print("imports ok")
"""


def test_lightning_import_paths_work_and_lightning_class_names_say_what_to_rename():
    result = run_python(["-c", PORTED_IMPORTS])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "imports ok" in result.stdout
    assert "tandem has no LightningModule: tandem calls it TrainingModule" in result.stdout
    assert "tandem.core has no LightningDataModule: tandem calls it DataModule" in result.stdout


# What `import tandem` and a first `Trainer()` may load beyond torch's own imports (top-level packages). A new
# entry here is a start-up cost every user pays: add one only if a first Trainer really needs it.
ALLOWED_AT_IMPORT = {"faulthandler", "hmac", "lightning_utilities", "packaging", "secrets", "sysconfig", "tandem"}
# Loaded on first use only: integrations, the CLI and the tuner, the heavy profilers, the progress-bar libraries.
LAZY = (
    "tensorboard",
    "omegaconf",
    "tqdm",
    "rich",
    "torchmetrics",
    "mlflow",
    "wandb",
    "onnx",
    "onnxscript",
    "matplotlib",
    "psutil",
    "hydra",
    "ray",
    "jsonargparse",
    "yaml",
    "cProfile",
    "tandem.cli",
    "tandem.tuner",
    "tandem.profilers.advanced",
    "tandem.profilers.pytorch",
    "tandem.loggers.mlflow",
    "tandem.loggers.wandb",
    "tandem.callbacks.batch_size_finder",
    "tandem.callbacks.lr_finder",
    "tandem.callbacks.weight_averaging",
)
IMPORT_PROBE = """
import json, sys
import torch
before = set(sys.modules)
import tandem
at_import = set(sys.modules) - before
tandem.Trainer()
print(json.dumps({"at_import": sorted(at_import), "after_trainer": sorted(set(sys.modules) - before)}))
"""


def test_import_tandem_and_a_first_trainer_load_only_what_they_need():
    """A regression guard on start-up: the packages `import tandem` adds to torch's, and the modules that stay
    unloaded through a first `Trainer()` (benchmarks/import_time.py measures the time)."""
    import json

    result = run_python(["-c", IMPORT_PROBE])
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    added = {name.partition(".")[0] for name in loaded["at_import"]}
    assert added <= ALLOWED_AT_IMPORT, f"import tandem now also loads {sorted(added - ALLOWED_AT_IMPORT)}"
    after = set(loaded["after_trainer"])
    early = [name for name in LAZY if name in after]
    assert not early, f"loaded by import tandem + Trainer() although only needed on first use: {early}"
    assert "tandem.loggers.tensorboard" not in loaded["at_import"]  # the default logger's module: with the Trainer
