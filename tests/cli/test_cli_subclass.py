"""A CLI subclass as Lightning's docs write one (add_arguments_to_parser, hooks, links), list appends with +=,
nested optimizer arguments, --print_config with values still to give, and the user's own config.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

import tandem
from helpers import TinyModule, loader
from tandem.callbacks import Callback, EarlyStopping, ModelCheckpoint
from tandem.cli import CLI, CLIError, LightningArgumentParser, LightningCLI, OptimizerCallable

QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu"]
CALLS: list[str] = []


class ClassData(tandem.DataModule):
    """Random samples of ``num_classes`` classes."""

    def __init__(self, batch_size: int = 16, samples: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.samples = samples
        self.num_classes = 3  # known once the data is there, as in Lightning's docs

    def train_dataloader(self):
        return loader(self.samples, self.batch_size)


class Classifier(TinyModule):
    """A module whose width comes from the data."""

    def __init__(self, num_classes: int, batch_size: int, lr: float = 0.1) -> None:
        super().__init__(lr=lr)
        self.save_hyperparameters()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Unfreeze(Callback):
    """A finetuning callback configured under its own key.

    Args:
        at_epoch: the epoch to unfreeze the backbone at.
    """

    def __init__(self, at_epoch: int = 10) -> None:
        self.at_epoch = at_epoch


class MyCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        assert isinstance(parser, LightningArgumentParser)
        parser.add_lightning_class_args(EarlyStopping, "my_early_stopping")
        parser.add_lightning_class_args(Unfreeze, "unfreeze")
        parser.set_defaults({"my_early_stopping.monitor": "train_loss", "my_early_stopping.patience": 5})
        parser.set_defaults({"trainer.max_epochs": 15})
        parser.add_argument("--notes", type=str, default="none", help="free text")
        parser.link_arguments("data.batch_size", "model.batch_size")
        parser.link_arguments("data", "model.num_classes", compute_fn=lambda d: d.num_classes, apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        CALLS.append(f"before_instantiate:{self.config.trainer.max_epochs}")

    def after_instantiate_classes(self) -> None:
        CALLS.append(f"after_instantiate:{type(self.trainer).__name__}")

    def before_fit(self) -> None:
        CALLS.append("before_fit")

    def after_fit(self) -> None:
        CALLS.append(f"after_fit:{self.trainer.current_epoch}")


def test_a_cli_subclass_adds_class_args_defaults_links_and_arguments(capsys):
    CALLS.clear()
    args = ["--my_early_stopping.patience", "7", "--unfreeze.at_epoch=2", "--data.batch_size=8", "--notes", "hi"]
    cli = MyCLI(Classifier, ClassData, run=False, args=[*args, *QUIET])
    assert cli.trainer.max_epochs == 15  # set_defaults, not the Trainer's 1000
    (early,) = [c for c in cli.trainer.callbacks if isinstance(c, EarlyStopping)]
    assert early.patience == 7 and early.monitor == "train_loss"
    (unfreeze,) = [c for c in cli.trainer.callbacks if isinstance(c, Unfreeze)]
    assert unfreeze.at_epoch == 2 and cli.config_init.unfreeze is unfreeze
    assert cli.model.hparams.batch_size == 8 and cli.config.model.batch_size == 8  # linked on parse
    assert cli.model.hparams.num_classes == 3  # linked from the built datamodule
    assert cli.config.notes == "hi" and cli.config_init["model"] is cli.model and cli.datamodule is cli.config_init.data
    assert CALLS == ["before_instantiate:15", "after_instantiate:Trainer"]
    with pytest.raises(SystemExit):
        MyCLI(Classifier, ClassData, run=False, args=[*args, "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["my_early_stopping"]["patience"] == 7 and printed["unfreeze"] == {"at_epoch": 2}
    assert "batch_size" not in printed["model"] and "num_classes" not in printed["model"]  # computed, not config
    with pytest.raises(CLIError, match=r"model\.batch_size is set from data\.batch_size"):
        MyCLI(Classifier, ClassData, run=False, args=["--model.batch_size", "4"])


def test_a_cli_subclass_runs_its_subcommand_hooks(tmp_path):
    CALLS.clear()
    args = ["fit", "--trainer.max_epochs=1", "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}"]
    cli = MyCLI(Classifier, ClassData, args=[*args, *QUIET])
    assert CALLS == ["before_instantiate:1", "after_instantiate:Trainer", "before_fit", "after_fit:1"]
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["unfreeze"] == {"at_epoch": 10}
    assert cli.trainer.global_step == 2


def test_add_optimizer_args_gives_the_model_its_configure_optimizers():
    class OptimizerCLI(CLI):
        def add_arguments_to_parser(self, parser):
            parser.add_optimizer_args(torch.optim.SGD)
            parser.add_lr_scheduler_args(torch.optim.lr_scheduler.StepLR)

    args = ["--optimizer.lr", "0.3", "--lr_scheduler.step_size", "4"]
    with pytest.warns(UserWarning, match="configure_optimizers is replaced"):
        cli = OptimizerCLI(TinyModule, run=False, args=args)
    [optimizer], [scheduler] = cli.model.configure_optimizers()
    assert type(optimizer) is torch.optim.SGD and optimizer.defaults["lr"] == 0.3 and scheduler.step_size == 4


def test_plus_equals_appends_items_and_the_options_after_it_set_the_last_one(tmp_path):
    (tmp_path / "run.yaml").write_text("trainer:\n  callbacks:\n    - {class_path: Unfreeze}\n")
    args = ["--config", str(tmp_path / "run.yaml"), "--trainer.callbacks+=EarlyStopping"]
    args += ["--trainer.callbacks.monitor=val_loss", "--trainer.callbacks.patience", "3"]
    args += ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.init_args.save_top_k=2"]
    args += ["--trainer.callbacks.init_args.monitor=val_loss"]
    cli = CLI(TinyModule, run=False, args=args)
    configured = [c for c in cli.trainer.callbacks if isinstance(c, (Unfreeze, EarlyStopping, ModelCheckpoint))]
    unfreeze, early, checkpoint = configured[:3]  # the configured ones, in order, before the Trainer's own
    assert isinstance(unfreeze, Unfreeze) and early.patience == 3 and early.monitor == "val_loss"
    assert isinstance(checkpoint, ModelCheckpoint) and checkpoint.save_top_k == 2
    paths = [c["class_path"].rsplit(".", 1)[1] for c in cli.config.trainer.callbacks]
    assert paths == ["Unfreeze", "EarlyStopping", "ModelCheckpoint"]
    alone = CLI(TinyModule, run=False, args=["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=a"])
    assert [c.monitor for c in alone.trainer.callbacks if isinstance(c, EarlyStopping)] == ["a"]


class Injected(tandem.TrainingModule):
    def __init__(self, optimizer: OptimizerCallable = torch.optim.Adam) -> None:
        super().__init__()
        self.optimizer = optimizer
        self.net = torch.nn.Linear(2, 2)


def test_a_nested_option_sets_the_init_args_of_the_default_class():
    cli = CLI(Injected, run=False, args=["--model.optimizer.lr", "0.01"])
    assert cli.config.model.optimizer.class_path == "torch.optim.Adam"
    assert cli.config.model.optimizer.init_args.lr == 0.01
    optimizer = cli.model.optimizer(cli.model.parameters())
    assert type(optimizer) is torch.optim.Adam and optimizer.defaults["lr"] == 0.01
    spelled_out = CLI(Injected, run=False, args=["--model.optimizer.init_args.weight_decay", "0.5"])
    assert spelled_out.config.model.optimizer.init_args.weight_decay == 0.5


def test_print_config_prints_values_still_to_give_and_names_them(capsys):
    with pytest.raises(SystemExit) as exit_info:
        CLI(Classifier, run=False, args=["--model.batch_size=4", "--print_config"])
    assert exit_info.value.code == 0  # a template, as jsonargparse prints one
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["model"]["num_classes"] == "???"
    assert "still to be given" in err and "model.num_classes" in err and "batch_size" not in err


def test_the_run_never_saves_its_config_over_a_config_file_it_reads(tmp_path):
    mine = tmp_path / "config.yaml"
    mine.write_text("# my own settings\nmodel:\n  lr: 0.2\ntrainer:\n  max_epochs: 1\n  logger: false\n")
    args = ["fit", "--config", str(mine), f"--trainer.default_root_dir={tmp_path}", *QUIET]
    for extra in ([], ["--overwrite"]):
        with pytest.raises(CLIError, match=r"is a config file this run reads.*even with --overwrite"):
            CLI(TinyModule, ClassData, args=[*args, *extra])
    with pytest.raises(CLIError, match="is a config file this run reads"):
        CLI(TinyModule, ClassData, args=args, save_config_kwargs={"overwrite": True})
    assert mine.read_text().startswith("# my own settings") and not (tmp_path / "checkpoints").exists()
    CLI(TinyModule, ClassData, args=[*args, f"--trainer.default_root_dir={tmp_path / 'run'}"])
    assert Path(tmp_path / "run" / "config.yaml").is_file()


def test_parser_kwargs_default_config_files_and_a_mapping_of_args(tmp_path):
    (tmp_path / "defaults.yaml").write_text("trainer:\n  max_epochs: 4\nmodel:\n  lr: 0.5\n")
    options = {"default_config_files": [str(tmp_path / "*.yaml")]}
    cli = CLI(TinyModule, run=False, parser_kwargs=options, args={"model": {"lr": 0.25}})
    assert cli.trainer.max_epochs == 4 and cli.model.hparams.lr == 0.25  # the file, under the given mapping
    with pytest.raises(TypeError, match="default_env=True is not supported"):
        CLI(TinyModule, run=False, parser_kwargs={"default_env": True}, args=[])


def test_a_save_config_subclass_saves_elsewhere_on_rank_0(tmp_path):
    from tandem.cli import SaveConfigCallback

    class ToLogger(SaveConfigCallback):
        def save_config(self, trainer, module, stage):
            CALLS.append(self.config)

    CALLS.clear()
    args = ["fit", "--trainer.max_epochs=1", "--trainer.limit_train_batches=1", *QUIET, "--seed_everything=3"]
    CLI(TinyModule, ClassData, save_config_callback=ToLogger, save_config_kwargs={"save_to_log_dir": False}, args=args)
    assert len(CALLS) == 1 and "seed_everything: 3" in CALLS[0] and not list(tmp_path.rglob("config.yaml"))
    with pytest.raises(ValueError, match="save_to_log_dir=False saves nothing"):
        SaveConfigCallback("a: 1\n", save_to_log_dir=False)
