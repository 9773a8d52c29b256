"""The layers of a config merged, lowest first, and the dotted paths into it (``trainer.callbacks.0.init_args``):
defaults < config files < a given mapping < the command line's overrides, ``--key+=VALUE`` appending to a list."""

from __future__ import annotations

import collections.abc
import copy
from typing import Any

from tandem.cli.arguments import NO_DEFAULT
from tandem.cli.config.request import Request
from tandem.cli.config.schema import SPEC_KEYS, is_spec
from tandem.cli.config.yaml_io import load_config_file, parse_value
from tandem.cli.errors import bad_command_line

OMIT = object()  # a default YAML cannot hold (an object): left out of the config, the class uses its own


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
        if is_spec(node) and part not in SPEC_KEYS and part not in node:
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
        if is_spec(node) and part not in SPEC_KEYS:
            node = node.setdefault("init_args", {})
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[int(part)]
    if is_spec(node) and name not in SPEC_KEYS:
        node = node.setdefault("init_args", {})
    if value is OMIT:
        node.pop(name, None)
    else:
        node[name] = value


def drop_path(config: dict[str, Any], key: str) -> None:
    """Remove the value at a dotted key of a completed config (a link target, computed rather than given)."""
    put_path(config, key, OMIT)


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
