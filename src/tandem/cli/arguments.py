"""What a class accepts: its ``__init__`` parameters with their types, defaults and help text, read from the
signature, the type hints and the docstring's ``Args:`` section. Also ``class_path`` names (``"ModelCheckpoint"``,
``"torch.optim.SGD"``) resolved to classes, and the command line's errors, one helper per kind of mistake.
"""

from __future__ import annotations

import collections.abc
import datetime
import difflib
import enum
import functools
import importlib
import inspect
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Literal, Union

import torch

from tandem.utilities.exceptions import TandemConfigError

NO_DEFAULT = inspect.Parameter.empty
MISSING = "???"  # omegaconf's mark for a value that must be given; --print_config shows required values so

#: modules whose classes have short names (``ModelCheckpoint`` for ``tandem.callbacks.ModelCheckpoint``)
SHORT_NAME_MODULES = (
    "tandem",
    "tandem.callbacks",
    "tandem.loggers",
    "tandem.strategies",
    "tandem.cli",
    "torch.optim",
    "torch.optim.lr_scheduler",
)


# ---------------------------------------------------------------------------------------------- errors
class CLIError(TandemConfigError):
    """A command line or config file that tandem cannot turn into a run."""


def unknown_key(key: str, valid: Iterable[str]) -> CLIError:
    """``key`` names no argument; suggest the closest valid names."""
    prefix, _, name = key.rpartition(".")
    valid = sorted(valid)
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    where = f"{prefix}." if prefix else ""
    hint = f" Did you mean {' or '.join(repr(where + c) for c in close)}?" if close else ""
    listed = ", ".join(valid) if valid else "none"
    return CLIError(f"Unknown key {key!r}.{hint} Valid keys{' of ' + prefix if prefix else ''}: {listed}.")


def wrong_type(key: str, value: Any, expected: str) -> CLIError:
    """``value`` given for ``key`` is not of the type the argument takes."""
    return CLIError(
        f"{key}={value!r} is not valid: expected {expected}. Fix it in the config file or on the command line "
        f"(--{key} VALUE)."
    )


def missing_required(key: str, hint: Any) -> CLIError:
    """A required argument (no default) was given no value."""
    return CLIError(
        f"{key} is required ({type_name(hint)}, no default). Set it in a config file or pass --{key} VALUE."
    )


def bad_class_path(key: str, path: Any, reason: str) -> CLIError:
    """A ``class_path`` that does not import, or names a class that does not fit the slot."""
    return CLIError(f"{key}={path!r}: {reason}")


def bad_config_file(path: str, reason: str) -> CLIError:
    """A ``--config`` file that is missing or not a YAML mapping."""
    return CLIError(f"--config {path}: {reason}")


def bad_command_line(reason: str) -> CLIError:
    """Tokens the command line cannot parse."""
    return CLIError(reason)


def list_replaced(key: str, old: list[Any], raw: str) -> str:
    """The note for ``--key VALUE`` (``raw``) replacing the list ``old`` that a lower layer (a config file) gave."""

    def named(item: Any) -> str:
        path = item.get("class_path") if isinstance(item, dict) else item
        return str(path).rsplit(".", 1)[-1] if isinstance(path, str) else type(item).__name__

    items = f"{len(old)} item{'s' if len(old) > 1 else ''}: {', '.join(named(item) for item in old)}"
    return (
        f"--{key} {raw} replaced the list the config gave {key} ({items}) with {raw}: a plain --{key} VALUE sets "
        f"the whole list. To add to the list instead, write --{key}+={raw} (the options after it, "
        f"--{key}.NAME VALUE, set the appended item)."
    )


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


# ---------------------------------------------------------------------------------------------- class paths
def class_path_of(cls: type) -> str:
    """The shortest import path of ``cls``: ``tandem.callbacks.ModelCheckpoint``, ``torch.optim.SGD``."""
    module, qualname = cls.__module__, cls.__qualname__
    parts = module.split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i])
        if getattr(sys.modules.get(prefix), qualname, None) is cls:
            return f"{prefix}.{qualname}"
    return f"{module}.{qualname}"


def resolve_class(path: Any, base: type, key: str) -> type:
    """The class a ``class_path`` names: a dotted import path, or a short name of one of tandem's or torch.optim's
    classes, or of a subclass of ``base`` already imported. It must be a subclass of ``base``."""
    if not isinstance(path, str) or not path.strip():
        raise bad_class_path(key, path, f"expected a class name or a dotted import path of a {base.__name__}.")
    cls = _import_dotted(path, key) if "." in path else _short_name(path, base, key)
    if not isinstance(cls, type):
        raise bad_class_path(key, path, f"{path} is a {type(cls).__name__}, not a class.")
    if not issubclass(cls, base):
        raise bad_class_path(
            key, path, f"{class_path_of(cls)} is not a subclass of {class_path_of(base)}, which this key needs."
        )
    return cls


def _import_dotted(path: str, key: str) -> Any:
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:i])
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name is not None and module_name.startswith(err.name):
                continue  # no such module: maybe the last part is an attribute of a shorter one
            raise bad_class_path(key, path, f"importing {module_name} failed: {err}") from None
        except Exception as err:
            raise bad_class_path(key, path, f"importing {module_name} failed: {type(err).__name__}: {err}") from None
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                raise bad_class_path(key, path, f"module {module_name} has no {'.'.join(parts[i:])}.")
            obj = getattr(obj, attr)
        return obj
    raise bad_class_path(key, path, f"no module named {parts[0]!r}; check the spelling or install it.")


def known_classes(base: type) -> dict[str, list[type]]:
    """Short name -> classes: tandem's and torch.optim's, plus the imported subclasses of ``base``."""
    found: dict[str, list[type]] = {}

    def add(cls: Any) -> None:  # any attribute of a module: a class of base's is kept
        if isinstance(cls, type) and issubclass(cls, base) and cls not in found.setdefault(cls.__name__, []):
            found[cls.__name__].append(cls)

    for name in SHORT_NAME_MODULES:
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", dir(module)):
            add(getattr(module, attr, None))
    if base is not object:
        stack: list[type] = list(base.__subclasses__())
        while stack:
            cls = stack.pop()
            add(cls)
            stack.extend(cls.__subclasses__())
    main = sys.modules.get("__main__")
    for value in list(vars(main).values()) if main is not None else []:
        add(value)
    return {name: classes for name, classes in found.items() if classes}


def _short_name(name: str, base: type, key: str) -> type:
    known = known_classes(base)
    classes = known.get(name, [])
    if len(classes) == 1:
        return classes[0]
    if len(classes) > 1:
        paths = ", ".join(sorted(class_path_of(c) for c in classes))
        raise bad_class_path(key, name, f"the short name is ambiguous ({paths}); give the full dotted path.")
    elsewhere = known_classes(object).get(name, []) if base is not object else []
    if len(elsewhere) == 1:
        found = class_path_of(elsewhere[0])
        raise bad_class_path(key, name, f"{found} is not a subclass of {class_path_of(base)}, which this key needs.")
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    what = f"a subclass of {base.__name__}" if base is not object else "a class"
    raise bad_class_path(
        key,
        name,
        f"no class of that name is known.{hint} Give a dotted import path (e.g. 'mypackage.models.MyModel') "
        f"of {what}, or a short name of tandem's own classes or torch.optim's.",
    )
