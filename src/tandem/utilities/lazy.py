"""Package attributes imported on first use (PEP 562), so ``import tandem`` loads only what a first ``Trainer(...)``
needs: ``from tandem.callbacks import ModelCheckpoint`` still works, and imports its module then."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_attributes(package: str, modules: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for ``modules`` (public name -> the module that defines it).

    Example::

        __getattr__, __dir__ = lazy_attributes(__name__, {"ModelCheckpoint": "tandem.callbacks.model_checkpoint"})
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:  # noqa: N807 (the module attribute hook's name)
        if name not in modules:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(modules[name]), name)
        namespace[name] = value  # found directly from now on
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted({*namespace, *modules})

    return __getattr__, __dir__
