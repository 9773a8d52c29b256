"""LightningArgumentParser: what a CLI subclass's ``add_arguments_to_parser(parser)`` adds to the command line,
with Lightning's and jsonargparse's method names. It records; the CLI turns the records into its schema.

- ``add_lightning_class_args(EarlyStopping, "early_stopping")``: a class configured under its own key
  (``--early_stopping.patience 5``); a Callback is built and added to the Trainer's callbacks;
- ``add_argument("--name", type=int, default=3)``: a plain top-level value (``cli.config.name``);
- ``set_defaults({"trainer.max_epochs": 15})``: defaults under the config files and the command line;
- ``link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")``: one value computed from
  others, when parsing or from the built objects;
- ``add_optimizer_args`` / ``add_lr_scheduler_args``: an optimizer (and scheduler) configured at the top level;
  with ``link_to="AUTOMATIC"`` the CLI gives the model a ``configure_optimizers`` that returns them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from tandem.callbacks.callback import Callback
from tandem.cli.arguments import NO_DEFAULT, Parameter
from tandem.cli.links import Link
from tandem.module import DataModule, TrainingModule
from tandem.trainer.trainer import Trainer

#: what ``add_lr_scheduler_args`` accepts by default
LR_SCHEDULER_CLASSES = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


class Namespace(dict):
    """A mapping that also reads its keys as attributes, as jsonargparse's Namespace does: ``config_init.model``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


@dataclass(frozen=True)
class ClassArgs:
    """A class configured under its own top-level key."""

    key: str
    cls: type | tuple[type, ...]
    subclass_mode: bool
    required: bool
    skip: int = 0  # leading arguments the caller passes
    instantiate: bool = True


