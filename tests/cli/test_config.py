"""Parsing, layering, interpolation, types and errors of tandem.cli.config, .arguments and .class_paths, with no processes."""

from __future__ import annotations

import os
from typing import Literal

import pytest
import torch

import tandem
from tandem.callbacks import Callback, EarlyStopping, ModelCheckpoint
from tandem.cli.arguments import docstring_args, signature, type_name
from tandem.cli.class_paths import class_path_of, resolve_class
from tandem.cli.config.build import build_section, build_value
from tandem.cli.config.check import check, check_value
from tandem.cli.config.complete import complete
from tandem.cli.config.layers import layer
from tandem.cli.config.request import Request, parse_argv
from tandem.cli.config.schema import Schema, Section
from tandem.cli.config.yaml_io import load_config_file, parse_value, resolve, to_yaml
from tandem.cli.errors import CLIError


class Model(tandem.TrainingModule):
    """A module for the schema below.

    Args:
        hidden: width of the hidden layer.
        lr / momentum: SGD's settings,
            on two lines.
        kind (str): which kind.
        sizes: layer sizes.
    """

    def __init__(
        self,
        hidden: int,
        lr: float = 0.1,
        momentum: float = 0.0,
        kind: Literal["a", "b"] = "a",
        sizes: tuple[int, int] = (4, 2),
        tag: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()


class Bigger(Model):
    def __init__(self, hidden: int = 64, depth: int = 2) -> None:
        super().__init__(hidden)
        self.depth = depth


def schema() -> Schema:
    from tandem.cli.arguments import Parameter

    values = {"seed_everything": Parameter("seed_everything", bool | int, True)}
    sections = {
        "trainer": Section("trainer", tandem.Trainer, tandem.Trainer, class_path_allowed=False),
        "model": Section("model", Model, Model, required=True),
    }
    return Schema(values, sections, ("seed_everything", "trainer", "model"))


def config_from(*argv: str, allow_missing: bool = False) -> dict:
    return check(schema(), resolve(complete(schema(), layer(parse_argv(list(argv))))), allow_missing)


# ---------------------------------------------------------------------------------------------- argv
def test_overrides_in_both_spellings_and_the_dotlist_are_read_in_order():
    request = parse_argv(
        ["--trainer.max_epochs", "5", "--model.lr=0.01", "trainer.max_steps=7", "-c", "a.yaml", "--config=b.yaml"]
    )
    assert request.overrides == [("trainer.max_epochs", "5"), ("model.lr", "0.01"), ("trainer.max_steps", "7")]
    assert request.configs == ["a.yaml", "b.yaml"]
    flags = parse_argv(["--print_config", "--overwrite", "--trainer.max_steps", "-1"])
    assert flags.print_config and flags.overwrite and flags.overrides == [("trainer.max_steps", "-1")]


def test_command_line_values_are_yaml():
    assert parse_value("1e-3") == 0.001 and parse_value("5") == 5 and parse_value("true") is True
    assert parse_value("null") is None and parse_value("[1, 2]") == [1, 2] and parse_value("0,1") == "0,1"
    assert parse_value("{class_path: EarlyStopping}") == {"class_path": "EarlyStopping"}
    assert parse_value("${model.hidden}") == "${model.hidden}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model.lr"], "--model.lr needs a value"),
        (["--model.lr", "--trainer.max_epochs", "3"], "--model.lr needs a value"),
        (["stray"], "Unexpected argument 'stray'"),
        (["--config"], "--config needs a file"),
    ],
)
def test_malformed_command_lines_are_refused(argv, message):
    with pytest.raises(CLIError, match=message):
        parse_argv(argv)


# ---------------------------------------------------------------------------------------------- layering
def test_defaults_then_config_files_in_order_then_overrides(tmp_path):
    (tmp_path / "a.yaml").write_text("trainer: {max_epochs: 3, max_steps: 10}\nmodel: {hidden: 8, lr: 0.5}\n")
    (tmp_path / "b.yaml").write_text("trainer: {max_epochs: 4}\nmodel: {momentum: 0.9}\n")
    config = config_from("-c", str(tmp_path / "a.yaml"), "-c", str(tmp_path / "b.yaml"), "--model.lr", "0.25")
    assert config["trainer"]["max_epochs"] == 4 and config["trainer"]["max_steps"] == 10
    assert config["trainer"]["accumulate_grad_batches"] == 1  # the signature's default
    assert config["model"] == {"hidden": 8, "lr": 0.25, "momentum": 0.9, "kind": "a", "sizes": [4, 2], "tag": None}


