"""CLI: a command line and config files for a TrainingModule, a DataModule and the Trainer, in one call."""

from __future__ import annotations

import difflib
import os
import secrets
import sys
import textwrap
from collections.abc import Callable, Iterable
from typing import Any

import torch

from tandem.cli.arguments import (
    MISSING,
    NO_DEFAULT,
    CLIError,
    Parameter,
    bad_command_line,
    class_path_of,
    docstring_args,
    function_parameters,
    known_classes,
    signature,
    type_name,
)
from tandem.cli.config import (
    Request,
    Schema,
    Section,
    build_section,
    build_value,
    check,
    complete,
    layer,
    parse_argv,
    plain_default,
    resolve,
    to_yaml,
)
from tandem.cli.save_config import SaveConfigCallback, config_conflict
from tandem.module import DataModule, TrainingModule
from tandem.trainer.trainer import Trainer
from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.rank_zero import rank_zero_only, rank_zero_warn

SUBCOMMANDS = ("fit", "validate", "test", "predict")

#: ``optimizer: OptimizerCallable = torch.optim.Adam`` in a module's ``__init__``: a class_path in the config
#: (``{class_path: torch.optim.SGD, init_args: {lr: 0.1}}``) gives a callable; ``optimizer(self.parameters())``
OptimizerCallable = Callable[[Iterable], torch.optim.Optimizer]
#: ``scheduler(optimizer)`` builds the scheduler a config names, like ``OptimizerCallable``
LRSchedulerCallable = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]

_METHOD_DATA_ARGS = ("model", "train_dataloaders", "val_dataloaders", "dataloaders", "datamodule")
_METHOD_HELP = {
    "ckpt_path": "a checkpoint file to start from; 'last' (the newest last.ckpt of the experiment) or 'best'.",
}
_SEED_HELP = "seed for python, numpy and torch; true: a random seed (written to the saved config), false: none."
_HELP_WIDTH = 100
_OPTION_WIDTH = 26


