"""4. build: the objects a checked config describes, class specs instantiated (a callable slot gets a
``ClassCallable``), lists turned to tuples where the hint wants one."""

from __future__ import annotations

import datetime
import enum
import os
import typing
from pathlib import PurePath
from typing import Any, Literal

from tandem.cli.arguments import (
    class_target,
    is_mapping_hint,
    is_sequence_hint,
    item_hint,
    signature,
    union_members,
    value_hint,
)
from tandem.cli.class_paths import class_path_of, resolve_class
from tandem.cli.config.schema import Schema, is_spec


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
    if is_spec(value) and not is_mapping_hint(hint):
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
        sequence = next((m for m in members if is_sequence_hint(m)), None)
        if sequence is None:  # Any, or a list where a class fits: build each item
            return [build_value(v, item_hint(hint), f"{key}.{i}") for i, v in enumerate(value)]
        origin, args = typing.get_origin(sequence) or sequence, typing.get_args(sequence)
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return tuple(build_value(v, a, f"{key}.{i}") for i, (v, a) in enumerate(zip(value, args)))
        items = [build_value(v, item_hint(sequence), f"{key}.{i}") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if isinstance(value, dict):
        return {k: build_value(v, value_hint(hint), f"{key}.{k}") for k, v in value.items()}
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


def instantiate_spec(spec: dict[str, Any], first: Any) -> Any:
    """``{class_path, init_args}`` built with a leading argument (an optimizer's parameters)."""
    cls = resolve_class(spec["class_path"], object, "class_path")
    sig = signature(cls)
    kwargs = {
        name: build_value(value, sig.parameters[name].hint if name in sig.parameters else Any, name)
        for name, value in (spec.get("init_args") or {}).items()
    }
    return cls(first, **kwargs)


def trainer_arguments(
    trainer_class: type,  # (a type[Trainer] is not Hashable to mypy: the cache of signature takes it)
    trainer_config: dict[str, Any],
    trainer_defaults: dict[str, Any],
) -> dict[str, Any]:
    """The Trainer's arguments: its checked config built, and the ``trainer_defaults`` a config cannot hold."""
    sig = signature(trainer_class)
    kwargs = {
        name: build_value(value, sig.parameters[name].hint if name in sig.parameters else Any, f"trainer.{name}")
        for name, value in trainer_config.items()
    }
    for name, value in trainer_defaults.items():  # objects a config cannot hold
        if name != "callbacks" and name not in trainer_config:
            kwargs[name] = value
    return kwargs
