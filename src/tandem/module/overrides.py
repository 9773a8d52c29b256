"""Which hooks a user's TrainingModule or DataModule defines (tandem calls a hook only when it does something)."""

from __future__ import annotations

import functools
import sys
from typing import Any

from tandem.module.datamodule import DataModule
from tandem.module.training_module import TrainingModule


def is_overridden(obj: TrainingModule | DataModule, name: str) -> bool:
    """``obj`` has its own ``name`` (tandem calls hooks only when they do something), as Lightning reads it: its
    class overrides the method, or a function is set on the instance (``model.on_train_start = fn``). An attribute
    set to None is not (``model.validation_step = None`` turns validation off); a wrapper (``functools.wraps``,
    ``partial``, ``Mock(wraps=...)``) counts as the function it wraps."""
    base = DataModule if isinstance(obj, DataModule) else TrainingModule
    found = _wrapped(getattr(obj, name, None))
    if not callable(found):
        return False
    own = getattr(base, name, None)
    if own is None:
        return callable(found)
    code = getattr(found, "__code__", None)
    return code is None or code is not getattr(own, "__code__", None)


def calls_hook(obj: TrainingModule | DataModule, name: str) -> bool:
    """Whether the loops call ``obj``'s hook ``name``: it is overridden (``is_overridden``), or a callable is set on
    the instance, whatever it wraps (Lightning calls every hook; tandem skips only the base's own no-ops)."""
    return is_overridden(obj, name) or callable(vars(obj).get(name))


def _wrapped(fn: Any) -> Any:
    """The function behind ``fn`` (a bound method's, a ``functools.wraps`` wrapper's, a partial's, a Mock's)."""
    fn = getattr(fn, "__wrapped__", fn)
    mock = sys.modules.get("unittest.mock")  # no Mock exists unless the module was imported
    if mock is not None and isinstance(fn, mock.Mock):
        return fn._mock_wraps
    return fn.func if isinstance(fn, functools.partial) else fn
