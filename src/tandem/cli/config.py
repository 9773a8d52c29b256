"""From a command line to a checked config, and from the config to objects. Pure: nothing here starts a process
or writes a file, so every mistake is reported before a run begins.

Layering, lowest first: the classes' signature defaults < each ``--config FILE.yaml`` in order < the command
line's overrides (``--trainer.max_epochs 5``, ``--model.lr=0.01`` or ``trainer.max_epochs=5``). Then:

1. ``complete``: every section filled with its defaults, each ``class_path`` resolved and its ``init_args``
   completed, unknown keys refused (required values without a default are marked ``???``);
2. ``resolve``: omegaconf interpolation (``${model.hidden}``, ``${oc.env:DATA_DIR}``);
3. ``check``: every value against its type hint (``model.lr=abc`` -> expected float);
4. ``build``: the objects, once the caller wants them.
"""

from __future__ import annotations

import collections.abc
import copy
import datetime
import enum
import os
import typing
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Literal, cast

from tandem.cli.arguments import (
    MISSING,
    NO_DEFAULT,
    Parameter,
    Signature,
    accepts_plain_string,
    class_target,
    is_callable_hint,
    is_class_hint,
    signature,
    type_name,
    union_members,
)
from tandem.cli.class_paths import class_path_of, resolve_class
from tandem.cli.errors import (
    CLIError,
    bad_command_line,
    bad_config_file,
    missing_required,
    unknown_key,
    wrong_type,
)

_SPEC_KEYS = ("class_path", "init_args")


# ---------------------------------------------------------------------------------------------- the schema
@dataclass(frozen=True)
class Section:
    """A top-level key built from a class: ``trainer``, ``model`` or ``data``.

    The value is the arguments of ``default`` (``model: {lr: 0.1}``), or ``{class_path, init_args}`` naming a
    subclass of ``base``. With no ``default`` the section is optional (None) unless ``required``.
    """

    key: str
    base: type
    default: type | None
    defaults: dict[str, Any] = field(default_factory=dict)  # overrides of the signature's defaults
    required: bool = False
    class_path_allowed: bool = True
    skip: int = 0  # leading arguments the caller passes (an optimizer's params)


@dataclass(frozen=True)
class Schema:
    """Every top-level key: plain values (``seed_everything``, ``ckpt_path``) and class sections, in print order."""

    values: dict[str, Parameter]
    sections: dict[str, Section]
    order: tuple[str, ...]

    def section_class(self, key: str, value: Any) -> type:
        """The class a section's (completed) value builds."""
        section = self.sections[key]
        if isinstance(value, dict) and "class_path" in value:
            return resolve_class(value["class_path"], section.base, f"{key}.class_path")
        if section.default is None:  # _complete_section refused such a value already
            raise missing_required(f"{key}.class_path", section.base)
        return section.default


# ---------------------------------------------------------------------------------------------- command line
@dataclass
class Request:
    """What a command line asks for, before any file is read."""

    configs: list[str] = field(default_factory=list)
    overrides: list[tuple[str, str]] = field(default_factory=list)  # (dotted key, raw value)
    print_config: bool = False
    overwrite: bool = False
    help: bool = False


def parse_argv(tokens: list[str]) -> Request:
    """Split the options after the subcommand: ``--config``, flags, and overrides in both spellings."""
    request = Request()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in ("-h", "--help"):
            request.help = True
        elif token in ("--print_config", "--print-config"):
            request.print_config = True
        elif token == "--overwrite":
            request.overwrite = True
        elif token in ("-c", "--config") or token.startswith("--config="):
            if "=" in token:
                request.configs.append(token.split("=", 1)[1])
            elif i + 1 < len(tokens):
                request.configs.append(tokens[i + 1])
                i += 1
            else:
                raise bad_command_line("--config needs a file: --config path/to/config.yaml")
        elif token.startswith("--") and len(token) > 2:
            key, eq, value = token[2:].partition("=")  # --trainer.callbacks+=EarlyStopping keeps its "+"
            if not eq:
                if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                    raise bad_command_line(
                        f"--{key} needs a value: --{key} VALUE or --{key}=VALUE (booleans too: --{key} true)."
                    )
                value = tokens[i + 1]
                i += 1
            request.overrides.append((key, value))
        elif "=" in token and not token.startswith("-"):
            key, _, value = token.partition("=")
            request.overrides.append((key, value))
        else:
            raise bad_command_line(
                f"Unexpected argument {token!r}. Give options as --section.key VALUE, --section.key=VALUE or "
                "section.key=VALUE (e.g. --trainer.max_epochs 5), and config files with --config FILE."
            )
        i += 1
    return request