class CLI:
    """A complete command line for a module, a datamodule and the Trainer, built from their signatures.

    ``train.py``::

        from tandem.cli import CLI
        from mypackage import MyModel, MyData

        if __name__ == "__main__":
            CLI(MyModel, MyData)

    gives ``python train.py fit|validate|test|predict`` with

    - the arguments of ``Trainer``, ``MyModel`` and ``MyData`` (their ``__init__`` signatures, type hints and
      docstring ``Args``) as the config sections ``trainer``, ``model`` and ``data``, plus ``seed_everything``
      and the Trainer method's own arguments (``ckpt_path``);
    - ``--config FILE.yaml`` (several are merged in order) and overrides ``--trainer.max_epochs 5``,
      ``--model.lr=0.01`` or ``model.lr=0.01``, later ones winning; omegaconf interpolation
      (``${model.hidden}``, ``${oc.env:DATA_DIR}``);
    - ``class_path`` / ``init_args`` wherever a class fits (a subclass of the model or datamodule, callbacks,
      loggers, a strategy, an optimizer for an ``OptimizerCallable`` argument); tandem's classes and
      torch.optim's have short names (``class_path: EarlyStopping``);
    - ``--print_config`` (print the resolved YAML and exit; feed it back with ``--config`` for the same run),
      and ``config.yaml`` saved in the run's log folder (``--overwrite`` to replace a different one);
    - ``--help`` listing every option with its type, default and help text.

    Every mistake (an unknown key, a wrong type, a missing value, a bad class_path or config file) is reported
    before any process or file is created. Under ``ddp``, torchrun or srun each rank parses the same command.

    Args:
        model_class: the TrainingModule to build; None: the config names one with ``model.class_path``.
        datamodule_class: the DataModule to build; None: no datamodule unless the config names one.
        trainer_class: the Trainer (or a subclass) to build.
        args: the command line without the program name (default: ``sys.argv[1:]``).
        run: run the subcommand; False: no subcommand, just parse and build (``cli.model``, ``cli.datamodule``,
            ``cli.trainer``, ``cli.config``).
        save_config_callback: the callback that writes ``config.yaml`` (None: do not write it).
        save_config_kwargs: its options, e.g. ``{"config_filename": "run.yaml", "overwrite": True}``.
        trainer_defaults: defaults for Trainer arguments above the signature's (``{"max_epochs": 10}``);
            ``callbacks`` given here are added to the configured ones.
        seed_everything_default: the default of ``seed_everything`` (True: a random seed, recorded).
        subclass_mode_model: ``model`` must name a subclass of ``model_class`` with ``class_path``.
        subclass_mode_data: ``data`` must name a subclass of ``datamodule_class`` with ``class_path``.
        description: the text at the top of ``--help`` (default: the model's docstring's first line).
        exit_on_error: print errors and exit with status 2 (True), or raise ``CLIError`` (False); default:
            exit when reading ``sys.argv``, raise when ``args`` is given.

    Attributes:
        subcommand: "fit", "validate", "test", "predict", or None with ``run=False``.
        config: the resolved config (an omegaconf ``DictConfig``), as saved in ``config.yaml``.
        model / datamodule / trainer: the built objects.
        result: what the subcommand returned (``trainer.test``'s metrics, ``trainer.predict``'s outputs).
    """

    def __init__(
        self,
        model_class: type[TrainingModule] | None = None,
        datamodule_class: type[DataModule] | None = None,
        *,
        trainer_class: type[Trainer] = Trainer,
        args: list[str] | None = None,
        run: bool = True,
        save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
        save_config_kwargs: dict[str, Any] | None = None,
        trainer_defaults: dict[str, Any] | None = None,
        seed_everything_default: bool | int = True,
        subclass_mode_model: bool = False,
        subclass_mode_data: bool = False,
        description: str | None = None,
        exit_on_error: bool | None = None,
    ) -> None:
        self.model_class = model_class
        self.datamodule_class = datamodule_class
        self.trainer_class = trainer_class
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = dict(save_config_kwargs or {})
        self.trainer_defaults = dict(trainer_defaults or {})
        self.seed_everything_default = seed_everything_default
        self.subclass_mode_model = subclass_mode_model
        self.subclass_mode_data = subclass_mode_data
        self.description = description
        self.subcommand: str | None = None
        self.result: Any = None
        self._prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        self._exit_on_error = args is None if exit_on_error is None else exit_on_error
        argv = list(sys.argv[1:] if args is None else args)
        try:
            request = self._parse(argv, run)
            self._instantiate(request)
            if run:
                self._refuse_overwrite(request)
        except CLIError as err:
            self._fail(err)
        if run:
            self.result = self._run_subcommand()

    # ------------------------------------------------------------------ parse
    def _parse(self, argv: list[str], run: bool) -> Request:
        if run:
            if argv and argv[0] in ("-h", "--help"):
                self._print(self._top_help())
                raise SystemExit(0)
            if not argv or argv[0].startswith("-"):
                raise bad_command_line(
                    f"Choose a subcommand first: {', '.join(SUBCOMMANDS)} (e.g. {self._prog} fit --config "
                    f"config.yaml). {self._prog} --help lists them."
                )
            if argv[0] not in SUBCOMMANDS:
                close = difflib.get_close_matches(argv[0], SUBCOMMANDS, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise bad_command_line(
                    f"Unknown subcommand {argv[0]!r}.{hint} Choose one of: {', '.join(SUBCOMMANDS)}."
                )
            self.subcommand, argv = argv[0], argv[1:]
        request = parse_argv(argv)
        self.schema = self._schema()
        if request.help:
            self._print(self._help())
            raise SystemExit(0)
        config = check(self.schema, resolve(complete(self.schema, layer(request))), request.print_config)
        config["seed_everything"] = _resolve_seed(config["seed_everything"])
        from omegaconf import OmegaConf

        self.config = OmegaConf.create(config)
        self._config_text = to_yaml(config)
        if request.print_config:
            self._print(self._config_text, end="")
            raise SystemExit(0)
        return request

    def _schema(self) -> Schema:
        seed = Parameter("seed_everything", bool | int, self.seed_everything_default, _SEED_HELP)
        values = {"seed_everything": seed}
        model_base = self.model_class or TrainingModule
        data_base = self.datamodule_class or DataModule
        sections = {
            "trainer": Section(
                "trainer",
                self.trainer_class,
                self.trainer_class,
                {k: v for k, v in self.trainer_defaults.items() if k != "callbacks"},
                class_path_allowed=False,
            ),
            "model": Section(
                "model", model_base, None if self.subclass_mode_model else self.model_class, required=True
            ),
            "data": Section(
                "data",
                data_base,
                None if self.subclass_mode_data else self.datamodule_class,
                required=self.subclass_mode_data,
            ),
        }
        method_args: dict[str, Parameter] = {}
        if self.subcommand is not None:
            method = getattr(self.trainer_class, self.subcommand)
            docs = {**_METHOD_HELP, **docstring_args(method.__doc__)}
            for name, parameter in function_parameters(method, docs, skip_first=True).items():
                if name not in _METHOD_DATA_ARGS:
                    method_args[name] = parameter
        values.update(method_args)
        order = ("seed_everything", "trainer", "model", "data", *method_args)
        return Schema(values, sections, order)

    # ------------------------------------------------------------------ build
    def _instantiate(self, request: Request) -> None:
        from tandem.utilities.seed import seed_everything

        config = self._plain_config()
        try:
            # The Trainer first: it checks its own arguments (strategy='bogus', devices=0) and uses no randomness.
            self.trainer = self._instantiate_trainer(config["trainer"], request)
        except CLIError:
            raise
        except TandemConfigError as err:
            name = str(err).split("=", 1)[0]
            raise CLIError(f"trainer.{err}" if name in config["trainer"] else f"trainer: {err}") from None
        if config["seed_everything"] is not False:
            seed_everything(config["seed_everything"])
        try:
            self.datamodule = build_section(self.schema, "data", config["data"])
            self.model = build_section(self.schema, "model", config["model"])
        except CLIError:
            raise
        except TandemConfigError as err:  # a value the class checks itself
            raise CLIError(str(err)) from None

    def _instantiate_trainer(self, trainer_config: dict[str, Any], request: Request) -> Trainer:
        sig = signature(self.trainer_class)
        kwargs = {
            name: build_value(value, sig.parameters[name].hint if name in sig.parameters else Any, f"trainer.{name}")
            for name, value in trainer_config.items()
        }
        for name, value in self.trainer_defaults.items():  # objects a config cannot hold
            if name != "callbacks" and name not in trainer_config:
                kwargs[name] = value
        callbacks = kwargs.get("callbacks")
        callbacks = (
            [] if callbacks is None else list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        )
        default_callbacks = self.trainer_defaults.get("callbacks") or []
        callbacks += list(default_callbacks) if isinstance(default_callbacks, (list, tuple)) else [default_callbacks]
        self._save_config = None
        if self.save_config_callback is not None and not trainer_config.get("fast_dev_run"):
            options = {**self.save_config_kwargs}
            options["overwrite"] = options.get("overwrite", False) or request.overwrite
            self._save_config = self.save_config_callback(self._config_text, **options)
            callbacks.append(self._save_config)
        kwargs["callbacks"] = callbacks
        return self.trainer_class(**kwargs)

    def _plain_config(self) -> dict[str, Any]:
        from omegaconf import OmegaConf

        return OmegaConf.to_container(self.config)

    def _refuse_overwrite(self, request: Request) -> None:
        """Before anything runs: a different config.yaml in the run's folder (the callback checks again)."""
        callback = self._save_config
        if callback is None or self.trainer is None:
            return
        path = os.path.join(self.trainer.log_dir, callback.config_filename)
        problem = config_conflict(path, callback.config, callback.overwrite)
        if problem is not None:
            raise CLIError(problem)

    # ------------------------------------------------------------------ run
    def _run_subcommand(self) -> Any:
        config = self._plain_config()
        kwargs = {
            name: build_value(config[name], parameter.hint, name)
            for name, parameter in self.schema.values.items()
            if name != "seed_everything"
        }
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        return getattr(self.trainer, self.subcommand)(self.model, **kwargs)  # validate / test print their table

    # ------------------------------------------------------------------ output
    def _fail(self, err: CLIError) -> None:
        if not self._exit_on_error:
            raise err
        command = f"{self._prog} {self.subcommand}" if self.subcommand else self._prog
        print(f"{command}: error: {err}", file=sys.stderr)
        raise SystemExit(2)

    @staticmethod
    def _print(text: str, end: str = "\n") -> None:
        if rank_zero_only.rank == 0:
            print(text, end=end, flush=True)

    def _usage(self) -> str:
        command = f"{self._prog} {self.subcommand}" if self.subcommand else self._prog
        return f"usage: {command} [-h] [-c FILE] [--print_config] [--overwrite] [--KEY VALUE | --KEY=VALUE | KEY=VALUE ...]"

    def _top_help(self) -> str:
        lines = [f"usage: {self._prog} [-h] {{{','.join(SUBCOMMANDS)}}} [options]", ""]
        if self._description():
            lines += [self._description(), ""]
        lines.append("subcommands:")
        for name in SUBCOMMANDS:
            lines.append(f"  {name:<10}{_first_sentence(getattr(self.trainer_class, name).__doc__)}")
        lines += ["", f"'{self._prog} SUBCOMMAND --help' lists a subcommand's options."]
        return "\n".join(lines)

    def _description(self) -> str:
        if self.description is not None:
            return self.description
        return _first_sentence(self.model_class.__doc__) if self.model_class is not None else ""

    def _help(self) -> str:
        lines = [self._usage(), ""]
        if self.subcommand is not None:
            lines += [_first_sentence(getattr(self.trainer_class, self.subcommand).__doc__), ""]
        elif self._description():
            lines += [self._description(), ""]
        lines += textwrap.wrap(
            "Settings, lowest priority first: the defaults below < each --config FILE (YAML; several are merged in "
            "order) < options on the command line, written --trainer.max_epochs 5, --trainer.max_epochs=5 or "
            "trainer.max_epochs=5. Values are YAML; ${model.hidden} and ${oc.env:VAR} interpolate. Where a class "
            "fits, give {class_path: NAME, init_args: {...}} (short names for tandem's and torch.optim's classes).",
            _HELP_WIDTH,
        )
        lines += ["", "options:"]
        lines += _option("-h, --help", "show this help and exit")
        lines += _option("-c, --config FILE", "a YAML config file; give several to merge them in order")
        lines += _option("--print_config", "print the resolved config as YAML and exit")
        lines += _option("--overwrite", "replace a different config.yaml already in the run's log folder")
        for name, parameter in self.schema.values.items():
            lines += _option(f"--{name} {_metavar(parameter.hint)}", _describe(parameter))
        for key in ("trainer", "model", "data"):
            lines += [""] + self._section_help(self.schema.sections[key])
        return "\n".join(lines)

    def _section_help(self, section: Section) -> list[str]:
        key = section.key
        if section.default is None:
            choices = sorted(name for name in known_classes(section.base) if name != section.base.__name__)
            status = "required" if section.required else "optional"
            lines = [f"{key} ({status}: a subclass of {section.base.__qualname__} given with class_path):"]
            listed = f"; known: {', '.join(choices)}" if choices else ""
            lines += _option(f"--{key} CLASS_PATH", f"the class to build{listed}")
            lines += _option(f"--{key}.init_args.NAME VALUE", f"its arguments (also --{key}.NAME VALUE)")
            return lines
        title = f"{key} ({class_path_of(section.default)})"
        if section.class_path_allowed:
            title += f", or --{key}.class_path naming a subclass"
        lines = [f"{title}:"]
        parameters = signature(section.default).parameters
        if not parameters:
            lines.append("  (no arguments)")
        for name, parameter in parameters.items():
            default = section.defaults.get(name, parameter.default) if name != "callbacks" else parameter.default
            lines += _option(f"--{key}.{name} {_metavar(parameter.hint)}", _describe(parameter, default))
        return lines


LightningCLI = CLI  # the name ported Lightning programs use


def _resolve_seed(value: bool | int) -> bool | int:
    """``True``: a random seed; in a rank tandem's ``ddp`` launcher started, the one its rank 0 chose."""
    if value is not True:
        return value
    from tandem.strategies.environments import select_environment
    from tandem.utilities.seed import global_seed

    environment = select_environment()
    if getattr(environment, "launcher_pid", None) is not None:  # rank 0 exported its seed to the ranks it started
        return global_seed()
    if environment.creates_processes_externally and environment.world_size > 1:
        rank_zero_warn(
            "seed_everything: true under torchrun or srun: every rank picks its own seed and config.yaml records rank "
            "0's, so a rerun from it seeds the other ranks differently. Set seed_everything to a number to reproduce "
            "a multi-process run exactly."
        )
    return secrets.randbelow(2**32)


def _first_sentence(doc: str | None) -> str:
    if not doc:
        return ""
    text = " ".join(doc.strip().split("\n\n")[0].split()).replace("``", "")
    return text.split(". ")[0].rstrip(".") + "."


def _metavar(hint: Any) -> str:
    return {int: "INT", float: "FLOAT", str: "STR", bool: "BOOL"}.get(hint, "VALUE")


def _describe(parameter: Parameter, default: Any = NO_DEFAULT) -> str:
    default = parameter.default if default is NO_DEFAULT else default
    text = " ".join(parameter.help.split())
    if parameter.required:
        info = f"required, type: {type_name(parameter.hint)}"
    else:
        shown = plain_default(default, parameter.hint)
        info = f"type: {type_name(parameter.hint)}, default: {_yaml_scalar(shown, default)}"
    return f"{text} ({info})" if text else f"({info})"


def _yaml_scalar(value: Any, original: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value) if value != MISSING else "???"
    if isinstance(value, dict) and "class_path" in value:
        return value["class_path"]
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_scalar(v, v) for v in value) + "]"
    return repr(original)


def _option(name: str, text: str) -> list[str]:
    indent = " " * (_OPTION_WIDTH + 2)
    if len(name) + 2 > _OPTION_WIDTH:
        return [f"  {name}", *textwrap.wrap(text, _HELP_WIDTH, initial_indent=indent, subsequent_indent=indent)]
    wrapped = textwrap.wrap(text, _HELP_WIDTH - _OPTION_WIDTH - 2) or [""]
    return [f"  {name:<{_OPTION_WIDTH}}{wrapped[0]}", *(indent + line for line in wrapped[1:])]