def test_the_trainers_arguments_come_from_its_signature():
    config = config_from("--model.hidden", "1")
    parameters = [
        name for name in signature(tandem.Trainer).parameters if name in tandem.Trainer.__init__.__code__.co_varnames
    ]
    assert list(config["trainer"]) == parameters and "max_epochs" in parameters


def test_interpolation_resolves_after_defaults_and_reads_the_environment(monkeypatch):
    monkeypatch.setenv("HIDDEN_FROM_ENV", "32")
    config = config_from("--model.hidden", "${oc.env:HIDDEN_FROM_ENV}", "trainer.max_steps=${model.hidden}")
    assert config["model"]["hidden"] == 32 and config["trainer"]["max_steps"] == 32  # a YAML string made an int
    config = config_from("--model.hidden", "3", "--model.tag", "lr=${model.lr}")  # a default, interpolated
    assert config["model"]["tag"] == "lr=0.1"
    with pytest.raises(CLIError, match=r"model\.tag: the interpolation could not be resolved.*model\.nope"):
        config_from("--model.hidden", "3", "--model.tag", "${model.nope}")


def test_a_class_path_chooses_a_subclass_and_a_new_class_path_drops_the_old_init_args(tmp_path):
    config = config_from("--model.class_path", "Bigger", "--model.depth", "3")
    path = class_path_of(Bigger)
    assert config["model"] == {"class_path": path, "init_args": {"hidden": 64, "depth": 3}}
    (tmp_path / "a.yaml").write_text(
        f"model: {{class_path: {class_path_of(Model)}, init_args: {{hidden: 2, lr: 0.5}}}}"
    )
    (tmp_path / "b.yaml").write_text(f"model: {{class_path: {path}}}")
    config = config_from("-c", str(tmp_path / "a.yaml"), "-c", str(tmp_path / "b.yaml"))
    assert config["model"]["init_args"] == {"hidden": 64, "depth": 2}
    model = build_section(schema(), "model", config["model"])
    assert type(model) is Bigger and model.depth == 2


def test_the_sections_own_class_is_written_as_its_arguments():
    config = config_from("--model", class_path_of(Model), "--model.hidden", "5")
    assert config["model"]["hidden"] == 5 and "class_path" not in config["model"]


def test_callbacks_by_short_name_with_init_args_filled_and_indexed_overrides():
    config = config_from(
        "--model.hidden=1",
        "--trainer.callbacks",
        "[{class_path: EarlyStopping, init_args: {monitor: val_loss}}, ModelCheckpoint]",
        "--trainer.callbacks.0.patience",
        "7",
    )
    early, checkpoint = config["trainer"]["callbacks"]
    assert early["class_path"] == "tandem.callbacks.EarlyStopping"
    assert early["init_args"]["monitor"] == "val_loss" and early["init_args"]["patience"] == 7
    assert checkpoint["class_path"] == "tandem.callbacks.ModelCheckpoint" and "save_last" in checkpoint["init_args"]
    hint = signature(tandem.Trainer).parameters["callbacks"].hint
    built = build_value(config["trainer"]["callbacks"], hint)
    assert isinstance(built[0], EarlyStopping) and built[0].patience == 7 and isinstance(built[1], ModelCheckpoint)


def test_a_class_name_then_its_arguments_on_the_command_line():
    config = config_from("--model.hidden=1", "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", "logs")
    assert config["trainer"]["logger"]["class_path"] == "tandem.loggers.CSVLogger"
    logger = build_value(config["trainer"]["logger"], signature(tandem.Trainer).parameters["logger"].hint)
    assert type(logger).__name__ == "CSVLogger" and logger.save_dir == "logs"


