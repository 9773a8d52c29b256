"""What ``ddp_spawn`` could not pickle, and why: the attribute path of the part that fails on its own."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Iterator
from typing import Any

import torch

from tandem.utilities.exceptions import TandemUserCodeError


def _unpicklable(error: Exception, roots: list[Any]) -> TandemUserCodeError | None:
    """Name the attribute that ddp_spawn could not pickle (e.g. ``MyModule.writer._lock``) and the ways out."""
    for root in roots:
        if root is None or isinstance(root, (str, int, float, bool)):
            continue
        root = getattr(root, "__self__", root)  # a bound method pickles its object
        found = _find_unpicklable(root, type(root).__name__, set(), 0)
        if found is not None:
            path, cause, obj = found
            return TandemUserCodeError(
                f"strategy='ddp_spawn' sends your module, data and Trainer to each process it starts by pickling "
                f"them, and {path} (a {type(obj).__module__}.{type(obj).__qualname__}) cannot be pickled: {cause}. "
                "Use strategy='ddp', which starts the ranks by re-running your script and pickles nothing; or make "
                "it picklable: create it in setup() or a hook rather than __init__, or leave it out in __getstate__."
            )
    return None


def _find_unpicklable(obj: Any, path: str, seen: set[int], depth: int) -> tuple[str, Exception, Any] | None:
    """The deepest part of ``obj`` that fails to pickle on its own, as (attribute path, error, object)."""
    try:
        pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        return None
    except Exception as err:  # any error: pickling runs arbitrary __reduce__ code
        error = err
    if depth >= 16 or id(obj) in seen:
        return path, error, obj
    seen.add(id(obj))
    for name, part in _parts(obj):
        found = _find_unpicklable(part, f"{path}{name}", seen, depth + 1)
        if found is not None:
            return found
    return path, error, obj


def _parts(obj: Any) -> Iterator[tuple[str, Any]]:
    """What pickling ``obj`` pickles in turn, with the name to show for each."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield f"[{key!r}]", value
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for index, value in enumerate(obj):
            yield f"[{index}]", value
        return
    if isinstance(obj, functools.partial):
        yield ".func", obj.func
        yield ".args", obj.args
        yield ".keywords", obj.keywords
        return
    if hasattr(obj, "__self__") and not isinstance(obj, type):
        yield ".__self__", obj.__self__
        return
    try:
        state = obj.__getstate__() if hasattr(obj, "__getstate__") else getattr(obj, "__dict__", None)
    except Exception:
        return
    if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
        state = {**(state[0] or {}), **(state[1] or {})}
    if not isinstance(state, dict):
        return
    for key, value in state.items():
        if isinstance(obj, torch.nn.Module) and key in ("_modules", "_parameters", "_buffers") and value:
            for name, sub in value.items():  # show module.net.lock, not module._modules['net']
                yield f".{name}", sub
        else:
            yield f".{key}", value
