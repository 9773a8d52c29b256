"""A checkpoint's values as plain data: what ``torch.load(weights_only=True)`` reads, and nothing that runs code.

``encode`` writes every value of a checkpoint in a form torch's weights-only unpickler accepts: tensors,
numbers, strings, bytes, None, dtypes, devices, sizes and dicts / lists / tuples / sets of them stay as they are.
A few kinds of value that hyperparameters and callbacks commonly hold are written as tagged plain dicts
(``{"__tandem_value__": kind, ...}``) that ``decode`` turns back into the same value:

- a ``pathlib`` path (its class and text);
- an enum member (its class's ``module:qualname`` and the member's name);
- an ``argparse.Namespace`` (its fields), an OmegaConf ``DictConfig`` / ``ListConfig`` (its unresolved container);
- a numpy array or number (dtype, shape and bytes; never an object array);
- a ``datetime.timedelta``, ``datetime``, ``date`` or ``time``;
- a ``frozenset``, a set of such values, and a dict whose keys are such values (or that holds the tag itself).

Decoding builds only these types, from their fixed constructors: no class is imported and no callable named by
the file is called. An enum is looked up among the modules already imported (loading a checkpoint never imports a
module the file names); when its module is not imported, the error says which to import. Anything else (an
``nn.Module``, a function, an arbitrary object) is ``NotPlainData`` at save: the caller drops it with a
warning (hyperparameters) or refuses the save, naming it. Earlier tandem versions stored such values as pickled
bytes (``{"__tandem_pickled__": uint8 tensor}``); ``decode`` unpickles those only when told the file is
trusted.
"""

from __future__ import annotations

import argparse
import datetime
import enum
import pathlib
import pickle
import sys
from collections import OrderedDict
from typing import Any

import torch

TAG = "__tandem_value__"
#: how earlier tandem versions stored values ``torch.load(weights_only=True)`` refuses: their pickle as a uint8 tensor
LEGACY_PICKLED_KEY = "__tandem_pickled__"
_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype, torch.device, torch.Size)
_PATHS = {
    cls.__name__: cls
    for cls in (pathlib.Path, pathlib.PurePath, pathlib.PosixPath, pathlib.WindowsPath)
    + (pathlib.PurePosixPath, pathlib.PureWindowsPath)
}
#: the time types written as their ISO text (a datetime is a date)
_ISO_TIMES: dict[str, type[datetime.date] | type[datetime.time]] = {
    "datetime": datetime.datetime,
    "date": datetime.date,
    "time": datetime.time,
}
_TIMES: dict[str, type] = {"timedelta": datetime.timedelta, **_ISO_TIMES}


class NotPlainData(TypeError):
    """A value ``encode`` cannot write as plain data; ``where`` names it inside the checkpoint."""

    def __init__(self, where: str, value: Any) -> None:
        self.where, self.kind = where, f"{type(value).__module__}.{type(value).__qualname__}"
        super().__init__(f"{where} holds a {self.kind}, which a checkpoint cannot hold as plain data")


def encode(obj: Any, where: str = "checkpoint") -> Any:
    """``obj`` as plain data (see the module's docstring); raises ``NotPlainData`` naming the first value
    that cannot be, at ``where``-relative position (e.g. ``hparams['encoder']``)."""
    kind = type(obj)
    if kind in _LEAVES or isinstance(obj, torch.Tensor):
        return obj
    if kind is dict or kind is OrderedDict:
        if all(_plain_key(k) for k in obj) and TAG not in obj and LEGACY_PICKLED_KEY not in obj:
            return kind((k, encode(v, f"{where}[{k!r}]")) for k, v in obj.items())
        return _tagged("dict", ordered=kind is OrderedDict, items=_items(obj, where))
    if kind in (list, tuple):
        return kind(encode(v, f"{where}[{i}]") for i, v in enumerate(obj))
    if kind is set and all(type(v) in _LEAVES for v in obj):
        return obj
    if kind in (set, frozenset):
        return _tagged(kind.__name__, items=[encode(v, f"{where}{{{v!r}}}") for v in obj])
    if isinstance(obj, pathlib.PurePath) and kind.__name__ in _PATHS:
        return _tagged("path", cls=kind.__name__, path=str(obj))
    if isinstance(obj, enum.Enum):
        return _tagged("enum", cls=f"{kind.__module__}:{kind.__qualname__}", name=obj.name)
    if kind is argparse.Namespace:
        return _tagged("namespace", fields=encode(dict(vars(obj)), where))
    if kind.__name__ in _TIMES and _TIMES[kind.__name__] is kind:
        return _tagged(kind.__name__, iso=str(obj) if kind is datetime.timedelta else obj.isoformat(), **_exact(obj))
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(obj, (numpy.ndarray, numpy.generic)) and not obj.dtype.hasobject:
        array = numpy.asarray(obj)  # tobytes() is in C order; a scalar keeps its shape ()
        return _tagged(
            "numpy",
            dtype=array.dtype.str,
            shape=list(array.shape),
            data=array.tobytes(),
            scalar=kind is not numpy.ndarray,
        )
    omegaconf = sys.modules.get("omegaconf")
    if omegaconf is not None and isinstance(obj, (omegaconf.DictConfig, omegaconf.ListConfig)):
        container = omegaconf.OmegaConf.to_container(obj, resolve=False)
        return _tagged("omegaconf", container=encode(container, where))
    raise NotPlainData(where, obj)


