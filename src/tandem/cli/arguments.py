"""What a class accepts: its ``__init__`` parameters with their types, defaults and help text, read from the
signature, the type hints and the docstring's ``Args:`` section; and what a type hint lets a config value be (a
class_path, a list, a mapping, a plain string).
"""

from __future__ import annotations

import collections.abc
import datetime
import enum
import functools
import inspect
import os
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Literal, Union

import torch

NO_DEFAULT = inspect.Parameter.empty
MISSING = "???"  # omegaconf's mark for a value that must be given; --print_config shows required values so


# ---------------------------------------------------------------------------------------------- signatures
@dataclass(frozen=True)
class Parameter:
    """One argument of a class or method."""

    name: str
    hint: Any
    default: Any
    help: str = ""

    @property
    def required(self) -> bool:
        return self.default is NO_DEFAULT


@dataclass(frozen=True)
class Signature:
    """The arguments a class takes. ``accepts_kwargs``: it keeps a ``**kwargs`` for itself, so other names
    pass through unchecked."""

    cls: type
    parameters: dict[str, Parameter]
    accepts_kwargs: bool


def _terminal_classes() -> tuple[type, ...]:
    from tandem.module import DataModule, TrainingModule

    return (object, torch.nn.Module, TrainingModule, DataModule)


@functools.cache
def signature(cls: type) -> Signature:
    """The ``__init__`` arguments of ``cls``, following ``**kwargs`` that ``__init__`` hands to ``super().__init__``."""
    owner = next((k for k in cls.__mro__ if "__init__" in k.__dict__), object)
    if owner in _terminal_classes() or owner.__module__.startswith("torch.nn"):
        return Signature(cls, {}, False)
    init = owner.__dict__["__init__"]
    try:
        sig = inspect.signature(init)
    except (TypeError, ValueError):  # a builtin without a readable signature: take anything
        return Signature(cls, {}, True)
    docs = {**docstring_args(owner.__doc__), **docstring_args(init.__doc__)}
    parameters = function_parameters(init, docs, skip_first=True)
    var_kwargs = next((p.name for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD), None)
    if var_kwargs is None:
        return Signature(cls, parameters, False)
    parent = cls.__mro__[cls.__mro__.index(owner) + 1]
    if not _forwards_kwargs(init, var_kwargs):
        return Signature(cls, parameters, True)
    inherited = signature(parent)
    for name, parameter in inherited.parameters.items():
        parameters.setdefault(name, parameter)
    return Signature(cls, parameters, inherited.accepts_kwargs)


def _forwards_kwargs(init: Callable[..., Any], var_kwargs: str) -> bool:
    try:
        source = inspect.getsource(init)
    except (OSError, TypeError):
        return False
    return re.search(rf"super\(\)\.__init__\([^)]*\*\*{var_kwargs}\b", source) is not None


def function_parameters(fn: Callable[..., Any], docs: dict[str, str], skip_first: bool = False) -> dict[str, Parameter]:
    """The named parameters of ``fn`` (no ``*args`` / ``**kwargs``), with evaluated type hints."""
    hints = _type_hints(fn)
    out: dict[str, Parameter] = {}
    items = list(inspect.signature(fn).parameters.values())
    for parameter in items[1:] if skip_first else items:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        hint = hints.get(parameter.name, Any)
        out[parameter.name] = Parameter(parameter.name, hint, parameter.default, docs.get(parameter.name, ""))
    return out


def _type_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # one unresolvable annotation: evaluate the others one by one
        namespace = getattr(fn, "__globals__", {})
        hints = {}
        for name, annotation in getattr(fn, "__annotations__", {}).items():
            if isinstance(annotation, str):
                try:
                    annotation = eval(annotation, namespace)  # noqa: S307 (the annotation's own module)
                except Exception:
                    annotation = Any
            hints[name] = annotation
        return hints


_ARGS_HEADER = re.compile(r"^(Args|Arguments|Parameters|Keyword Args):$")
_ARG_ENTRY = re.compile(r"^(\*{0,2}\w+(?:\s*[/,]\s*\*{0,2}\w+)*)\s*(?:\([^)]*\))?\s*:(?:\s+(.*))?$")
# cross-references print as the names they show: a Sphinx role in a user's docstring (the class role on ~a.B -> B)
# and a mkdocstrings link in tandem's ([`Trainer`][tandem.Trainer] -> Trainer)
_ROLE = re.compile(r":\w+:`~?(?:[\w.]*\.)?(\w+)`")
_LINK = re.compile(r"\[`?([^\]`]+)`?\]\[[\w.]*\]")


