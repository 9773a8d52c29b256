import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import ModelCheckpoint
from tandem.loggers import CSVLogger, Logger, TensorBoardLogger
from tandem.loggers.logger import load_hparams_yaml, save_hparams_yaml
from tandem.utilities.rank_zero import rank_zero_only

LOGGERS = [CSVLogger, TensorBoardLogger]


@pytest.mark.parametrize("logger_cls", LOGGERS)
def test_version_is_the_next_free_version_folder(tmp_path, logger_cls):
    assert logger_cls(tmp_path).version == 0  # no experiment folder yet
    root = tmp_path / "exp"
    for name in ("version_0", "version_3", "version_x", "other"):
        (root / name).mkdir(parents=True)
    (root / "version_9").write_text("a file, not a run folder")
    logger = logger_cls(tmp_path, name="exp")
    assert logger.version == 4
    (root / "version_4").mkdir()
    assert logger.version == 4  # resolved once, so every later read agrees
    assert logger.log_dir == str(root / "version_4")


@pytest.mark.parametrize("logger_cls", LOGGERS)
def test_version_is_settable_and_a_str_version_is_the_folder_name(tmp_path, logger_cls):
    logger = logger_cls(tmp_path, name="exp")
    logger.version = 7  # what the Trainer does with the version broadcast from rank 0
    assert logger.version == 7
    assert logger.log_dir == os.path.join(str(tmp_path), "exp", "version_7")
    named = logger_cls(tmp_path, name="exp", version="baseline")
    assert named.log_dir == os.path.join(str(tmp_path), "exp", "baseline")
    assert (named.name, named.save_dir) == ("exp", str(tmp_path))
    assert logger_cls(tmp_path, name="").log_dir == os.path.join(str(tmp_path), "version_0")


@pytest.mark.parametrize("logger_cls", LOGGERS)
def test_nothing_is_created_before_the_first_write(tmp_path, logger_cls):
    logger = logger_cls(tmp_path / "runs")
    assert logger.log_dir.endswith(os.path.join("tandem_logs", "version_0"))
    logger.save()
    logger.finalize("success")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("logger_cls", LOGGERS)
def test_hparams_yaml_holds_plain_values_and_str_of_the_rest(tmp_path, logger_cls):
    logger = logger_cls(tmp_path)
    logger.log_hyperparams(argparse.Namespace(lr=0.1, layers=[64, 32], name="mlp", data=Path("/data/x")))
    nested = {"betas": (0.9, 0.99), "nesterov": True}
    logger.log_hyperparams({"act": torch.nn.ReLU(), "opt": nested, "seed": None})
    logger.finalize("success")
    loaded = load_hparams_yaml(Path(logger.log_dir) / "hparams.yaml")
    assert loaded == {
        "lr": 0.1,
        "layers": [64, 32],
        "name": "mlp",
        "data": "/data/x",
        "act": "ReLU()",
        "opt": {"betas": [0.9, 0.99], "nesterov": True},
        "seed": None,
    }


def test_hparams_yaml_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "hparams.yaml"
    save_hparams_yaml(path, {"a": 1})
    save_hparams_yaml(path, {"b": object})
    assert load_hparams_yaml(path) == {"b": "<class 'object'>"}
    assert os.listdir(tmp_path) == ["hparams.yaml"]  # no temporary file left behind


@pytest.mark.parametrize("logger_cls", LOGGERS)
def test_other_ranks_write_nothing(tmp_path, logger_cls):
    logger = logger_cls(tmp_path)
    rank_zero_only.rank = 1
    try:
        logger.log_hyperparams({"lr": 0.1})
        logger.log_metrics({"loss": 1.0}, step=0)
        logger.save()
        logger.finalize("success")
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_scalar("x", 1.0, 0)  # a no-op stand-in, not a SummaryWriter
    finally:
        rank_zero_only.rank = 0
    assert list(tmp_path.iterdir()) == []


def test_a_custom_logger_needs_only_the_two_log_methods(tmp_path):
    class ListLogger(Logger):
        def __init__(self):
            super().__init__(tmp_path, name="custom")
            self.rows = []

        def log_metrics(self, metrics, step):
            self.rows.append((step, dict(metrics)))

        def log_hyperparams(self, params):
            self._save_hparams_yaml(params)

    logger = ListLogger()
    logger.log_metrics({"a": 1.0}, step=3)
    logger.log_hyperparams({"lr": 0.1})
    logger.finalize("success")
    assert logger.rows == [(3, {"a": 1.0})]
    assert load_hparams_yaml(tmp_path / "custom" / "version_0" / "hparams.yaml") == {"lr": 0.1}
    with pytest.raises(TypeError):
        Logger(tmp_path)  # abstract


def test_importing_tandem_and_the_loggers_imports_no_logging_backend():
    code = (
        "import sys, tandem, tandem.loggers; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorboard', 'omegaconf', 'mlflow', 'wandb') "
        "or m.startswith('torch.utils.tensorboard')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_logger_without_a_local_folder_leaves_the_folders_to_default_root_dir(tmp_path):
    class RemoteLogger(Logger):  # as MLFlowLogger with a tracking server: no local folder at all
        save_dir = root_dir = log_dir = None

        def log_metrics(self, metrics, step):
            pass

        def log_hyperparams(self, params):
            pass

    def fit(**kwargs):
        checkpoint = ModelCheckpoint(save_last=True)
        trainer = quiet_trainer(
            logger=RemoteLogger(tmp_path / "unused"),
            default_root_dir=tmp_path,
            enable_checkpointing=True,
            callbacks=[checkpoint],
            max_epochs=kwargs.pop("max_epochs", 1),
        )
        trainer.fit(TinyModule(), loader(), **kwargs)
        return trainer, checkpoint

    trainer, checkpoint = fit()
    assert trainer.log_dir == str(tmp_path)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["epoch=0-step=4.ckpt", "last.ckpt"]
    trainer, _ = fit(max_epochs=2, ckpt_path="last")  # found under default_root_dir
    assert trainer.global_step == 8