class LightningArgumentParser:
    """The parser a [`CLI`][tandem.cli.CLI] hands to ``add_arguments_to_parser``.

    Example:
        ```python
        class MyCLI(CLI):
            def add_arguments_to_parser(self, parser):
                parser.add_lightning_class_args(EarlyStopping, "early_stopping")
                parser.set_defaults({"early_stopping.monitor": "val_loss", "trainer.max_epochs": 15})
                parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        ```

    Mistakes in these calls (a reserved key, a link to itself) raise ``ValueError`` at once; a key that the
    classes do not have is reported with the other config errors when the command line is parsed.
    """

    def __init__(self, description: str | None = None, reserved: tuple[str, ...] = ()) -> None:
        self.description = description
        self.class_args: dict[str, ClassArgs] = {}
        self.callback_keys: list[str] = []
        self.arguments: dict[str, Parameter] = {}
        self.defaults: dict[str, Any] = {}
        self.links: list[Link] = []
        self._optimizers: dict[str, tuple[type | tuple[type, ...], str]] = {}
        self._lr_schedulers: dict[str, tuple[type | tuple[type, ...], str]] = {}
        self._reserved = set(reserved)  # the CLI's own keys

    # ------------------------------------------------------------------ classes
    def add_lightning_class_args(
        self,
        lightning_class: type | Callable[..., Any],
        nested_key: str,
        subclass_mode: bool = False,
        required: bool = True,
    ) -> list[str]:
        """The arguments of a Callback (or TrainingModule, DataModule) under ``nested_key``; a Callback is built
        and added to the Trainer's callbacks. ``subclass_mode``: the config names the class with class_path.

        Returns:
            the keys added (``nested_key.ARG``).
        """
        if not (
            isinstance(lightning_class, type) and issubclass(lightning_class, (Callback, TrainingModule, DataModule))
        ):
            raise ValueError(
                f"add_lightning_class_args({lightning_class!r}, {nested_key!r}): expected a subclass of Callback, "
                "TrainingModule or DataModule. Use add_class_arguments for other classes."
            )
        if issubclass(lightning_class, Trainer):
            raise ValueError("The Trainer is configured under 'trainer' already; set its defaults with set_defaults.")
        if issubclass(lightning_class, Callback):
            self.callback_keys.append(nested_key)
        if subclass_mode:
            return self.add_subclass_arguments(lightning_class, nested_key, required=required)
        return self.add_class_arguments(lightning_class, nested_key)

    def add_class_arguments(self, theclass: type, nested_key: str, **_: Any) -> list[str]:
        """The arguments of ``theclass`` under ``nested_key``; ``cli.config_init[nested_key]`` is the built object."""
        self._add(ClassArgs(self._check_key(nested_key), theclass, subclass_mode=False, required=True))
        return [f"{nested_key}.{name}" for name in _init_parameters(theclass)]

    def add_subclass_arguments(
        self, baseclass: type | tuple[type, ...], nested_key: str, required: bool = False, **_: Any
    ) -> list[str]:
        """A subclass of ``baseclass`` under ``nested_key``, named with ``class_path`` (optional unless ``required``)."""
        self._add(ClassArgs(self._check_key(nested_key), baseclass, subclass_mode=True, required=required))
        return [nested_key]

    def add_optimizer_args(
        self,
        optimizer_class: type[torch.optim.Optimizer] | tuple[type[torch.optim.Optimizer], ...] = (
            torch.optim.Optimizer,
        ),
        nested_key: str = "optimizer",
        link_to: str = "AUTOMATIC",
    ) -> None:
        """An optimizer configured at ``nested_key`` (a tuple: any subclass, named with class_path). With
        ``link_to="AUTOMATIC"`` the model's ``configure_optimizers`` returns it (and the AUTOMATIC scheduler)."""
        self._add_optimization(optimizer_class, torch.optim.Optimizer, nested_key, link_to, self._optimizers)

    def add_lr_scheduler_args(
        self,
        lr_scheduler_class: type | tuple[type, ...] = LR_SCHEDULER_CLASSES,
        nested_key: str = "lr_scheduler",
        link_to: str = "AUTOMATIC",
    ) -> None:
        """A learning-rate scheduler configured at ``nested_key``, built on the AUTOMATIC optimizer."""
        self._add_optimization(lr_scheduler_class, LR_SCHEDULER_CLASSES, nested_key, link_to, self._lr_schedulers)

    def _add_optimization(
        self,
        classes: type | tuple[type, ...],
        base: type | tuple[type, ...],
        key: str,
        link_to: str,
        register: dict[str, tuple[type | tuple[type, ...], str]],
    ) -> None:
        members = classes if isinstance(classes, tuple) else (classes,)
        if not all(isinstance(c, type) and issubclass(c, base) for c in members):
            raise ValueError(f"{key}: {classes!r} is not a subclass of {base!r}.")
        if link_to != "AUTOMATIC":
            raise ValueError(
                f"{key}: link_to={link_to!r} is not supported; use link_to='AUTOMATIC', or give the module an "
                "argument typed tandem.cli.OptimizerCallable and set it with --model.ARG."
            )
        subclass_mode = isinstance(classes, tuple)
        self._add(ClassArgs(self._check_key(key), classes, subclass_mode, required=False, skip=1, instantiate=False))
        register[key] = (classes, link_to)

    def _add(self, args: ClassArgs) -> None:
        self.class_args[args.key] = args

    # ------------------------------------------------------------------ plain values, defaults, links
    def add_argument(
        self,
        *names: str,
        type: Any = Any,  # noqa: A002 (argparse's name)
        default: Any = None,
        help: str = "",  # noqa: A002 (argparse's name)
        required: bool = False,
        **_: Any,
    ) -> None:
        """A plain top-level value: ``parser.add_argument("--notes", type=str, default="")`` gives ``--notes``
        on the command line and ``cli.config.notes``."""
        long_names = [n for n in names if n.startswith("--")] or list(names)
        if not long_names:
            raise ValueError("add_argument needs a name, e.g. add_argument('--notes', type=str).")
        name = self._check_key(long_names[0].lstrip("-").replace("-", "_"))
        if "." in name:
            raise ValueError(f"add_argument({long_names[0]!r}): a plain argument's name cannot contain '.'.")
        self.arguments[name] = Parameter(name, type, NO_DEFAULT if required else default, help)

    def set_defaults(self, *args: dict[str, Any], **kwargs: Any) -> None:
        """Defaults by dotted key (``{"trainer.max_epochs": 15, "early_stopping.patience": 5}``), under every
        config file and the command line."""
        for mapping in [*args, kwargs]:
            for key, value in mapping.items():
                self.defaults[key.replace("-", "_")] = value

    def link_arguments(
        self,
        source: str | tuple[str, ...],
        target: str,
        compute_fn: Callable[..., Any] | None = None,
        apply_on: Literal["parse", "instantiate"] = "parse",
    ) -> None:
        """Set ``target`` from ``source`` (a key, or a tuple of keys for ``compute_fn``). ``apply_on="parse"``:
        from the config's values; ``"instantiate"``: from the built objects (``data.num_classes`` reads the
        attribute of the built datamodule). The target is not configurable and left out of saved configs."""
        sources = (source,) if isinstance(source, str) else tuple(source)
        if apply_on not in ("parse", "instantiate"):
            raise ValueError(f"link_arguments(apply_on={apply_on!r}): expected 'parse' or 'instantiate'.")
        if not sources or (len(sources) > 1 and compute_fn is None):
            raise ValueError(f"link_arguments({source!r}, {target!r}): several sources need a compute_fn.")
        if target in sources or any(link.target == target for link in self.links):
            raise ValueError(f"link_arguments: {target!r} is already the target of a link (or its own source).")
        if apply_on == "instantiate" and len(target.split(".")) < 2:
            raise ValueError(f"link_arguments: an instantiation link sets an argument of a class: {target!r}.")
        self.links.append(Link(sources, target, compute_fn, apply_on))

    def _check_key(self, key: str) -> str:
        if not key or key in self._reserved or key in self.class_args or key in self.arguments:
            raise ValueError(f"{key!r} is taken: choose another key.")
        return key


def _init_parameters(cls: type[Any]) -> list[str]:
    try:
        parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