def docstring_args(doc: str | None) -> dict[str, str]:
    """``{name: text}`` from a Google-style ``Args:`` section (``a / b: text`` documents both names)."""
    if not doc:
        return {}
    out: dict[str, str] = {}
    names: list[str] = []  # the names the current entry documents
    inside, indent = False, None
    for line in inspect.cleandoc(doc).splitlines():
        stripped = line.strip()
        if _ARGS_HEADER.match(stripped):
            inside, indent, names = True, None, []
            continue
        if not inside or not stripped:
            continue
        level = len(line) - len(line.lstrip())
        if level == 0:
            inside = False
            continue
        indent = level if indent is None else indent
        match = _ARG_ENTRY.match(stripped) if level == indent else None
        if match:
            names = [n.strip().lstrip("*") for n in re.split(r"[/,]", match.group(1))]
            for name in names:
                out[name] = match.group(2) or ""
        elif level > indent:
            for name in names:
                out[name] = f"{out[name]} {stripped}".strip()
    return {name: plain(text) for name, text in out.items()}


def plain(text: str) -> str:
    """Docstring text as the command line prints it: cross-references as their names, code without backticks."""
    return _LINK.sub(r"\1", _ROLE.sub(r"\1", text)).replace("``", "")


# ---------------------------------------------------------------------------------------------- types
def type_name(hint: Any) -> str:
    """A short readable name for a type hint: ``int | str | list[int]``."""
    if hint is Any or hint is NO_DEFAULT:
        return "Any"
    if hint is type(None):
        return "None"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin is collections.abc.Callable and args:
        params = "..." if args[0] is Ellipsis else ", ".join(type_name(a) for a in args[0])
        return f"Callable[[{params}], {type_name(args[1])}]"
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join('...' if a is Ellipsis else type_name(a) for a in args)}]" if args else name
    if isinstance(hint, type):
        return hint.__qualname__
    return str(hint).replace("typing.", "")


def union_members(hint: Any) -> tuple[Any, ...]:
    """The members of a union hint (``X | None`` included), or ``(hint,)``."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


_SCALAR_TYPES: tuple[type, ...] = (
    *(str, int, float, bool, bytes, complex, type(None), list, tuple, dict, set, frozenset, os.PathLike),
    datetime.timedelta,  # given in seconds
)


def is_class_hint(hint: Any) -> bool:
    """A hint naming a class whose instances a ``class_path`` builds (not a scalar, container or path)."""
    return (
        isinstance(hint, type)
        and typing.get_origin(hint) is None
        and hint not in _SCALAR_TYPES
        and not issubclass(hint, (PurePath, enum.Enum))
    )


def is_callable_hint(hint: Any) -> bool:
    return hint is collections.abc.Callable or typing.get_origin(hint) is collections.abc.Callable


def class_target(hint: Any) -> tuple[type, int, bool] | None:
    """For a hint that a ``class_path`` can fill: (base class, leading arguments left to the caller, whether
    the slot wants a callable rather than an instance). ``Any`` takes any class; ``None``: no class fits."""
    if hint is Any or hint is NO_DEFAULT or hint is object:
        return object, 0, False
    for member in union_members(hint):
        if is_class_hint(member):
            return member, 0, False
        if is_callable_hint(member):
            args = typing.get_args(member)
            skip = 0 if not args or args[0] is Ellipsis else len(args[0])
            returns = args[1] if len(args) == 2 and isinstance(args[1], type) else object
            return returns, skip, True
    return None


def accepts_plain_string(hint: Any) -> bool:
    """Whether a string value is meant as itself (``strategy: ddp``) rather than as a class name."""
    if hint is Any or hint is NO_DEFAULT or hint is object:
        return True
    for member in union_members(hint):
        if member is str or typing.get_origin(member) is Literal or member is os.PathLike:
            return True
        if isinstance(member, type) and issubclass(member, (PurePath, enum.Enum)):
            return True
    return False


def is_sequence_hint(hint: Any) -> bool:
    origin = typing.get_origin(hint) or hint
    sequences = (list, set, frozenset, collections.abc.Sequence, collections.abc.Iterable, collections.abc.Collection)
    return origin in sequences or origin is collections.abc.MutableSequence or origin is tuple


def is_mapping_hint(hint: Any) -> bool:
    origin = typing.get_origin(hint) or hint
    return origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def item_hint(hint: Any) -> Any:
    for member in union_members(hint):
        if is_sequence_hint(member):
            args = typing.get_args(member)
            return args[0] if args and args[0] is not Ellipsis else Any
    return Any if hint is Any or hint is NO_DEFAULT else hint  # a list where a class fits: check each item as one


def value_hint(hint: Any) -> Any:
    for member in union_members(hint):
        if is_mapping_hint(member):
            args = typing.get_args(member)
            return args[1] if len(args) == 2 else Any
    return Any
