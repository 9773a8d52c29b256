"""tandem.cli.CLI in this process: building objects, subcommands, --print_config, --help, config.yaml and errors."""

from __future__ import annotations

import datetime
import pickle
from pathlib import Path

import pytest
import torch
import yaml

import tandem
from callbacks._fake import fake_trainer
from helpers import TinyModule, clear_launch_variables, loader
from tandem.callbacks import EarlyStopping, ModelCheckpoint
from tandem.cli import CLI, CLIError, LightningCLI, LRSchedulerCallable, OptimizerCallable, SaveConfigCallback
from tandem.cli.save_config import SAVED_MARK, saved_text
from tandem.loggers import CSVLogger
from tandem.strategies import DDPStrategy
from tandem.utilities.exceptions import TandemWarning

QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu"]


class Data(tandem.DataModule):
    """Random samples.

    Args:
        samples: how many.
        batch_size: samples per batch.
    """

    def __init__(self, samples: int = 64, batch_size: int = 16) -> None:
        super().__init__()
        self.samples = samples
        self.batch_size = batch_size

    def train_dataloader(self):
        return loader(self.samples, self.batch_size)

    def val_dataloader(self):
        return loader(32, 32)

    def test_dataloader(self):
        return loader(32, 32)


class SmallData(Data):
    def __init__(self, samples: int = 16) -> None:
        super().__init__(samples, batch_size=8)


class Injected(tandem.TrainingModule):
    """A module that takes its optimizer and scheduler from the config.

    Args:
        optimizer: builds the optimizer from the parameters.
        scheduler: builds the scheduler from the optimizer.
    """

    def __init__(
        self, optimizer: OptimizerCallable = torch.optim.Adam, scheduler: LRSchedulerCallable | None = None
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(8, 3)

    def configure_optimizers(self):
        optimizer = self.hparams.optimizer(self.parameters())
        if self.hparams.scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": self.hparams.scheduler(optimizer)}


def test_run_false_builds_the_model_datamodule_and_trainer_from_the_command_line():
    cli = CLI(
        TinyModule,
        Data,
        run=False,
        args=["--model.lr", "0.5", "--data.batch_size=8", "trainer.max_epochs=3", "--seed_everything", "5", *QUIET],
    )
    assert cli.subcommand is None and LightningCLI is CLI
    assert isinstance(cli.model, TinyModule) and cli.model.hparams.lr == 0.5
    assert isinstance(cli.datamodule, Data) and cli.datamodule.batch_size == 8
    assert isinstance(cli.trainer, tandem.Trainer) and cli.trainer.max_epochs == 3
    assert cli.config.trainer.max_epochs == 3 and cli.config["model"]["lr"] == 0.5 and cli.config.seed_everything == 5
    assert "ckpt_path" not in cli.config  # no subcommand, no Trainer method arguments
    assert any(isinstance(c, SaveConfigCallback) for c in cli.trainer.callbacks)


def test_class_paths_build_callbacks_loggers_strategies_and_a_datamodule_subclass(tmp_path):
    (tmp_path / "run.yaml").write_text(
        "trainer:\n"
        "  callbacks:\n"
        "    - {class_path: EarlyStopping, init_args: {monitor: val_loss, patience: 2}}\n"
        "    - class_path: tandem.callbacks.ModelCheckpoint\n"
        "      init_args: {monitor: val_loss, save_top_k: 2}\n"
        f"  logger: {{class_path: CSVLogger, init_args: {{save_dir: {tmp_path}, name: csv}}}}\n"
        "  strategy: {class_path: DDPStrategy, init_args: {find_unused_parameters: true, timeout: 90}}\n"
        "  devices: 1\n"
        "data: {class_path: SmallData, init_args: {samples: 24}}\n"
    )
    cli = CLI(TinyModule, Data, run=False, args=["--config", str(tmp_path / "run.yaml"), *QUIET])
    early, checkpoint = cli.trainer.callbacks[0], cli.trainer.callbacks[-1]  # checkpoint callbacks last, as Lightning
    assert isinstance(early, EarlyStopping) and early.patience == 2
    assert isinstance(checkpoint, ModelCheckpoint) and checkpoint.save_top_k == 2
    assert isinstance(cli.trainer.logger, CSVLogger) and cli.trainer.logger.name == "csv"
    strategy = cli.trainer.strategy
    assert isinstance(strategy, DDPStrategy) and strategy.ddp_kwargs["find_unused_parameters"] is True
    assert strategy.timeout == datetime.timedelta(seconds=90)  # seconds in YAML
    assert type(cli.datamodule) is SmallData and cli.datamodule.samples == 24
    assert cli.config.data.class_path.endswith("SmallData")


def test_an_optimizer_and_scheduler_given_where_the_module_accepts_them():
    args = ["--model.optimizer", "SGD", "--model.optimizer.lr", "0.5", "--model.optimizer.momentum=0.9"]
    cli = CLI(Injected, run=False, args=[*args, "--model.scheduler", "{class_path: StepLR, init_args: {step_size: 3}}"])
    configured = cli.model.configure_optimizers()
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]
    assert (
        type(optimizer) is torch.optim.SGD and optimizer.defaults["lr"] == 0.5 and optimizer.defaults["momentum"] == 0.9
    )
    assert type(scheduler) is torch.optim.lr_scheduler.StepLR and scheduler.step_size == 3
    assert cli.config.model.optimizer.class_path == "torch.optim.SGD"
    default = CLI(Injected, run=False, args=[])
    assert default.config.model.optimizer.class_path == "torch.optim.Adam"  # the signature's default, written out
    assert type(default.model.configure_optimizers()) is torch.optim.Adam
    with pytest.raises(
        CLIError, match=r"model\.optimizer\.class_path='StepLR': .*not a subclass of torch\.optim\.Optimizer"
    ):
        CLI(Injected, run=False, args=["--model.optimizer", "StepLR"])


