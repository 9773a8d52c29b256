"""``class_path`` names: the shortest import path of a class (``tandem.callbacks.ModelCheckpoint``), and the class a
name gives, a dotted import path (``torch.optim.SGD``) or a short name of tandem's, torch.optim's or an imported
subclass's (``ModelCheckpoint``)."""

from __future__ import annotations

import difflib
import importlib
import sys
from typing import Any

from tandem.cli.errors import bad_class_path

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
