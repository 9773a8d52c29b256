"""1. complete: every key of a config given a value, the user's or the default; each ``class_path`` resolved and its
``init_args`` completed, unknown keys refused, required values without a default marked ``???``."""

from __future__ import annotations

import datetime
import enum
import typing
from collections.abc import Iterable
from pathlib import PurePath
from typing import Any

from tandem.cli.arguments import (
    MISSING,
    Signature,
    accepts_plain_string,
    class_target,
    is_mapping_hint,
    item_hint,
    signature,
    value_hint,
)
from tandem.cli.class_paths import class_path_of, resolve_class
from tandem.cli.config.build import ClassCallable
from tandem.cli.config.layers import OMIT, merge
from tandem.cli.config.schema import SPEC_KEYS, Schema, Section, is_spec
from tandem.cli.errors import CLIError, bad_command_line, missing_required, unknown_key, wrong_type


def complete(schema: Schema, user: dict[str, Any]) -> dict[str, Any]:
    """Every key of the schema with a value: the user's, else the default. Class paths resolved, init_args
    completed; required values without one are ``???``."""
    for key in user:
        if key in ("optimizer", "lr_scheduler") and key not in schema.order:
            kind = "OptimizerCallable" if key == "optimizer" else "LRSchedulerCallable"
            raise CLIError(
                f"Unknown key {key!r}: tandem builds the {key} in the module. Give its __init__ an argument "
                f"`{key}: tandem.cli.{kind}` and set it with --model.{key} (a class_path with init_args)."
            )
        if key not in schema.values and key not in schema.sections:
            raise unknown_key(key, schema.order)
    out: dict[str, Any] = {}
    for key in schema.order:
        if key in schema.values:
            parameter = schema.values[key]
            if key in user:
                out[key] = complete_value(user[key], parameter.hint, key)
            else:
                out[key] = MISSING if parameter.required else plain_default(parameter.default, parameter.hint)
        else:
            out[key] = _complete_section(schema.sections[key], user.get(key))
    return out


def _complete_section(section: Section, given: Any) -> Any:
    key = section.key
    if isinstance(given, str):  # --model MyModel
        given = {"class_path": given}
    if given is None and section.default is None:
        if section.required:
            raise missing_required(f"{key}.class_path", section.base)
        return None
    if given is not None and not isinstance(given, dict):
        raise wrong_type(key, given, f"a mapping of {key} arguments, or a class_path with init_args")
    given = given or {}
    if not is_spec(given):
        if "init_args" in given:
            raise bad_command_line(f"{key}.init_args was given without {key}.class_path; add the class_path.")
        if section.default is None:
            raise missing_required(f"{key}.class_path", section.base)
        return complete_args(signature(section.default), given, key, section.skip, section.defaults)
    if not section.class_path_allowed:
        raise unknown_key(f"{key}.class_path", signature(section.default).parameters)
    spec = complete_spec(given, section.base, section.skip, key)
    if resolve_class(spec["class_path"], section.base, key) is section.default:
        return spec["init_args"]  # the section's own class: written as its arguments
    return spec