def test_fit_runs_the_subcommand_with_the_trainer_methods_arguments(tmp_path, capsys):
    cli = CLI(
        TinyModule,
        Data,
        args=[
            "fit",
            "--trainer.max_epochs",
            "2",
            f"--trainer.default_root_dir={tmp_path}",
            *QUIET,
            "--trainer.callbacks+=ModelCheckpoint",  # last.ckpt, for --ckpt_path last
            "--trainer.callbacks.init_args.save_last=true",
        ],
    )
    assert cli.subcommand == "fit" and cli.trainer.current_epoch == 2 and cli.config.ckpt_path is None
    saved = tmp_path / "tandem_logs" / "version_0" / "config.yaml"
    assert yaml.safe_load(saved.read_text()) == yaml.safe_load(yaml.safe_dump(dict_of(cli)))
    resumed = CLI(
        TinyModule,
        Data,
        args=["fit", "--config", str(saved), "--ckpt_path", "last", "--trainer.max_epochs", "3"],
    )
    assert resumed.trainer.global_step == 3 * 4  # 2 epochs from last.ckpt, then one more of 4 batches
    (result,) = CLI(TinyModule, Data, args=["test", "--config", str(saved), "--ckpt_path", "last"]).result
    assert "test_loss" in result
    printed = capsys.readouterr().out  # the Trainer's results table (verbose=True), once
    assert printed.count("Test metric") == 1 and "test_loss" in printed


def dict_of(cli: CLI) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cli.config)