def parse_value(raw: str) -> Any:
    """A command-line value read as YAML, as omegaconf reads dotlists: ``1e-3`` is a float, ``null`` None,
    ``[a, b]`` a list, ``${model.lr}`` an interpolation."""
    from omegaconf import OmegaConf

    try:
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"value={raw}"]), resolve=False)
        return cast("dict[str, Any]", parsed)["value"]  # a dotlist makes a mapping
    except Exception:
        return raw  # not YAML: the text itself


def load_config_file(path: str) -> dict[str, Any]:
    """A ``--config`` file as a plain dict (interpolations kept as text)."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not os.path.exists(path):
        raise bad_config_file(path, f"no such file (looked in {os.getcwd()}).")
    if not os.path.isfile(path):
        raise bad_config_file(path, "is a folder, not a YAML file.")
    try:
        loaded = OmegaConf.load(path)
    except (yaml.YAMLError, OmegaConfBaseException, UnicodeDecodeError) as err:
        reason = " ".join(str(err).split())
        raise bad_config_file(path, f"is not valid YAML: {reason}") from None
    content = OmegaConf.to_container(loaded, resolve=False)
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise bad_config_file(
            path, f"holds a YAML {type(content).__name__}; expected a mapping of keys (trainer:, model:, ...)."
        )
    return cast("dict[str, Any]", content)  # its keys are the names of a config's sections


# ---------------------------------------------------------------------------------------------- layering
def is_spec(value: Any) -> bool:
    return isinstance(value, dict) and "class_path" in value


def merge(base: Any, update: Any) -> Any:
    """``update`` over ``base``: mappings merged key by key, anything else replaced. A different ``class_path``
    replaces the whole mapping (the old class's init_args do not carry over)."""
    if not isinstance(base, dict) or not isinstance(update, dict):
        return copy.deepcopy(update)
    if is_spec(update) and is_spec(base) and update["class_path"] != base["class_path"]:
        return copy.deepcopy(update)
    merged = dict(base)
    for key, value in update.items():
        merged[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
    return merged


def set_path(config: dict[str, Any], key: str, value: Any) -> None:
    """``config[a][b][c] = value`` for ``key="a.b.c"``, creating mappings on the way. In a list a number picks an
    item (``trainer.callbacks.0.init_args.patience``) and a name goes to the last item, as jsonargparse reads
    ``--trainer.callbacks+=EarlyStopping --trainer.callbacks.patience=3``; a class name becomes the class_path
    of the mapping (``--model.optimizer SGD --model.optimizer.lr 0.1``)."""
    parts = _split_key(key)
    node: Any = config
    for depth, name in enumerate(parts):
        last = depth == len(parts) - 1
        part: str | int = name
        if isinstance(node, list):
            where = ".".join(parts[:depth])
            if not node:
                raise bad_command_line(f"{key}: {where} is an empty list; append an item first with --{where}+=VALUE.")
            if not name.isdigit():  # the arguments of the item appended last: the name is a key of its mapping
                node = _as_spec(node, len(node) - 1)
                if node is None:
                    raise bad_command_line(f"{key}: the last item of {where} is not a class; index it with a number.")
            elif int(name) >= len(node):
                raise bad_command_line(f"{key}: {where} is a list of {len(node)}; index it with 0..{len(node) - 1}.")
            else:
                part = int(name)
        current = node.get(part) if isinstance(node, dict) else node[part]
        if last:
            node[part] = merge(current, value) if isinstance(current, dict) and isinstance(value, dict) else value
            return
        if isinstance(current, str) and current:
            current = node[part] = {"class_path": current}  # --model.optimizer SGD --model.optimizer.lr 0.1
        elif not isinstance(current, (dict, list)):
            current = node[part] = {}
        node = current


def append_path(config: dict[str, Any], key: str, value: Any, default: Any = None) -> None:
    """``--key+=VALUE``: VALUE appended to the list at ``key`` (a list VALUE extends it), as jsonargparse does.
    The list is the one the layers so far hold, else ``default`` (the key's default, e.g. []).

    ``--trainer.callbacks+=EarlyStopping`` appends the class name; the options after it
    (``--trainer.callbacks.patience=3``) set that item's arguments (see ``set_path``)."""
    parts = _split_key(key)
    node: Any = config
    for part in parts[:-1]:
        nxt = node.get(part) if isinstance(node, dict) else None
        if not isinstance(nxt, dict):
            nxt = node[part] = {"class_path": nxt} if isinstance(nxt, str) and nxt else {}
        node = nxt
    name = parts[-1]
    current = node[name] if name in node else copy.deepcopy(default)
    items = [] if current is None else list(current) if isinstance(current, list) else [current]
    node[name] = items + (value if isinstance(value, list) else [value])


def _split_key(key: str) -> list[str]:
    parts = key.split(".")
    if any(not p for p in parts):
        raise bad_command_line(f"{key!r} is not a valid key: use dotted names such as trainer.max_epochs.")
    return parts


def _as_spec(items: list[Any], index: int) -> dict[str, Any] | None:
    """The mapping of a list item that names a class (a bare name becomes ``{class_path: name}``)."""
    item = items[index]
    if isinstance(item, str) and item:
        item = items[index] = {"class_path": item}
    return item if isinstance(item, dict) else None


def get_path(config: Any, key: str, default: Any = NO_DEFAULT) -> Any:
    """The value at a dotted key of a completed config; a class spec's arguments are read through its init_args
    (``model.hidden`` and ``model.init_args.hidden`` alike)."""
    node = config
    for part in key.split("."):
        if is_spec(node) and part not in _SPEC_KEYS and part not in node:
            node = node.get("init_args") or {}
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            if default is NO_DEFAULT:
                raise KeyError(key)
            return default
    return node


def put_path(config: dict[str, Any], key: str, value: Any) -> None:
    """Set the value at a dotted key of a completed config, through a class spec's init_args."""
    *parents, name = key.split(".")
    node: Any = config
    for part in parents:
        if is_spec(node) and part not in _SPEC_KEYS:
            node = node.setdefault("init_args", {})
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[int(part)]
    if is_spec(node) and name not in _SPEC_KEYS:
        node = node.setdefault("init_args", {})
    if value is _OMIT:
        node.pop(name, None)
    else:
        node[name] = value


def drop_path(config: dict[str, Any], key: str) -> None:
    """Remove the value at a dotted key of a completed config (a link target, computed rather than given)."""
    put_path(config, key, _OMIT)


def layer(
    request: Request,
    base: dict[str, Any] | None = None,
    default_of: collections.abc.Callable[[str], Any] | None = None,
    files: collections.abc.Sequence[str] = (),
    given: dict[str, Any] | None = None,
    replaced: list[tuple[str, list[Any], str]] | None = None,
) -> dict[str, Any]:
    """The user's layers merged, lowest first: ``base`` (a parser's ``set_defaults``), the ``files`` found by
    default, a ``given`` mapping (``CLI(args={...})``), each config file in order, then each override in order.
    ``default_of(key)``: the default a ``--key+=VALUE`` appends to when no layer set the key. ``replaced``
    collects ``(key, old list, raw value)`` for each plain override that replaced a non-empty list of a lower
    layer (``--trainer.callbacks EarlyStopping`` over a config's callbacks), which the caller reports."""
    config: dict[str, Any] = copy.deepcopy(base or {})
    for path in [*files, *request.configs]:
        config = merge(config, load_config_file(path))
    if given:
        config = merge(config, given)
    for key, raw in request.overrides:
        if key.endswith("+"):
            key = key[:-1]
            append_path(config, key, parse_value(raw), default_of(key) if default_of else None)
        else:
            value = parse_value(raw)
            current = get_path(config, key, None) if replaced is not None else None
            if replaced is not None and isinstance(current, list) and current and value != current:
                replaced.append((key, copy.deepcopy(current), raw))
            set_path(config, key, value)
    return config


# ---------------------------------------------------------------------------------------------- 1. complete
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
            if isinstance(value, dict) and not is_spec(value) and not _is_mapping_hint(parameter.hint):
                default = defaults[name] if defaults and name in defaults else parameter.default
                value = _onto_default_class(value, plain_default(default, parameter.hint), f"{key}.{name}")
            out[name] = complete_value(value, parameter.hint, f"{key}.{name}")
        elif defaults and name in defaults:  # an object YAML cannot hold is left out: the caller passes it
            default = plain_default(defaults[name], parameter.hint)
            if default is not _OMIT:
                out[name] = complete_value(default, parameter.hint, f"{key}.{name}")
        elif parameter.required:
            out[name] = MISSING
        else:
            default = plain_default(parameter.default, parameter.hint)
            if default is not _OMIT:
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
    given = {**init_args, **{k: v for k, v in value.items() if k not in _SPEC_KEYS}}
    return {
        "class_path": class_path_of(cls),
        "init_args": complete_args(signature(cls), given, f"{key}.init_args", skip),
    }


def complete_value(value: Any, hint: Any, key: str) -> Any:
    """Complete the class paths inside one value."""
    target = None if _is_mapping_hint(hint) else class_target(hint)
    if target is not None and is_spec(value):
        base, skip, _ = target
        return complete_spec(value, base, skip, key)
    if target is not None and isinstance(value, str) and "${" not in value and not accepts_plain_string(hint):
        base, skip, _ = target  # a bare class name where only a class fits: callbacks: [EarlyStopping]
        return complete_spec({"class_path": value}, base, skip, key)
    if isinstance(value, list):
        item = _item_hint(hint)
        return [complete_value(v, item, f"{key}.{i}") for i, v in enumerate(value)]
    if isinstance(value, dict):
        item = _value_hint(hint)
        return {k: complete_value(v, item, f"{key}.{k}") for k, v in value.items()}
    return value


_OMIT = object()  # a default YAML cannot hold (an object): left out of the config, the class uses its own


def plain_default(value: Any, hint: Any) -> Any:
    """A signature default as a YAML value, or ``_OMIT``."""
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
        return _OMIT if any(v is _OMIT for v in items) else items
    if isinstance(value, dict):
        mapping = {k: plain_default(v, Any) for k, v in value.items()}
        ok = all(isinstance(k, (str, int)) for k in mapping) and all(v is not _OMIT for v in mapping.values())
        return mapping if ok else _OMIT
    if isinstance(value, ClassCallable):
        return {"class_path": class_path_of(value.cls), "init_args": dict(value.kwargs)}
    if isinstance(value, type):
        if typing.get_origin(hint) is type or hint is type:
            return class_path_of(value)
        target = class_target(hint)
        if target is not None and target[2]:  # a class as the default of a callable slot: optimizer=torch.optim.Adam
            return complete_spec({"class_path": class_path_of(value)}, target[0], target[1], "default")
    return _OMIT


# ---------------------------------------------------------------------------------------------- 2. resolve
def resolve(config: dict[str, Any]) -> dict[str, Any]:
    """omegaconf interpolation over the completed config."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return cast("dict[str, Any]", OmegaConf.to_container(OmegaConf.create(config), resolve=True))  # a mapping
    except OmegaConfBaseException as err:
        where = getattr(err, "full_key", None) or "the config"
        reason = str(err).strip().splitlines()[0]
        raise CLIError(f"{where}: the interpolation could not be resolved: {reason}") from None


# ---------------------------------------------------------------------------------------------- 3. check
class _Mismatch(Exception):
    """The value is not of this type (a union tries its next member)."""


def check(schema: Schema, config: dict[str, Any], allow_missing: bool = False) -> dict[str, Any]:
    """Every value of a resolved config checked against its type hint and converted where YAML is loose
    (an int for a float, a number for a string). Required values left ``???`` are errors unless
    ``allow_missing`` (``--print_config`` shows them)."""
    out: dict[str, Any] = {}
    for key in schema.order:
        value = config.get(key)
        if key in schema.values:
            out[key] = check_value(value, schema.values[key].hint, key, allow_missing)
        elif value is None:
            out[key] = None
        else:
            section = schema.sections[key]
            cls = schema.section_class(key, value)
            if is_spec(value):
                out[key] = _check_spec(value, section.base, 0, key, allow_missing)
            else:
                out[key] = _check_args(signature(cls), value, key, 0, allow_missing)
    return out


def check_value(value: Any, hint: Any, key: str, allow_missing: bool = False) -> Any:
    try:
        return _check(value, hint, key, allow_missing)
    except _Mismatch:
        raise wrong_type(key, value, type_name(hint)) from None


def _check_args(sig: Signature, args: dict[str, Any], key: str, skip: int, allow_missing: bool) -> dict[str, Any]:
    out = {}
    for name, value in args.items():
        parameter = sig.parameters.get(name)
        out[name] = check_value(value, parameter.hint if parameter else Any, f"{key}.{name}", allow_missing)
    return out


def _check_spec(value: dict[str, Any], base: type, skip: int, key: str, allow_missing: bool) -> dict[str, Any]:
    cls = resolve_class(value["class_path"], base, f"{key}.class_path")
    args = _check_args(signature(cls), value.get("init_args") or {}, f"{key}.init_args", skip, allow_missing)
    return {"class_path": value["class_path"], "init_args": args}


def _kind_matches(value: Any, hint: Any) -> bool:
    """Whether ``hint`` is the natural type of ``value`` (tried first in a union)."""
    if hint is type(None):
        return value is None
    if isinstance(value, bool):
        return hint is bool
    if isinstance(value, int):
        return hint is int
    if isinstance(value, float):
        return hint is float
    if isinstance(value, str):
        return hint is str or typing.get_origin(hint) is Literal
    if isinstance(value, dict):
        return is_spec(value) != _is_mapping_hint(hint)
    if isinstance(value, list):
        return _is_sequence_hint(hint)
    return False


def _check(value: Any, hint: Any, key: str, allow_missing: bool) -> Any:  # noqa: C901 (one case per kind of hint)
    if isinstance(value, str) and value == MISSING:
        if allow_missing:
            return value
        raise missing_required(key, hint)
    if hint is Any or hint is NO_DEFAULT or hint is object:
        if is_spec(value):
            return _check_spec(value, object, 0, key, allow_missing)
        if isinstance(value, list):
            return [_check(v, Any, f"{key}.{i}", allow_missing) for i, v in enumerate(value)]
        if isinstance(value, dict):
            return {k: _check(v, Any, f"{key}.{k}", allow_missing) for k, v in value.items()}
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    members = union_members(hint)
    if len(members) > 1:
        if value is None:
            if type(None) in members:
                return None
            raise _Mismatch
        for member in sorted(members, key=lambda m: not _kind_matches(value, m)):
            try:
                return _check(value, member, key, allow_missing)
            except _Mismatch:
                continue
        raise _Mismatch
    if hint is type(None):
        if value is None:
            return None
        raise _Mismatch
    if origin is Literal:
        if value in args:
            return value
        raise _Mismatch
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise _Mismatch
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise _Mismatch
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise _Mismatch
    if hint is os.PathLike or (isinstance(hint, type) and issubclass(hint, PurePath)):
        if isinstance(value, str):
            return value
        raise _Mismatch
    if hint is datetime.timedelta:  # seconds
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return value
        raise _Mismatch
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        names = {m.name: m.name for m in hint} | {m.value: m.name for m in hint if isinstance(m.value, (str, int))}
        if isinstance(value, (str, int)) and value in names:
            return names[value]
        raise _Mismatch
    if origin is type or hint is type:
        if isinstance(value, str):
            base = args[0] if args and isinstance(args[0], type) else object
            return class_path_of(resolve_class(value, base, key))
        raise _Mismatch
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        if len(args) == 2 and args[1] is Ellipsis:
            return [_check(v, args[0], f"{key}.{i}", allow_missing) for i, v in enumerate(value)]
        if args and len(args) != len(value):
            raise _Mismatch
        return [
            _check(v, a, f"{key}.{i}", allow_missing) for i, (v, a) in enumerate(zip(value, args or [Any] * len(value)))
        ]
    if _is_sequence_hint(hint):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        item = _item_hint(hint)
        return [_check(v, item, f"{key}.{i}", allow_missing) for i, v in enumerate(value)]
    if _is_mapping_hint(hint):
        if not isinstance(value, dict):
            raise _Mismatch
        item = _value_hint(hint)
        return {k: _check(v, item, f"{key}.{k}", allow_missing) for k, v in value.items()}
    if is_callable_hint(hint) or is_class_hint(hint):
        if not is_spec(value):
            raise _Mismatch
        target = class_target(hint)
        assert target is not None  # a class or callable hint has its class
        base, skip, _ = target
        return _check_spec(value, base, skip, key, allow_missing)
    return value  # a typing construct tandem does not check (a TypeVar, a Protocol, ...)


def _is_sequence_hint(hint: Any) -> bool:
    origin = typing.get_origin(hint) or hint
    sequences = (list, set, frozenset, collections.abc.Sequence, collections.abc.Iterable, collections.abc.Collection)
    return origin in sequences or origin is collections.abc.MutableSequence or origin is tuple


def _is_mapping_hint(hint: Any) -> bool:
    origin = typing.get_origin(hint) or hint
    return origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def _item_hint(hint: Any) -> Any:
    for member in union_members(hint):
        if _is_sequence_hint(member):
            args = typing.get_args(member)
            return args[0] if args and args[0] is not Ellipsis else Any
    return Any if hint is Any or hint is NO_DEFAULT else hint  # a list where a class fits: check each item as one


def _value_hint(hint: Any) -> Any:
    for member in union_members(hint):
        if _is_mapping_hint(member):
            args = typing.get_args(member)
            return args[1] if len(args) == 2 else Any
    return Any


# ---------------------------------------------------------------------------------------------- 4. build
class ClassCallable:
    """What a ``class_path`` gives a callable slot (``optimizer: OptimizerCallable``): calling it with the
    remaining arguments builds the class, ``optimizer(self.parameters())``. Readable in hparams, picklable."""

    def __init__(self, cls: type, kwargs: dict[str, Any]) -> None:
        self.cls = cls
        self.kwargs = kwargs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.cls(*args, **{**self.kwargs, **kwargs})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClassCallable) and (self.cls, self.kwargs) == (other.cls, other.kwargs)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{class_path_of(self.cls)}({args})"


def build_section(schema: Schema, key: str, value: Any, extra: dict[str, Any] | None = None) -> Any:
    """The object a checked section describes (None for an absent optional section); ``extra``: arguments given
    as objects (set by links from other built objects)."""
    if value is None:
        return None
    cls = schema.section_class(key, value)
    args = value["init_args"] if is_spec(value) else value
    return _instantiate(cls, args, key, extra)


def build_value(value: Any, hint: Any, key: str = "") -> Any:
    """The object a checked value describes: class specs instantiated, lists turned to tuples where wanted."""
    if value is None:
        return None
    if is_spec(value) and not _is_mapping_hint(hint):
        target = class_target(hint) or (object, 0, False)
        base, skip, wants_callable = target
        cls = resolve_class(value["class_path"], base, f"{key}.class_path")
        if wants_callable:
            sig = signature(cls)
            kwargs = {
                name: build_value(v, sig.parameters[name].hint if name in sig.parameters else Any, f"{key}.{name}")
                for name, v in value["init_args"].items()
            }
            return ClassCallable(cls, kwargs)
        return _instantiate(cls, value["init_args"], key)
    members = union_members(hint)
    if isinstance(value, list):
        sequence = next((m for m in members if _is_sequence_hint(m)), None)
        if sequence is None:  # Any, or a list where a class fits: build each item
            return [build_value(v, _item_hint(hint), f"{key}.{i}") for i, v in enumerate(value)]
        origin, args = typing.get_origin(sequence) or sequence, typing.get_args(sequence)
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return tuple(build_value(v, a, f"{key}.{i}") for i, (v, a) in enumerate(zip(value, args)))
        items = [build_value(v, _item_hint(sequence), f"{key}.{i}") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if isinstance(value, dict):
        return {k: build_value(v, _value_hint(hint), f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, (int, float)) and not isinstance(value, bool) and datetime.timedelta in members:
        return datetime.timedelta(seconds=value)
    if isinstance(value, str):
        for member in members:
            if member is str or typing.get_origin(member) is Literal or member is os.PathLike:
                return value
            if typing.get_origin(member) is type or member is type:
                return resolve_class(value, object, key)
            if isinstance(member, type) and issubclass(member, PurePath):
                return member(value)
            if isinstance(member, type) and issubclass(member, enum.Enum):
                return member[value]
    return value


def _instantiate(cls: type, args: dict[str, Any], key: str, extra: dict[str, Any] | None = None) -> Any:
    sig = signature(cls)
    kwargs = {
        name: build_value(value, sig.parameters[name].hint if name in sig.parameters else Any, f"{key}.{name}")
        for name, value in args.items()
    }
    return cls(**{**kwargs, **(extra or {})})


# ---------------------------------------------------------------------------------------------- output
def to_yaml(config: dict[str, Any]) -> str:
    """The config as YAML, the text ``--print_config`` prints and ``config.yaml`` holds."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(config))