def decode(obj: Any, trusted: bool = False, where: str = "checkpoint") -> Any:
    """Undo ``encode``. A value pickled by an earlier tandem version is unpickled only when ``trusted``;
    otherwise ``LegacyPickledValue`` names where it is."""
    kind = type(obj)
    if kind is dict or kind is OrderedDict:
        if len(obj) == 1 and isinstance(obj.get(LEGACY_PICKLED_KEY), torch.Tensor):
            if not trusted:
                raise LegacyPickledValue(where)
            return pickle.loads(obj[LEGACY_PICKLED_KEY].numpy().tobytes())  # the user said the file is trusted
        if isinstance(obj.get(TAG), str):
            return _decode_tagged(obj, trusted, where)
        return kind((k, decode(v, trusted, f"{where}[{k!r}]")) for k, v in obj.items())
    if kind in (list, tuple):
        return kind(decode(v, trusted, f"{where}[{i}]") for i, v in enumerate(obj))
    return obj


class LegacyPickledValue(ValueError):
    """A value stored as pickled bytes by an earlier tandem version, met while the file is not trusted."""

    def __init__(self, where: str) -> None:
        self.where = where
        super().__init__(f"{where} holds a pickled value")


class BadPlainData(ValueError):
    """A tagged value that does not decode (a damaged or hand-made file, or an enum whose module is not imported)."""


def _tagged(kind: str, **fields: Any) -> dict[str, Any]:
    return {TAG: kind, **fields}


def _plain_key(key: Any) -> bool:
    return type(key) in _LEAVES or type(key) is tuple and all(type(k) in _LEAVES for k in key)


def _items(obj: dict, where: str) -> list[list[Any]]:
    return [[encode(k, f"{where} key {k!r}"), encode(v, f"{where}[{k!r}]")] for k, v in obj.items()]


def _exact(value: Any) -> dict[str, Any]:
    """The fields that rebuild a time value exactly (the text is for people reading the file)."""
    if isinstance(value, datetime.timedelta):
        return {"days": value.days, "seconds": value.seconds, "microseconds": value.microseconds}
    return {}


def _decode_tagged(obj: dict[str, Any], trusted: bool, where: str) -> Any:
    kind = obj[TAG]
    try:
        if kind == "dict":
            items = [(decode(k, trusted, where), decode(v, trusted, where)) for k, v in obj["items"]]
            return OrderedDict(items) if obj.get("ordered") else dict(items)
        if kind in ("set", "frozenset"):
            values = (decode(v, trusted, where) for v in obj["items"])
            return set(values) if kind == "set" else frozenset(values)
        if kind == "path":
            return _PATHS[obj["cls"]](obj["path"])
        if kind == "enum":
            return _enum_member(obj["cls"], obj["name"], where)
        if kind == "namespace":
            return argparse.Namespace(**decode(obj["fields"], trusted, where))
        if kind == "timedelta":
            return datetime.timedelta(days=obj["days"], seconds=obj["seconds"], microseconds=obj["microseconds"])
        if kind in ("datetime", "date", "time"):
            return _ISO_TIMES[kind].fromisoformat(obj["iso"])
        if kind == "numpy":
            return _numpy(obj, where)
        if kind == "omegaconf":
            from omegaconf import OmegaConf

            return OmegaConf.create(decode(obj["container"], trusted, where))
    except BadPlainData:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, ImportError) as err:
        raise BadPlainData(
            f"{where} holds a {kind!r} value that does not decode ({type(err).__name__}: {err})"
        ) from None
    raise BadPlainData(f"{where} holds a value of the unknown kind {kind!r} (written by a newer tandem?)")


def _enum_member(name: str, member: str, where: str) -> enum.Enum:
    module_name, _, qualname = name.partition(":")
    found: Any = sys.modules.get(module_name)
    if found is None:
        raise BadPlainData(
            f"{where} holds the enum member {qualname}.{member} of module {module_name!r}, which is not imported; "
            f"loading a checkpoint never imports a module the file names: `import {module_name}` before loading."
        )
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if not (isinstance(found, type) and issubclass(found, enum.Enum)) or member not in found.__members__:
        raise BadPlainData(f"{where} names {name}.{member}, which is not a member of an enum in that module")
    return found.__members__[member]


def _numpy(obj: dict[str, Any], where: str) -> Any:
    import numpy

    dtype = numpy.dtype(obj["dtype"])
    if dtype.hasobject:
        raise BadPlainData(f"{where} holds a numpy array of Python objects, which tandem never writes")
    array = numpy.frombuffer(obj["data"], dtype=dtype).reshape(obj["shape"]).copy()
    return array[()] if obj.get("scalar") else array
