"""CLI: a command line and config files for a TrainingModule, a DataModule and the Trainer, in one call."""

from __future__ import annotations

import copy
import difflib
import functools
import os
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
from omegaconf import OmegaConf

from tandem.cli.arguments import Parameter
from tandem.cli.class_paths import class_path_of
from tandem.cli.config.build import build_section, build_value, instantiate_spec, trainer_arguments
from tandem.cli.config.check import check
from tandem.cli.config.complete import append_default, complete, missing_keys
from tandem.cli.config.layers import drop_path, layer, set_path
from tandem.cli.config.request import parse_argv
from tandem.cli.config.schema import Schema, Section, common_base, is_spec
from tandem.cli.config.yaml_io import resolve, to_yaml
from tandem.cli.errors import CLIError, bad_command_line, list_replaced
from tandem.cli.help import first_sentence, help_text, top_help
from tandem.cli.links import (
    apply_parse_links,
    check_links,
    instantiation_order,
    linked_arguments,
    links_on,
    refuse_given_link_targets,
)
from tandem.cli.parser import LightningArgumentParser, Namespace
from tandem.cli.save_config import SaveConfigCallback, config_conflict, input_conflict
from tandem.cli.seed import SEED_HELP, resolve_seed
from tandem.cli.subcommands import SUBCOMMANDS, default_config_files, parser_options, subcommand_arguments
from tandem.module import DataModule, TrainingModule, is_overridden
from tandem.trainer.trainer import Trainer
from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.rank_zero import rank_zero_only, rank_zero_warn

#: ``optimizer: OptimizerCallable = torch.optim.Adam`` in a module's ``__init__``: a class_path in the config
#: (``{class_path: torch.optim.SGD, init_args: {lr: 0.1}}``) gives a callable; ``optimizer(self.parameters())``
OptimizerCallable = Callable[[Iterable], torch.optim.Optimizer]
#: ``scheduler(optimizer)`` builds the scheduler a config names, like ``OptimizerCallable``
LRSchedulerCallable = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


