"""``--help``: the top-level help (the subcommands), a subcommand's help (every option with its type, default and
docstring help, section by section), and the lines they are made of."""

from __future__ import annotations

import textwrap
from typing import Any

from tandem.cli.arguments import MISSING, NO_DEFAULT, Parameter, plain, signature, type_name
from tandem.cli.class_paths import class_path_of, known_classes
from tandem.cli.config.complete import plain_default
from tandem.cli.config.schema import Schema, Section, is_spec
from tandem.cli.links import Link
from tandem.cli.subcommands import SUBCOMMANDS

_HELP_WIDTH = 100
_OPTION_WIDTH = 26


def usage(prog: str, subcommand: str | None) -> str:
    """The usage line of a subcommand's help."""
    command = f"{prog} {subcommand}" if subcommand else prog
    return (
        f"usage: {command} [-h] [-c FILE] [--print_config] [--overwrite] "
        "[--KEY VALUE | --KEY=VALUE | KEY=VALUE | --KEY+=VALUE ...]"
    )


def top_help(prog: str, description: str, trainer_class: type) -> str:
    """``PROG --help``: the subcommands, each with the first sentence of the Trainer method it runs."""
    lines = [f"usage: {prog} [-h] {{{','.join(SUBCOMMANDS)}}} [options]", ""]
    if description:
        lines += [description, ""]
    lines.append("subcommands:")
    for name in SUBCOMMANDS:
        lines.append(f"  {name:<10}{first_sentence(getattr(trainer_class, name).__doc__)}")
    lines += ["", f"'{prog} SUBCOMMAND --help' lists a subcommand's options."]
    return "\n".join(lines)


def help_text(
    prog: str,
    subcommand: str | None,
    trainer_class: type,
    description: str,
    schema: Schema,
    links: list[Link],
    defaults: dict[str, Any],
) -> str:
    """``PROG SUBCOMMAND --help``: how settings are given, then every option with its type, default and help text
    (``defaults``: the parser's ``set_defaults``, over the signatures')."""
    lines = [usage(prog, subcommand), ""]
    if subcommand is not None:
        lines += [first_sentence(getattr(trainer_class, subcommand).__doc__), ""]
    elif description:
        lines += [description, ""]
    lines += textwrap.wrap(
        "Settings, lowest priority first: the defaults below < each --config FILE (YAML; several are merged in "
        "order) < options on the command line, written --trainer.max_epochs 5, --trainer.max_epochs=5 or "
        "trainer.max_epochs=5; --trainer.callbacks+=EarlyStopping appends to a list, and the options after it "
        "(--trainer.callbacks.patience=3) set the appended item. Values are YAML; ${model.hidden} and "
        "${oc.env:VAR} interpolate. Where a class fits, give {class_path: NAME, init_args: {...}} (short names "
        "for tandem's and torch.optim's classes).",
        _HELP_WIDTH,
    )
    lines += ["", "options:"]
    lines += _option("-h, --help", "show this help and exit")
    lines += _option("-c, --config FILE", "a YAML config file; give several to merge them in order")
    lines += _option("--print_config", "print the resolved config as YAML and exit")
    lines += _option("--overwrite", "replace a different config.yaml already in the run's log folder")
    for name, parameter in schema.values.items():
        default = defaults.get(name, NO_DEFAULT)
        lines += _option(f"--{name} {_metavar(parameter.hint)}", _describe(parameter, default))
    for key, section in schema.sections.items():
        lines += [""] + _section_help(section, defaults.get(key), links)
    return "\n".join(lines)


def _section_help(section: Section, defaults: Any, links: list[Link]) -> list[str]:
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
    parameters = list(signature(section.default).parameters.items())[section.skip :]
    if not parameters:
        lines.append("  (no arguments)")
    defaults = defaults if isinstance(defaults, dict) and not is_spec(defaults) else {}
    linked = {link.target.replace(".init_args.", "."): link for link in links}
    for name, parameter in parameters:
        if f"{key}.{name}" in linked:
            sources = ", ".join(linked[f"{key}.{name}"].sources)
            lines += _option(f"--{key}.{name}", f"set from {sources} by the program (not configurable)")
            continue
        default = section.defaults.get(name, parameter.default) if name != "callbacks" else parameter.default
        default = defaults.get(name, default)
        lines += _option(f"--{key}.{name} {_metavar(parameter.hint)}", _describe(parameter, default))
    return lines


def first_sentence(doc: str | None) -> str:
    if not doc:
        return ""
    text = plain(" ".join(doc.strip().split("\n\n")[0].split()))
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
