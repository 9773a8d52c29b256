"""3. check: every value of a resolved config against its type hint (``model.lr=abc`` -> expected float), converted
where YAML is loose (an int for a float, a number for a string)."""

from __future__ import annotations

import datetime
import enum
import os
import typing
from pathlib import PurePath
from typing import Any, Literal

from tandem.cli.arguments import (
    MISSING,
    NO_DEFAULT,
    Signature,
    class_target,
    is_callable_hint,
    is_class_hint,
    is_mapping_hint,
    is_sequence_hint,
    item_hint,
    signature,
    type_name,
    union_members,
    value_hint,
)
from tandem.cli.class_paths import class_path_of, resolve_class
from tandem.cli.config.schema import Schema, is_spec
from tandem.cli.errors import missing_required, wrong_type


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
        return is_spec(value) != is_mapping_hint(hint)
    if isinstance(value, list):
        return is_sequence_hint(hint)
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
    if is_sequence_hint(hint):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        item = item_hint(hint)
        return [_check(v, item, f"{key}.{i}", allow_missing) for i, v in enumerate(value)]
    if is_mapping_hint(hint):
        if not isinstance(value, dict):
            raise _Mismatch
        item = value_hint(hint)
        return {k: _check(v, item, f"{key}.{k}", allow_missing) for k, v in value.items()}
    if is_callable_hint(hint) or is_class_hint(hint):
        if not is_spec(value):
            raise _Mismatch
        target = class_target(hint)
        assert target is not None  # a class or callable hint has its class
        base, skip, _ = target
        return _check_spec(value, base, skip, key, allow_missing)
    return value  # a typing construct tandem does not check (a TypeVar, a Protocol, ...)