class CLI:
    """A complete command line for a module, a datamodule and the Trainer, built from their signatures.

    ``train.py``:

    ```python
    from tandem.cli import CLI
    from mypackage import MyModel, MyData

    if __name__ == "__main__":
        CLI(MyModel, MyData)
    ```

    gives ``python train.py fit|validate|test|predict`` with

    - the arguments of ``Trainer``, ``MyModel`` and ``MyData`` (their ``__init__`` signatures, type hints and
      docstring ``Args``) as the config sections ``trainer``, ``model`` and ``data``, plus ``seed_everything``
      and the Trainer method's own arguments (``ckpt_path``);
    - ``--config FILE.yaml`` (several are merged in order) and overrides ``--trainer.max_epochs 5``,
      ``--model.lr=0.01`` or ``model.lr=0.01``, later ones winning; ``--trainer.callbacks+=EarlyStopping
      --trainer.callbacks.patience=3`` appends to a list; omegaconf interpolation (``${model.hidden}``,
      ``${oc.env:DATA_DIR}``);
    - ``class_path`` / ``init_args`` wherever a class fits (a subclass of the model or datamodule, callbacks,
      loggers, a strategy, an optimizer for an ``OptimizerCallable`` argument); tandem's classes and
      torch.optim's have short names (``class_path: EarlyStopping``);
    - ``--print_config`` (print the resolved YAML and exit; feed it back with ``--config`` for the same run;
      required values not given yet are printed ``???`` and named on stderr), and ``config.yaml`` saved in the
      run's log folder (``--overwrite`` to replace a different one; never a config file the run reads);
    - ``--help`` listing every option with its type, default and help text.

    Every mistake (an unknown key, a wrong type, a missing value, a bad class_path or config file) is reported
    before any process or file is created. Under ``ddp``, torchrun or srun each rank parses the same command.

    Subclass it as Lightning's ``LightningCLI`` (also importable under that name), overriding the hooks:
    ``add_arguments_to_parser(parser)`` (a [`LightningArgumentParser`][tandem.cli.LightningArgumentParser]:
    ``add_lightning_class_args``, ``add_argument``, ``set_defaults``, ``link_arguments``, ``add_optimizer_args``),
    ``before_instantiate_classes``, ``instantiate_classes``, ``after_instantiate_classes``,
    ``instantiate_trainer(**kwargs)``, ``before_fit`` / ``after_fit`` (and for validate, test, predict), or a method
    named after the subcommand to run instead of the Trainer's. Unlike Lightning, ``config`` and ``config_init`` are
    flat in every mode (``cli.config.model``, not ``cli.config.fit.model``).

    Args:
        model_class: the TrainingModule to build; None: the config names one with ``model.class_path``.
        datamodule_class: the DataModule to build; None: no datamodule unless the config names one.
        trainer_class: the Trainer (or a subclass) to build.
        args: the command line without the program name (default: ``sys.argv[1:]``), or a mapping of config
            values (``{"trainer": {"max_epochs": 1}}``; with ``run``, ``{"fit": {...}}``).
        run: run the subcommand; False: no subcommand, just parse and build (``cli.model``, ``cli.datamodule``,
            ``cli.trainer``, ``cli.config``).
        save_config_callback: the callback that writes ``config.yaml`` (None: do not write it).
        save_config_kwargs: its options, e.g. ``{"config_filename": "run.yaml", "overwrite": True}``.
        trainer_defaults: defaults for Trainer arguments above the signature's (``{"max_epochs": 10}``);
            ``callbacks`` given here are added to the configured ones.
        seed_everything_default: the default of ``seed_everything`` (True: a random seed, recorded).
        parser_kwargs: the parser's options, for every subcommand or per subcommand (``{"fit": {...}}``):
            ``default_config_files`` (glob patterns of config files read before ``--config``), ``description``,
            ``exit_on_error``, ``prog``, ``parser_mode`` ("omegaconf" or "yaml": tandem always interpolates).
        subclass_mode_model: ``model`` must name a subclass of ``model_class`` with ``class_path``.
        subclass_mode_data: ``data`` must name a subclass of ``datamodule_class`` with ``class_path``.
        description: the text at the top of ``--help`` (default: the model's docstring's first line).
        exit_on_error: print errors and exit with status 2 (True), or raise ``CLIError`` (False); default:
            exit when reading ``sys.argv``, raise when ``args`` is given.

    Attributes:
        subcommand: "fit", "validate", "test", "predict", or None with ``run=False``.
        parser: the [`LightningArgumentParser`][tandem.cli.LightningArgumentParser] that ``add_arguments_to_parser``
            filled.
        config: the resolved config (an omegaconf ``DictConfig``), as saved in ``config.yaml``.
        config_init: the config with its classes built (``config_init.model``; ``config_init.trainer`` holds the
            Trainer's arguments).
        model / datamodule / trainer: the built objects.
        result: what the subcommand returned (``trainer.test``'s metrics, ``trainer.predict``'s outputs).
    """

    def __init__(
        self,
        model_class: type[TrainingModule] | None = None,
        datamodule_class: type[DataModule] | None = None,
        *,
        trainer_class: type[Trainer] = Trainer,
        args: list[str] | dict[str, Any] | None = None,
        run: bool = True,
        save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
        save_config_kwargs: dict[str, Any] | None = None,
        trainer_defaults: dict[str, Any] | None = None,
        seed_everything_default: bool | int = True,
        parser_kwargs: dict[str, Any] | None = None,
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
        self.parser_kwargs = dict(parser_kwargs or {})
        self.subclass_mode_model = subclass_mode_model
        self.subclass_mode_data = subclass_mode_data
        self.description = description
        self.subcommand: str | None = None
        self.result: Any = None
        self.model: TrainingModule | None = None
        self.datamodule: DataModule | None = None
        self.trainer: Trainer | None = None
        main_options = parser_options(self.parser_kwargs, None)
        self._prog = main_options.get("prog") or (
            os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        )
        if exit_on_error is None:
            exit_on_error = main_options.get("exit_on_error", args is None)
        self._exit_on_error = exit_on_error
        argv: list[str] | dict[str, Any] = sys.argv[1:] if args is None else args
        try:
            self._parse(argv if isinstance(argv, dict) else list(argv), run)
            self._set_seed()
            self.before_instantiate_classes()
            self.instantiate_classes()
            self.after_instantiate_classes()
            if run:
                self._refuse_overwrite()
        except CLIError as err:
            self._fail(err)
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    # ------------------------------------------------------------------ hooks (Lightning's names)
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Override to add arguments, classes, defaults and links to the parser."""

    def before_instantiate_classes(self) -> None:
        """Override to run code after parsing (``self.config`` may be changed here), before anything is built."""

    def after_instantiate_classes(self) -> None:
        """Override to run code once the model, datamodule and Trainer are built."""

    def instantiate_classes(self) -> None:
        """Builds the classes of the config in link order (the datamodule, the model, the classes added with
        ``add_lightning_class_args``), then the Trainer: ``config_init``, ``model``, ``datamodule``, ``trainer``."""
        config = self._plain_config()
        self.config_init = Namespace(config)
        for key in instantiation_order(self.parser.links, self.schema):
            self.config_init[key] = self._build(key, config[key])
        self.config_init["trainer"] = trainer_arguments(self.trainer_class, config["trainer"], self.trainer_defaults)
        self.datamodule = self.config_init.get("data")
        self.model = self.config_init.get("model")
        self._add_configure_optimizers_method_to_model()
        self.trainer = self.instantiate_trainer()

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The Trainer from ``config_init.trainer`` and ``kwargs``, with the callbacks of
        ``add_lightning_class_args``, ``trainer_defaults``' callbacks and the config-saving callback."""
        extra = [self.config_init[key] for key in self.parser.callback_keys if self.config_init.get(key) is not None]
        return self._instantiate_trainer({**self.config_init["trainer"], **kwargs}, extra)

    @staticmethod
    def configure_optimizers(
        lightning_module: TrainingModule, optimizer: torch.optim.Optimizer, lr_scheduler: Any = None
    ) -> Any:
        """What the model's ``configure_optimizers`` returns with ``add_optimizer_args(link_to="AUTOMATIC")``;
        override to change it."""
        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            monitor = getattr(lr_scheduler, "monitor", "val_loss")
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": lr_scheduler, "monitor": monitor}}
        return [optimizer], [lr_scheduler]

    # ------------------------------------------------------------------ parse
    def _parse(self, argv: list[str] | dict[str, Any], run: bool) -> None:
        given: dict[str, Any] | None = None
        if isinstance(argv, dict):
            given, argv = dict(argv), []
            if run:
                subcommand = given.pop("subcommand", None) or next((k for k in SUBCOMMANDS if k in given), None)
                if subcommand is None:
                    raise bad_command_line(f"args: name the subcommand, e.g. {{'fit': {{...}}}} ({SUBCOMMANDS}).")
                argv, given = [subcommand], given.get(subcommand) or {}
        if run:
            if argv and argv[0] in ("-h", "--help"):
                self._print(top_help(self._prog, self._description(), self.trainer_class))
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
        options = parser_options(self.parser_kwargs, self.subcommand)
        if options.get("description") and self.description is None:
            self.description = options["description"]
        self._method_args = subcommand_arguments(self.trainer_class, self.subcommand)
        reserved = ("seed_everything", "trainer", "model", "data", "config", "subcommand", *self._method_args)
        self.parser = LightningArgumentParser(self.description, reserved=reserved)
        self.add_arguments_to_parser(self.parser)
        request = parse_argv(argv)
        self.schema = self._schema()
        if request.help:
            defaults = self._parser_defaults()
            text = help_text(
                self._prog,
                self.subcommand,
                self.trainer_class,
                self._description(),
                self.schema,
                self.parser.links,
                defaults,
            )
            self._print(text)
            raise SystemExit(0)
        default_files = default_config_files(options.get("default_config_files") or [])
        self._input_files = [*default_files, *request.configs]  # never overwritten by the run's config.yaml
        base = self._parser_defaults()
        replaced: list[tuple[str, list[Any], str]] = []
        user = layer(request, base, functools.partial(append_default, self.schema), default_files, given, replaced)
        if rank_zero_only.rank == 0:  # type: ignore[attr-defined]  # set by tandem.utilities.rank_zero.set_rank
            for key, old, raw in replaced:
                print(f"{self._prog}: note: {list_replaced(key, old, raw)}", file=sys.stderr)
        refuse_given_link_targets(self.parser.links, user, base)
        config = resolve(complete(self.schema, user))
        apply_parse_links(self.parser.links, config)
        for link in links_on(self.parser.links, "instantiate"):
            drop_path(config, link.target)  # set from the built objects
        config = check(self.schema, config, request.print_config)
        config["seed_everything"] = resolve_seed(config["seed_everything"])
        self.config = OmegaConf.create(config)
        self._overwrite = request.overwrite
        if request.print_config:
            self._print(self._config_text(config), end="")
            missing = sorted(missing_keys(config))
            if missing and rank_zero_only.rank == 0:  # type: ignore[attr-defined]  # see tandem.utilities.rank_zero
                print(
                    f"{self._prog}: note: still to be given (printed ???): {', '.join(missing)}. Set them in the "
                    "file before running it.",
                    file=sys.stderr,
                )
            raise SystemExit(0)

    def _schema(self) -> Schema:
        seed = Parameter("seed_everything", bool | int, self.seed_everything_default, SEED_HELP)
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
        for key, added in self.parser.class_args.items():
            base = common_base(added.cls, key)
            default = None if added.subclass_mode else base
            sections[key] = Section(key, base, default, required=added.required, skip=added.skip)
        values.update(self.parser.arguments)
        values.update(self._method_args)
        order = ("seed_everything", "trainer", "model", "data", *self.parser.class_args, *self.parser.arguments)
        schema = Schema(values, sections, (*order, *self._method_args))
        check_links(self.parser.links, schema)
        return schema

    def _parser_defaults(self) -> dict[str, Any]:
        """``parser.set_defaults``: the lowest config layer."""
        base: dict[str, Any] = {}
        for key, value in self.parser.defaults.items():
            set_path(base, key, class_path_of(value) if isinstance(value, type) else value)
        return base

    # ------------------------------------------------------------------ build
    def _set_seed(self) -> None:
        from tandem.utilities.seed import seed_everything

        if self.config.seed_everything is not False:
            seed_everything(self.config.seed_everything)

    def _build(self, key: str, value: Any) -> Any:
        if value is None:
            return None
        added = self.parser.class_args.get(key)
        if added is not None and not added.instantiate:  # an optimizer: built on the model's parameters later
            cls = self.schema.section_class(key, value)
            return Namespace(class_path=class_path_of(cls), init_args=value["init_args"] if is_spec(value) else value)
        try:
            return build_section(self.schema, key, value, linked_arguments(self.parser.links, key, self.config_init))
        except CLIError:
            raise
        except TandemConfigError as err:  # a value the class checks itself
            raise CLIError(str(err)) from None

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Any]) -> Trainer:
        configured = config.get("callbacks")
        configured = (
            [] if configured is None else list(configured) if isinstance(configured, (list, tuple)) else [configured]
        )
        defaults = self.trainer_defaults.get("callbacks") or []
        configured += callbacks + (list(defaults) if isinstance(defaults, (list, tuple)) else [defaults])
        self._save_config = None
        if self.save_config_callback is not None and not config.get("fast_dev_run"):
            options = {**self.save_config_kwargs}
            options["overwrite"] = options.get("overwrite", False) or self._overwrite
            self._save_config = self.save_config_callback(self._config_text(self._plain_config()), **options)
            configured.append(self._save_config)
        try:
            return self.trainer_class(**{**config, "callbacks": configured})
        except TandemConfigError as err:
            if isinstance(err, CLIError):
                raise
            name = str(err).split("=", 1)[0]
            raise CLIError(f"trainer.{err}" if name in config else f"trainer: {err}") from None

    def _add_configure_optimizers_method_to_model(self) -> None:
        """``add_optimizer_args(link_to="AUTOMATIC")``: the model's ``configure_optimizers`` returns the configured
        optimizer (and scheduler), as Lightning's CLI does."""
        optimizers = [k for k, (_, link_to) in self.parser._optimizers.items() if link_to == "AUTOMATIC"]
        schedulers = [k for k, (_, link_to) in self.parser._lr_schedulers.items() if link_to == "AUTOMATIC"]
        if not optimizers or self.model is None:
            return
        if len(optimizers) > 1 or len(schedulers) > 1:
            raise CLIError(
                f"At most one optimizer and one lr_scheduler can be AUTOMATIC; found {optimizers + schedulers}. "
                "Override configure_optimizers in the module to combine several."
            )
        optimizer_init = self.config_init.get(optimizers[0])
        if optimizer_init is None:
            return  # not configured: the module's own configure_optimizers
        scheduler_init = self.config_init.get(schedulers[0]) if schedulers else None
        if is_overridden(self.model, "configure_optimizers"):
            rank_zero_warn(
                f"{type(self.model).__name__}.configure_optimizers is replaced by {type(self).__name__}."
                f"configure_optimizers: the optimizer comes from --{optimizers[0]}."
            )
        optimizer = instantiate_spec(optimizer_init, self.model.parameters())
        scheduler = instantiate_spec(scheduler_init, optimizer) if scheduler_init is not None else None
        fn = functools.partial(self.configure_optimizers, optimizer=optimizer, lr_scheduler=scheduler)
        # the model's configure_optimizers becomes the one of the config's optimizer (Lightning's CLI does the same)
        self.model.configure_optimizers = types.MethodType(fn, self.model)  # type: ignore[method-assign]

    def _plain_config(self) -> dict[str, Any]:
        return cast("dict[str, Any]", OmegaConf.to_container(self.config))  # the config is a mapping

    def _config_text(self, config: dict[str, Any]) -> str:
        """The YAML ``--print_config`` prints and ``config.yaml`` holds: link targets left out (they are computed)."""
        config = copy.deepcopy(config)
        for link in self.parser.links:
            drop_path(config, link.target)
        return to_yaml(config)

    def _refuse_overwrite(self) -> None:
        """Before anything runs: a config file this run reads, or a different config.yaml, where the run's
        config.yaml goes (the callback checks again)."""
        callback = self._save_config
        if callback is None or self.trainer is None or not getattr(callback, "save_to_log_dir", True):
            return
        path = os.path.join(self.trainer.log_dir, callback.config_filename)
        problem = input_conflict(path, self._input_files) or config_conflict(path, callback.config, callback.overwrite)
        if problem is not None:
            raise CLIError(problem)

    # ------------------------------------------------------------------ run
    def _run_subcommand(self, subcommand: str) -> None:
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        config = self._plain_config()
        kwargs = {name: build_value(config[name], p.hint, name) for name, p in self._method_args.items()}
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        fn = getattr(self, subcommand, None) or getattr(self.trainer, subcommand)
        self.result = fn(model=self.model, **kwargs)  # validate / test print their table
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()

    # ------------------------------------------------------------------ output
    def _fail(self, err: CLIError) -> None:
        if not self._exit_on_error:
            raise err
        command = f"{self._prog} {self.subcommand}" if self.subcommand else self._prog
        print(f"{command}: error: {err}", file=sys.stderr)
        raise SystemExit(2)

    @staticmethod
    def _print(text: str, end: str = "\n") -> None:
        if rank_zero_only.rank == 0:  # type: ignore[attr-defined]  # set by tandem.utilities.rank_zero.set_rank
            print(text, end=end, flush=True)

    def _description(self) -> str:
        if self.description is not None:
            return self.description
        return first_sentence(self.model_class.__doc__) if self.model_class is not None else ""


LightningCLI = CLI  # the name ported Lightning programs use