# ---------------------------------------------------------------------------------------------- types
def test_values_are_checked_and_converted_to_their_type_hints():
    config = config_from("--model.hidden", "2", "--model.lr", "1", "--model.tag", "7", "--trainer.devices", "0,1")
    assert config["model"]["lr"] == 1.0 and isinstance(config["model"]["lr"], float)
    assert config["model"]["tag"] == "7" and config["trainer"]["devices"] == "0,1"
    assert config_from("--model.hidden=2", "--trainer.precision", "16")["trainer"]["precision"] == 16
    sizes = build_value([3, 1], signature(Model).parameters["sizes"].hint)
    assert sizes == (3, 1)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["model.lr=abc"], r"model\.lr='abc' is not valid: expected float\."),
        (["--trainer.max_epochs", "1.5"], r"trainer\.max_epochs=1\.5 is not valid: expected int \| None"),
        (["--model.kind", "c"], r"model\.kind='c' is not valid: expected 'a' \| 'b'"),
        (["--model.sizes", "[1, 2, 3]"], r"model\.sizes=\[1, 2, 3\] is not valid: expected tuple\[int, int\]"),
        (["--trainer.enable_progress_bar", "maybe"], r"expected bool"),
        (["--seed_everything", "x"], r"seed_everything='x' is not valid: expected bool \| int"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_key_and_the_expected_type(argv, message):
    with pytest.raises(CLIError, match=message):
        config_from("--model.hidden", "2", *argv)


def test_unknown_keys_name_the_closest_valid_ones():
    with pytest.raises(CLIError, match=r"Unknown key 'trainer\.max_epoch'\. Did you mean 'trainer\.max_epochs'"):
        config_from("--model.hidden=1", "--trainer.max_epoch", "3")
    with pytest.raises(CLIError, match=r"Unknown key 'modle'\. Did you mean 'model'\?"):
        config_from("modle.hidden=1")
    with pytest.raises(CLIError, match=r"Unknown key 'optimizer': .*`optimizer: tandem\.cli\.OptimizerCallable`"):
        config_from("--model.hidden=1", "--optimizer", "Adam")  # LightningCLI's own section: a hint to port it
    with pytest.raises(
        CLIError, match=r"Unknown key 'trainer\.callbacks\.0\.init_args\.patiense'.*init_args\.patience'?"
    ):
        config_from("--model.hidden=1", "--trainer.callbacks", "[{class_path: EarlyStopping, monitor: a, patiense: 1}]")


def test_a_missing_required_value_is_an_error_but_print_config_shows_it():
    with pytest.raises(CLIError, match=r"model\.hidden is required \(int, no default\)\. .* --model\.hidden VALUE"):
        config_from()
    assert config_from(allow_missing=True)["model"]["hidden"] == "???"
    with pytest.raises(CLIError, match=r"init_args\.monitor is required"):
        config_from("--model.hidden=1", "--trainer.callbacks", "[EarlyStopping]")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("torch.optim.SGD", "torch.optim.SGD is not a subclass of tandem.Callback"),
        ("no_such_package.Thing", "no module named 'no_such_package'"),
        ("tandem.callbacks.Nope", "module tandem.callbacks has no Nope"),
        ("EarlyStoping", "no class of that name is known. Did you mean 'EarlyStopping'"),
        ("tandem.callbacks", "tandem.callbacks is a module, not a class"),
    ],
)
def test_a_bad_class_path_says_why(value, message):
    with pytest.raises(CLIError, match=rf"trainer\.callbacks\.0\.class_path={value!r}: .*{message}"):
        config_from("--model.hidden=1", "--trainer.callbacks", f"[{{class_path: {value}}}]")


def test_an_ambiguous_short_name_asks_for_the_full_path():
    first = type("Twin", (Callback,), {"__module__": "first_place"})
    second = type("Twin", (Callback,), {"__module__": "second_place"})
    with pytest.raises(CLIError, match=r"ambiguous \(first_place\.Twin, second_place\.Twin\)"):
        resolve_class("Twin", Callback, "trainer.callbacks.0.class_path")
    del first, second