def complete_args(
    sig: Signature, given: dict[str, Any], key: str, skip: int = 0, defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The arguments of one class: the given ones (checked to exist) and the defaults of the others."""
    parameters = list(sig.parameters.values())[skip:]
    names = [p.name for p in parameters]
    unknown = [name for name in given if name not in names]
    if unknown and not sig.accepts_kwargs:
        raise unknown_key(f"{key}.{unknown[0]}", names)
    out: dict[str, Any] = {}
    for parameter in parameters:
        name = parameter.name
        if name in given:
            value = given[name]
            if isinstance(value, dict) and not is_spec(value) and not is_mapping_hint(parameter.hint):
                default = defaults[name] if defaults and name in defaults else parameter.default
                value = _onto_default_class(value, plain_default(default, parameter.hint), f"{key}.{name}")
            out[name] = complete_value(value, parameter.hint, f"{key}.{name}")
        elif defaults and name in defaults:  # an object YAML cannot hold is left out: the caller passes it
            default = plain_default(defaults[name], parameter.hint)
            if default is not OMIT:
                out[name] = complete_value(default, parameter.hint, f"{key}.{name}")
        elif parameter.required:
            out[name] = MISSING
        else:
            default = plain_default(parameter.default, parameter.hint)
            if default is not OMIT:
                out[name] = default
    for name in unknown:  # kept by a **kwargs of the class
        out[name] = given[name]
    return out


def _onto_default_class(value: dict[str, Any], default: Any, key: str) -> dict[str, Any]:
    """Arguments without a class_path (``--model.optimizer.lr 0.01``) for a slot whose default is a class: that
    class with them, over its default arguments, as jsonargparse reads them."""
    if not is_spec(default):
        if "init_args" in value:
            raise bad_command_line(
                f"{key}.init_args was given without {key}.class_path, and {key} has no default class; add the "
                f"class_path (--{key} CLASS)."
            )
        return value
    given = {**(value.get("init_args") or {}), **{k: v for k, v in value.items() if k != "init_args"}}
    return {"class_path": default["class_path"], "init_args": merge(default.get("init_args") or {}, given)}


def complete_spec(value: dict[str, Any], base: type, skip: int, key: str) -> dict[str, Any]:
    """``{class_path, init_args}`` with the class's full path and every argument; keys next to class_path
    (``{class_path: EarlyStopping, patience: 3}``) count as init_args."""
    cls = resolve_class(value["class_path"], base, f"{key}.class_path")
    init_args = value.get("init_args") or {}
    if not isinstance(init_args, dict):
        raise wrong_type(f"{key}.init_args", init_args, "a mapping of argument names to values")
    given = {**init_args, **{k: v for k, v in value.items() if k not in SPEC_KEYS}}
    return {
        "class_path": class_path_of(cls),
        "init_args": complete_args(signature(cls), given, f"{key}.init_args", skip),
    }


def complete_value(value: Any, hint: Any, key: str) -> Any:
    """Complete the class paths inside one value."""
    target = None if is_mapping_hint(hint) else class_target(hint)
    if target is not None and is_spec(value):
        base, skip, _ = target
        return complete_spec(value, base, skip, key)
    if target is not None and isinstance(value, str) and "${" not in value and not accepts_plain_string(hint):
        base, skip, _ = target  # a bare class name where only a class fits: callbacks: [EarlyStopping]
        return complete_spec({"class_path": value}, base, skip, key)
    if isinstance(value, list):
        item = item_hint(hint)
        return [complete_value(v, item, f"{key}.{i}") for i, v in enumerate(value)]
    if isinstance(value, dict):
        item = value_hint(hint)
        return {k: complete_value(v, item, f"{key}.{k}") for k, v in value.items()}
    return value


def plain_default(value: Any, hint: Any) -> Any:
    """A signature default as a YAML value, or ``OMIT``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (list, tuple)):
        items = [plain_default(v, Any) for v in value]
        return OMIT if any(v is OMIT for v in items) else items
    if isinstance(value, dict):
        mapping = {k: plain_default(v, Any) for k, v in value.items()}
        ok = all(isinstance(k, (str, int)) for k in mapping) and all(v is not OMIT for v in mapping.values())
        return mapping if ok else OMIT
    if isinstance(value, ClassCallable):
        return {"class_path": class_path_of(value.cls), "init_args": dict(value.kwargs)}
    if isinstance(value, type):
        if typing.get_origin(hint) is type or hint is type:
            return class_path_of(value)
        target = class_target(hint)
        if target is not None and target[2]:  # a class as the default of a callable slot: optimizer=torch.optim.Adam
            return complete_spec({"class_path": class_path_of(value)}, target[0], target[1], "default")
    return OMIT


def append_default(schema: Schema, key: str) -> Any:
    """The default a ``--key+=VALUE`` appends to when no layer set ``key`` (``trainer.callbacks``: [])."""
    root, _, name = key.partition(".")
    if not name and root in schema.values:
        return plain_default(schema.values[root].default, schema.values[root].hint)
    section = schema.sections.get(root)
    if section is None or section.default is None or "." in name:
        return None
    parameter = signature(section.default).parameters.get(name)
    if parameter is None:
        return None
    default = section.defaults.get(name, parameter.default)
    return plain_default(default, parameter.hint) if name != "callbacks" else None


def holds_missing(value: Any) -> bool:
    if isinstance(value, dict):
        return any(holds_missing(v) for v in value.values())
    if isinstance(value, list):
        return any(holds_missing(v) for v in value)
    return isinstance(value, str) and value == MISSING


def missing_keys(config: Any, prefix: str = "") -> list[str]:
    """The dotted keys still ``???``."""
    items: Iterable[tuple[Any, Any]]
    if isinstance(config, dict):
        items = config.items()
    elif isinstance(config, list):
        items = ((str(i), v) for i, v in enumerate(config))
    else:
        return [prefix] if isinstance(config, str) and config == MISSING else []
    return [key for name, value in items for key in missing_keys(value, f"{prefix}.{name}" if prefix else name)]