def test_print_config_round_trips_through_config(tmp_path, capsys):
    args = ["fit", "--model.lr", "0.3", "--trainer.callbacks", "[{class_path: EarlyStopping, monitor: val_loss}]"]
    with pytest.raises(SystemExit) as exit_info:
        CLI(TinyModule, Data, args=[*args, "--print_config"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out
    config = yaml.safe_load(printed)
    assert isinstance(config["seed_everything"], int)  # the random seed, fixed in the printout
    assert config["model"]["lr"] == 0.3 and config["trainer"]["callbacks"][0]["init_args"]["patience"] == 3
    (tmp_path / "printed.yaml").write_text(printed)
    with pytest.raises(SystemExit):
        CLI(TinyModule, Data, args=["fit", "--config", str(tmp_path / "printed.yaml"), "--print_config"])
    assert capsys.readouterr().out == printed  # the same run, to the letter


def test_help_lists_each_section_with_types_defaults_and_docstring_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        CLI(TinyModule, Data, args=["fit", "--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--model.lr FLOAT (type: float, default: 0.1)" in out
    assert "--model.optimizer STR (type: str, default: sgd)" in out
    assert "--data.batch_size INT samples per batch. (type: int, default: 16)" in out
    assert "--trainer.max_epochs VALUE stop after this many epochs" in out
    assert "--ckpt_path VALUE" in out and "'last'" in out
    with pytest.raises(SystemExit):
        CLI(TinyModule, Data, args=["--help"])
    top = capsys.readouterr().out
    assert "fit" in top and "validate" in top and "predict" in top
    # cross-references in the docstrings print as names
    assert "or a Strategy instance" in out and "one dict per loader (see validate)." in " ".join(top.split())
    assert not [text for text in (out, top) if "][" in text or ":class:" in text or ":meth:" in text]


def test_errors_exit_with_status_2_and_one_message_before_anything_is_built(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        CLI(TinyModule, Data, args=["fit", "--model.lr", "abc"], exit_on_error=True)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: model.lr='abc' is not valid: expected float." in err and "Traceback" not in err
    with pytest.raises(CLIError, match=r"Unknown subcommand 'fitt'\. Did you mean 'fit'\?"):
        CLI(TinyModule, Data, args=["fitt"])
    with pytest.raises(CLIError, match="Choose a subcommand first"):
        CLI(TinyModule, Data, args=["--trainer.max_epochs", "1"])
    with pytest.raises(CLIError, match=r"trainer\.strategy='bogus' is not valid; expected one of"):
        CLI(TinyModule, Data, args=["fit", "--trainer.strategy", "bogus"])
    with pytest.raises(CLIError, match=r"trainer\.devices=0 is out of range"):
        CLI(TinyModule, Data, args=["fit", "--trainer.devices", "0", "--trainer.accelerator", "cpu"])
    with pytest.raises(CLIError, match=r"model\.class_path is required"):
        CLI(args=["fit"])
    assert list(Path.cwd().iterdir()) == []  # no run folder, no config.yaml


def test_model_class_none_takes_any_module_by_class_path():
    cli = CLI(run=False, args=["--model", "helpers.TinyModule", "--model.lr", "0.2"])
    assert type(cli.model) is TinyModule and cli.model.hparams.lr == 0.2
    assert cli.config.model.class_path == "helpers.TinyModule" and cli.datamodule is None


def test_trainer_defaults_and_a_trainer_subclass_with_its_own_argument():
    class MyTrainer(tandem.Trainer):
        def __init__(self, note: str = "none", **kwargs) -> None:
            super().__init__(**kwargs)
            self.note = note

    extra = EarlyStopping(monitor="val_loss")
    cli = CLI(
        TinyModule,
        run=False,
        trainer_class=MyTrainer,
        trainer_defaults={"max_epochs": 7, "callbacks": [extra]},
        args=["--trainer.note", "hello", *QUIET],
    )
    assert isinstance(cli.trainer, MyTrainer) and cli.trainer.note == "hello" and cli.trainer.max_epochs == 7
    assert extra in cli.trainer.callbacks and cli.config.trainer.max_epochs == 7
    assert cli.config.trainer.callbacks is None  # objects given as defaults are not config


def test_seed_true_is_random_and_the_ranks_tandem_starts_take_rank_0s(monkeypatch):
    clear_launch_variables(monkeypatch)
    seeds = {CLI(TinyModule, run=False, args=[]).config.seed_everything for _ in range(3)}
    assert len(seeds) == 3 and all(isinstance(s, int) for s in seeds)
    started = {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "TANDEM_LAUNCHER_PID": "1",
        "TANDEM_GLOBAL_SEED": "1234",
    }
    for name, value in started.items():
        monkeypatch.setenv(name, value)
    assert CLI(TinyModule, run=False, args=[]).config.seed_everything == 1234
    clear_launch_variables(monkeypatch)
    torchrun = {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    with pytest.warns(UserWarning, match="Set seed_everything to a number"):
        CLI(TinyModule, run=False, args=[])
    clear_launch_variables(monkeypatch)
    torch.manual_seed(0)
    assert CLI(TinyModule, run=False, args=["--seed_everything", "false"]).config.seed_everything is False


def test_config_yaml_refuses_to_replace_a_different_one_unless_overwrite(tmp_path):
    args = ["fit", "--trainer.logger", "false", f"--trainer.default_root_dir={tmp_path}", "--trainer.max_epochs=1"]
    args += ["--seed_everything", "1", *QUIET]
    CLI(TinyModule, Data, args=args)
    saved = tmp_path / "config.yaml"
    first = saved.read_text()
    with pytest.warns(TandemWarning, match="Checkpoint directory .* exists and is not empty"):
        CLI(TinyModule, Data, args=args)  # the same config: nothing to refuse (the checkpoints of the first run stay)
    checkpoints = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    with pytest.raises(CLIError, match=r"already holds a different config.*pass --overwrite"):
        CLI(TinyModule, Data, args=[*args, "--model.lr", "0.5"])
    assert saved.read_text() == first and sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == checkpoints
    with pytest.warns(TandemWarning, match="Checkpoint directory .* exists and is not empty"):
        CLI(TinyModule, Data, args=[*args, "--model.lr", "0.5", "--overwrite"])
    assert "lr: 0.5" in saved.read_text()


def test_save_config_callback_writes_on_rank_0_and_every_rank_refuses_together(tmp_path):
    channel: list = []
    ranks = [fake_trainer(tmp_path, rank=r, channel=channel) for r in (0, 1)]
    for trainer in ranks:
        SaveConfigCallback("a: 1\n").setup(trainer, None, "fit")
    assert (tmp_path / "config.yaml").read_text() == saved_text("a: 1\n")
    for trainer in ranks:
        with pytest.raises(CLIError, match="already holds a different config"):
            SaveConfigCallback("a: 2\n").setup(trainer, None, "fit")
    callback = pickle.loads(pickle.dumps(SaveConfigCallback("a: 2\n", overwrite=True)))  # ddp_spawn pickles it
    callback.setup(ranks[0], None, "fit")
    assert (tmp_path / "config.yaml").read_text() == saved_text("a: 2\n")
    quick = fake_trainer(tmp_path / "dev", fast_dev_run=1)
    SaveConfigCallback("a: 3\n").setup(quick, None, "fit")
    assert not (tmp_path / "dev").exists()


def test_a_config_yaml_tandem_did_not_save_is_never_called_another_runs_nor_offered_to_overwrite(tmp_path):
    """With ``trainer.logger: false`` the run's folder is default_root_dir, where the user's own config.yaml often
    is: the error says it is not a config tandem saved, and suggests another folder or file name, not --overwrite."""
    mine = tmp_path / "config.yaml"
    mine.write_text("# my own settings\nmodel:\n  lr: 0.2\n")
    args = ["fit", "--trainer.logger", "false", f"--trainer.default_root_dir={tmp_path}", "--trainer.max_epochs=1"]
    with pytest.raises(CLIError) as caught:
        CLI(TinyModule, Data, args=[*args, *QUIET])
    message = str(caught.value)
    assert "is not a config tandem saved" in message and "probably a file of yours" in message
    assert "config_filename" in message and "--trainer.default_root_dir" in message
    assert "another run" not in message and "--overwrite" not in message
    assert mine.read_text() == "# my own settings\nmodel:\n  lr: 0.2\n"
    # the config tandem saves starts with its mark, so a later run tells it from a file of the user's
    CLI(TinyModule, Data, args=[*args, *QUIET], save_config_kwargs={"config_filename": "run.yaml"})
    assert (tmp_path / "run.yaml").read_text().startswith(SAVED_MARK)


def test_a_plain_override_that_replaces_a_config_list_says_so_and_shows_the_appending_spelling(tmp_path, capsys):
    config = tmp_path / "callbacks.yaml"
    config.write_text(
        "trainer:\n  callbacks:\n    - class_path: ModelCheckpoint\n    - class_path: LearningRateMonitor\n"
    )
    override = ["--trainer.callbacks", "EarlyStopping", "--trainer.callbacks.monitor", "train_loss"]
    cli = CLI(TinyModule, run=False, args=["--config", str(config), *override, *QUIET])
    kinds = [type(c).__name__ for c in cli.trainer.callbacks]
    assert "EarlyStopping" in kinds and "LearningRateMonitor" not in kinds  # the list was replaced
    err = capsys.readouterr().err
    assert "--trainer.callbacks EarlyStopping replaced the list the config gave trainer.callbacks" in err
    assert "2 items: ModelCheckpoint, LearningRateMonitor" in err and "--trainer.callbacks+=EarlyStopping" in err
    appended = ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor", "train_loss"]
    cli = CLI(TinyModule, run=False, args=["--config", str(config), *appended, *QUIET])
    kinds = [type(c).__name__ for c in cli.trainer.callbacks]
    assert "ModelCheckpoint" in kinds and "LearningRateMonitor" in kinds and "EarlyStopping" in kinds
    assert "replaced" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "expected"),
    [("yes", True), ("True", True), ("true", True), ("no", False), ("false", False), ("link", "link"), ("null", None)],
)
def test_model_checkpoint_save_last_takes_a_bool_or_link(value, expected):
    """``save_last: bool | Literal["link"] | None``, a type object the parsers read (not a string), as Lightning's."""
    import inspect
    from typing import Literal

    assert inspect.signature(ModelCheckpoint).parameters["save_last"].annotation == bool | Literal["link"] | None
    cli = CLI(
        TinyModule,
        args=[*QUIET, "--trainer.callbacks+=ModelCheckpoint", f"--trainer.callbacks.save_last={value}"],
        run=False,
    )
    (checkpoint,) = [c for c in cli.trainer.callbacks if isinstance(c, ModelCheckpoint)]
    assert checkpoint.save_last == expected and type(checkpoint.save_last) is type(expected)