def test_config_files_that_are_missing_or_not_yaml_mappings(tmp_path):
    with pytest.raises(CLIError, match=r"--config nope\.yaml: no such file"):
        load_config_file("nope.yaml")
    with pytest.raises(CLIError, match="is a folder"):
        load_config_file(str(tmp_path))
    (tmp_path / "bad.yaml").write_text("trainer: [1, 2\n")
    with pytest.raises(CLIError, match=r"bad\.yaml: is not valid YAML: .*line"):
        load_config_file(str(tmp_path / "bad.yaml"))
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(CLIError, match="holds a YAML list; expected a mapping"):
        load_config_file(str(tmp_path / "list.yaml"))
    (tmp_path / "empty.yaml").write_text("")
    assert load_config_file(str(tmp_path / "empty.yaml")) == {}


# ---------------------------------------------------------------------------------------------- signatures
def test_help_text_comes_from_the_docstring_args():
    docs = docstring_args(Model.__doc__)
    assert docs["hidden"] == "width of the hidden layer."
    assert docs["lr"] == docs["momentum"] == "SGD's settings, on two lines."
    assert docs["kind"] == "which kind."
    assert signature(Model).parameters["hidden"].help == "width of the hidden layer."


def test_help_text_shows_names_for_links_and_roles():
    """--help prints a docstring's cross-references as the names they show: mkdocstrings links (tandem's own
    docstrings) and Sphinx roles (a user's)."""

    def documented(strategy, callbacks, plugins):
        """A function.

        Args:
            strategy: a name or a [`Strategy`][tandem.strategies.Strategy] instance.
            callbacks: [`Callback`][tandem.Callback]s, or [`EarlyStopping`][] alone.
            plugins: a :class:`~tandem.strategies.Precision` or ``None``.
        """

    docs = docstring_args(documented.__doc__)
    assert docs["strategy"] == "a name or a Strategy instance."
    assert docs["callbacks"] == "Callbacks, or EarlyStopping alone."
    assert docs["plugins"] == "a Precision or None."
    trainer = signature(tandem.Trainer).parameters
    assert "or a Strategy instance" in trainer["strategy"].help
    assert not [name for name, p in trainer.items() if "][" in p.help or ":class:" in p.help]


def test_kwargs_handed_to_super_bring_the_parents_arguments():
    class MyTrainer(tandem.Trainer):
        def __init__(self, note: str = "", **kwargs) -> None:
            super().__init__(**kwargs)
            self.note = note

    parameters = signature(MyTrainer).parameters
    assert list(parameters)[0] == "note" and "max_epochs" in parameters and not signature(MyTrainer).accepts_kwargs


def test_type_names_read_like_annotations():
    hints = {name: p.hint for name, p in signature(tandem.Trainer).parameters.items()}
    assert type_name(hints["devices"]) == "int | str | list[int]"
    assert type_name(hints["callbacks"]) == "Callback | Iterable[Callback] | None"
    assert type_name(signature(Model).parameters["kind"].hint) == "'a' | 'b'"


def test_optimizer_defaults_and_values_in_yaml_round_trip(tmp_path):
    hint = signature(torch.optim.Adam).parameters["betas"].hint
    assert check_value([0.8, 0.9], hint, "betas") == [0.8, 0.9]
    text = to_yaml({"model": {"lr": 1e-5, "betas": [0.9, 0.999], "path": None, "n": "n"}})
    (tmp_path / "c.yaml").write_text(text)
    assert load_config_file(str(tmp_path / "c.yaml")) == {
        "model": {"lr": 1e-5, "betas": [0.9, 0.999], "path": None, "n": "n"}
    }
    assert os.path.exists(tmp_path / "c.yaml") and Request().configs == []


def test_a_class_callable_pickled_when_config_was_one_module_still_loads():
    """``ClassCallable`` was ``tandem.cli.config.ClassCallable`` before ``config`` became a package; a pickle that
    names it there (a module saved whole, with an ``OptimizerCallable`` among its hparams) still loads."""
    import pickle

    from tandem.cli.config.build import ClassCallable

    data = pickle.dumps(ClassCallable(torch.optim.SGD, {"lr": 0.1}), protocol=0)
    before = data.replace(b"tandem.cli.config.build\n", b"tandem.cli.config\n")
    assert before != data
    assert pickle.loads(before) == ClassCallable(torch.optim.SGD, {"lr": 0.1})
