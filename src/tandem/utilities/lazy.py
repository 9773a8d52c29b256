"""Package ``__init__`` files that import their public names on first use (PEP 562), so that ``import tandem``
loads only what the first ``Trainer(...)`` needs."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(
    package: str,
    names: Mapping[str, str],
    namespace: dict[str, Any],
    missing: Callable[[str, str], Exception] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` for names that live in submodules.

    Args:
        package: the package's ``__name__``.
        names: public name -> the module that defines it; imported when the name is first read, then cached in
            ``namespace``, so later reads cost nothing.
        namespace: the package's ``globals()``.
        missing: builds the error for any other name (default: the usual AttributeError).

    Example:
        ```python
        __getattr__, __dir__ = lazy_attributes(__name__, {"DDPStrategy": "tandem.strategies.ddp"}, globals())
        ```
    """

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            if missing is not None:
                raise missing(package, name)
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
