"""The import paths a Lightning program uses, with ``lightning.pytorch`` read as ``tandem``."""

from __future__ import annotations

import json

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


# What `import tandem` must leave for first use: optional integrations, the CLI, the tuner, the heavy profilers,
# the strategies and loggers a run does not name. Prefixes of module names; checked against what `import tandem`
# adds after `import torch` (torch itself imports tqdm, for torch.hub).
NOT_ON_IMPORT = (
    "tensorboard",
    "tensorboardX",
    "omegaconf",
    "yaml",
    "tqdm",
    "rich",
    "torchmetrics",
    "mlflow",
    "wandb",
    "onnx",
    "matplotlib",
    "pandas",
    "psutil",
    "cProfile",
    "tandem.cli",
    "tandem.tuner",
    "tandem.profilers.pytorch",
    "tandem.profilers.advanced",
    "tandem.loggers.tensorboard",
    "tandem.loggers.mlflow",
    "tandem.loggers.wandb",
    "tandem.loggers.csv",
    "tandem.strategies.ddp",
    "tandem.strategies.fsdp",
    "tandem.strategies.data_parallel",
    "tandem.strategies.single_device",
    "tandem.callbacks.lr_finder",
    "tandem.callbacks.batch_size_finder",
    "tandem.callbacks.model_checkpoint",
    "tandem.callbacks.tqdm_progress",
    "tandem.callbacks.rich_progress",
    "torch.distributed.fsdp",
)

ADDED_BY_IMPORT = """
import json, sys
import torch
before = set(sys.modules)
import tandem
after_import = set(sys.modules)
tandem.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
print(json.dumps({"import": sorted(after_import - before), "trainer": sorted(set(sys.modules) - before)}))
"""


def _loaded(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [name for name in modules if any(name == p or name.startswith(p + ".") for p in prefixes)]


def test_import_tandem_loads_nothing_a_first_trainer_does_not_need():
    result = run_python(["-c", ADDED_BY_IMPORT])
    assert result.returncode == 0, result.stderr[-3000:]
    added = json.loads(result.stdout.strip().splitlines()[-1])
    assert any(name == "tandem.trainer.trainer" for name in added["import"])
    assert _loaded(added["import"], NOT_ON_IMPORT) == [], "import tandem loaded modules that should wait for first use"
    # the first Trainer loads the strategy it builds, and still none of the optional integrations
    assert "tandem.strategies.single_device" in added["trainer"]
    optional = tuple(p for p in NOT_ON_IMPORT if p != "tandem.strategies.single_device")
    assert _loaded(added["trainer"], optional) == [], "Trainer(...) loaded modules it does not use"
    # and no top-level package beyond these: a new one is a start-up cost every user pays
    packages = {name.partition(".")[0] for name in added["import"]}
    allowed = {"faulthandler", "hmac", "lightning_utilities", "packaging", "secrets", "sysconfig", "tandem"}
    assert packages <= allowed, f"import tandem now also loads {sorted(packages - allowed)}"


PUBLIC_NAMES = """
import importlib, sys
packages = ["tandem", "tandem.callbacks", "tandem.core", "tandem.loggers", "tandem.profilers", "tandem.strategies",
            "tandem.trainer", "tandem.tuner", "tandem.utilities", "tandem.cli"]
for package in packages:
    module = importlib.import_module(package)
    listed = set(dir(module))
    for name in module.__all__:
        assert name in listed, f"{package}.__dir__() does not list {name}"
        namespace = {}
        exec(f"from {package} import {name} as value", namespace)  # a lazy name resolves on this first read
        assert namespace["value"] is getattr(module, name), (package, name)
    try:
        getattr(module, "NoSuchName")
    except AttributeError:
        pass
    else:
        raise AssertionError(f"{package}.NoSuchName resolved")
print("all names resolve", len(packages))
"""


def test_every_name_in_each_packages_all_resolves_lazy_ones_included():
    result = run_python(["-c", PUBLIC_NAMES])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all names resolve 10" in result.stdout
