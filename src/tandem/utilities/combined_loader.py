"""``CombinedLoader``: several iterables (a list, a dict, nested ones) read together as one, in Lightning's modes.

As ``lightning.pytorch.utilities.combined_loader.CombinedLoader``: iterating yields ``(batch, batch_idx,
dataloader_idx)``; the batch has the shape of the collection given (``{"a": batch_a, "b": batch_b}``), except in
``"sequential"`` mode, which yields each iterable's batches in turn. ``Trainer.fit`` reads a list or dict of
training loaders as ``CombinedLoader(loaders, "max_size_cycle")``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

_ITERATOR_RETURN = tuple[Any, int, int]  # batch, batch_idx, dataloader_idx

Mode = Literal["min_size", "max_size_cycle", "max_size", "sequential"]


# ---------------------------------------------------------------------- the collection, flat and back
@dataclass(frozen=True)
class _Spec:
    """How a flat list of leaves goes back into the collection it came from."""

    kind: type | None  # None: a leaf
    keys: tuple[Any, ...] = ()
    children: tuple[_Spec, ...] = ()

    @property
    def leaves(self) -> int:
        return 1 if self.kind is None else sum(child.leaves for child in self.children)


_LEAF = _Spec(None)


def _is_container(tree: Any) -> bool:
    """A list, tuple (named too) or mapping holding something other than plain numbers and strings (a list of
    ints is one iterable, as in Lightning)."""
    if isinstance(tree, Mapping):
        values: Iterable[Any] = tree.values()
    elif isinstance(tree, (list, tuple)):
        values = tree
    else:
        return False
    return not all(isinstance(value, (int, float, str)) for value in values)


def tree_flatten(tree: Any) -> tuple[list[Any], _Spec]:
    """The iterables of ``tree`` in order (a dict's in its keys' order), and its shape."""
    if not _is_container(tree):
        return [tree], _LEAF
    keys = tuple(tree) if isinstance(tree, Mapping) else tuple(range(len(tree)))
    leaves: list[Any] = []
    specs = []
    for key in keys:
        flat, spec = tree_flatten(tree[key])
        leaves += flat
        specs.append(spec)
    return leaves, _Spec(type(tree), keys, tuple(specs))


def tree_unflatten(leaves: Iterable[Any], spec: _Spec) -> Any:
    """``leaves`` in the shape ``spec`` (from ``tree_flatten``)."""
    return _build(iter(leaves), spec)


def _build(leaves: Iterator[Any], spec: _Spec) -> Any:
    if spec.kind is None:
        return next(leaves)
    values = [_build(leaves, child) for child in spec.children]
    kind = spec.kind
    if issubclass(kind, Mapping):
        pairs = zip(spec.keys, values)
        return OrderedDict(pairs) if issubclass(kind, OrderedDict) else dict(pairs)
    if issubclass(kind, tuple) and hasattr(kind, "_fields"):  # a namedtuple
        return kind(*values)
    return kind(values) if kind in (list, tuple) else list(values)


# ---------------------------------------------------------------------- lengths
def _length(iterable: Any) -> int | float:
    """``len(iterable)``, or inf when it has none."""
    try:
        return len(iterable)
    except (TypeError, NotImplementedError):
        return float("inf")


# ---------------------------------------------------------------------- one iterator per mode
class _ModeIterator(Iterator[_ITERATOR_RETURN]):
    """One pass over ``iterables`` in a mode. ``limits``: batches per iterable counted by ``len`` (the loops stop
    there; ``"sequential"`` moves on to the next iterable there)."""

    def __init__(self, iterables: list[Iterable[Any]], limits: list[int | float] | None = None) -> None:
        if limits is not None and len(limits) != len(iterables):
            raise ValueError(f"Mismatch in number of limits ({len(limits)}) and number of iterables ({len(iterables)})")
        self.iterables, self.limits = iterables, limits
        self.iterators: list[Iterator[Any]] = []
        self._idx = 0  # the batch_idx of the next batch

    def __iter__(self) -> _ModeIterator:
        self.iterators = [iter(iterable) for iterable in self.iterables]
        self._idx = 0
        return self

    def __next__(self) -> _ITERATOR_RETURN:
        raise NotImplementedError

    def __len__(self) -> int:
        """The pass's batches; inf (a float, as Lightning's) where an iterable without a length decides it, so that
        ``len()`` raises TypeError there and ``_length`` reads inf."""
        raise NotImplementedError

    def _limited(self) -> list[int | float]:
        lengths = [_length(iterable) for iterable in self.iterables]
        return lengths if self.limits is None else [min(n, limit) for n, limit in zip(lengths, self.limits)]

    def _out(self, values: list[Any]) -> _ITERATOR_RETURN:
        index, self._idx = self._idx, self._idx + 1
        return values, index, 0

    def reset(self) -> None:
        self.iterators, self._idx = [], 0

    def __getstate__(self) -> dict[str, Any]:  # a DataLoader's iterator does not pickle
        return {**self.__dict__, "iterators": []}


class _MaxSizeCycle(_ModeIterator):
    """Until the longest iterable ends; the shorter ones start again when they end."""

    def __iter__(self) -> _MaxSizeCycle:
        super().__iter__()
        self._consumed = [False] * len(self.iterables)
        return self

    def __next__(self) -> _ITERATOR_RETURN:
        values = []
        for i, iterator in enumerate(self.iterators):
            try:
                values.append(next(iterator))
            except StopIteration:
                self._consumed[i] = True
                if all(self._consumed):
                    raise
                self.iterators[i] = iter(self.iterables[i])
                values.append(next(self.iterators[i]))
        return self._out(values)

    def __len__(self) -> int:
        return max(self._limited())  # type: ignore[return-value]  # inf: no length (see _ModeIterator)


class _MinSize(_ModeIterator):
    """Until the shortest iterable ends."""

    def __next__(self) -> _ITERATOR_RETURN:
        return self._out([next(iterator) for iterator in self.iterators])

    def __len__(self) -> int:
        lengths = [_length(iterable) for iterable in self.iterables]
        return min(lengths + list(self.limits or ()))  # type: ignore[return-value]  # inf: no length (see _ModeIterator)


class _MaxSize(_ModeIterator):
    """Until the longest iterable ends; the ended ones give None."""

    def __next__(self) -> _ITERATOR_RETURN:
        values = [next(iterator, _ENDED) for iterator in self.iterators]
        if all(value is _ENDED for value in values):
            raise StopIteration
        return self._out([None if value is _ENDED else value for value in values])

    def __len__(self) -> int:
        return max(self._limited())  # type: ignore[return-value]  # inf: no length (see _ModeIterator)


_ENDED = object()


class _Sequential(_ModeIterator):
    """Each iterable to its end (or its limit) in turn; ``dataloader_idx`` says which, ``batch_idx`` counts within
    it. Only the current iterable has an iterator (one set of workers at a time)."""

    def __iter__(self) -> _Sequential:
        self._iterator_idx, self._idx = 0, 0
        self._load()
        return self

    def __next__(self) -> _ITERATOR_RETURN:
        while self._iterator_idx < len(self.iterables):
            limit = self.limits[self._iterator_idx] if self.limits is not None else float("inf")
            if self._idx < limit:
                value = next(self.iterators[0], _ENDED)
                if value is not _ENDED:
                    index, self._idx = self._idx, self._idx + 1
                    return value, index, self._iterator_idx
            self._iterator_idx, self._idx = self._iterator_idx + 1, 0
            self._load()
        raise StopIteration

    def _load(self) -> None:
        n = self._iterator_idx
        self.iterators = [iter(self.iterables[n])] if n < len(self.iterables) else []

    def __len__(self) -> int:
        return sum(self._limited(), 0)  # type: ignore[return-value]  # inf: no length (see _ModeIterator)

    def reset(self) -> None:
        super().reset()
        self._iterator_idx = 0


_SUPPORTED_MODES: dict[str, type[_ModeIterator]] = {
    "min_size": _MinSize,
    "max_size_cycle": _MaxSizeCycle,
    "max_size": _MaxSize,
    "sequential": _Sequential,
}
#: the combined dataset length of each mode (Lightning's ``fn``)
_MODE_LENGTH: dict[str, Callable[[list[int]], int]] = {
    "min_size": min,
    "max_size_cycle": max,
    "max_size": max,
    "sequential": sum,
}


def unsupported_mode(mode: Any) -> ValueError:
    return ValueError(f"Unsupported mode {mode!r}, please select one of: {list(_SUPPORTED_MODES)}.")


class CombinedLoader(Iterable[Any]):
    """Reads several iterables (a list, tuple, dict, or nested ones) as one.

    Args:
        iterables: one iterable or a collection of them.
        mode: ``"min_size"`` (default): until the shortest ends. ``"max_size_cycle"``: until the longest ends, the
            others starting again when they end (``Trainer.fit``'s way with a list or dict of loaders).
            ``"max_size"``: until the longest ends, the ended ones giving None. ``"sequential"``: each to its end in
            turn, one batch at a time (evaluation's way with several loaders).

    Iterating yields ``(batch, batch_idx, dataloader_idx)``; ``len()`` (after ``iter()``) is the number of batches.

    Example:
        ```python
        loaders = {"a": DataLoader(range(6), batch_size=4), "b": DataLoader(range(15), batch_size=5)}
        combined = CombinedLoader(loaders, "max_size_cycle")
        for batch, batch_idx, dataloader_idx in combined:
            ...  # batch == {"a": tensor([...]), "b": tensor([...])}
        trainer.fit(model, train_dataloaders=combined)
        ```
    """

    def __init__(self, iterables: Any, mode: Mode = "min_size") -> None:
        if mode not in _SUPPORTED_MODES:
            raise unsupported_mode(mode)
        self._iterables = iterables
        self._flattened, self._spec = tree_flatten(iterables)
        self._mode = mode
        self._iterator: _ModeIterator | None = None
        self._limits: list[int | float] | None = None

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def iterables(self) -> Any:
        """The collection of iterables, in the shape given."""
        return self._iterables

    @property
    def flattened(self) -> list[Any]:
        """The iterables as a flat list."""
        return self._flattened

    @flattened.setter
    def flattened(self, flattened: list[Any]) -> None:
        if len(flattened) != len(self._flattened):
            raise ValueError(
                f"Mismatch in flattened length ({len(flattened)}) and existing length ({len(self._flattened)})"
            )
        self._iterables = tree_unflatten(flattened, self._spec)
        self._flattened = list(flattened)

    @property
    def sampler(self) -> Any:
        """Each iterable's ``sampler`` (None where it has none), in the shape given."""
        return tree_unflatten([getattr(i, "sampler", None) for i in self._flattened], self._spec)

    @property
    def batch_sampler(self) -> Any:
        """Each iterable's ``batch_sampler`` (None where it has none), in the shape given."""
        return tree_unflatten([getattr(i, "batch_sampler", None) for i in self._flattened], self._spec)

    @property
    def limits(self) -> list[int | float] | None:
        """Batches per iterable counted by ``len`` (None: all)."""
        return self._limits

    @limits.setter
    def limits(self, limits: int | float | list[int | float] | None) -> None:
        if isinstance(limits, (int, float)):
            limits = [limits] * len(self._flattened)
        elif isinstance(limits, list) and len(limits) != len(self._flattened):
            raise ValueError(
                f"Mismatch in number of limits ({len(limits)}) and number of iterables ({len(self._flattened)})"
            )
        self._limits = limits

    def __iter__(self) -> CombinedLoader:
        iterator = _SUPPORTED_MODES[self._mode](self._flattened, self._limits)
        iter(iterator)
        self._iterator = iterator
        return self

    def __next__(self) -> _ITERATOR_RETURN:
        assert self._iterator is not None, "call iter(combined_loader) first"
        values, batch_idx, dataloader_idx = next(self._iterator)
        if self._mode == "sequential":
            return values, batch_idx, dataloader_idx
        return tree_unflatten(values, self._spec), batch_idx, dataloader_idx

    def __len__(self) -> int:
        """The number of batches of one pass (inf where an iterable has no length and decides it)."""
        if self._iterator is None:
            raise RuntimeError("Please call `iter(combined_loader)` first.")
        return len(self._iterator)

    def _length(self) -> int | float:
        """``__len__`` without beginning a pass (which would create the iterables' iterators)."""
        return len(_SUPPORTED_MODES[self._mode](self._flattened, self._limits))

    def _begin_at(
        self, batches_done: int, prepare: Callable[[list[int]], None], cycles: list[int] | None = None
    ) -> CombinedLoader:
        """Begin a pass that continues after its first ``batches_done`` batches (tandem's mid-epoch resume).
        ``prepare`` gets, per iterable, how many items of its current pass it has given (its length: that pass has
        ended) and makes its next ``iter()`` begin there; then the iterators are created and the mode's own state
        set. Every iterable must have a length; ``"sequential"`` is not resumed (no fit trains in it). ``cycles``:
        each iterable's pass in progress (0: its first) where ``prepare`` places the iterables itself (an elastic
        resume), instead of counting from ``batches_done``."""
        lengths = [int(_length(iterable)) for iterable in self._flattened]
        k = batches_done
        if self._mode == "min_size":
            given = [k] * len(lengths)
        elif self._mode == "max_size":
            given = [min(k, n) for n in lengths]
        elif self._mode == "max_size_cycle":  # a pass that ended exactly here starts again at the next batch
            given = [n if n and k % n == 0 else k % n if n else 0 for n in lengths]
        else:
            raise ValueError(f"A {self._mode!r} CombinedLoader cannot begin in the middle of a pass.")
        prepare(given)
        iter(self)
        assert self._iterator is not None
        self._iterator._idx = k
        if isinstance(self._iterator, _MaxSizeCycle):  # an iterable that ended before the k-th batch ran out once
            self._iterator._consumed = [k > n for n in lengths] if cycles is None else [c > 0 for c in cycles]
        return self

    def reset(self) -> None:
        """Forget the pass in progress and shut down the iterables' worker processes."""
        if self._iterator is not None:
            self._iterator.reset()
            self._iterator = None
        for iterable in self._flattened:
            _shutdown_workers(iterable)

    def _dataset_length(self) -> int:
        """The datasets' combined length in this mode (the iterable-style ones left out)."""
        lengths = [n for n in (_length(getattr(i, "dataset", None)) for i in self._flattened) if isinstance(n, int)]
        if not lengths:
            raise NotImplementedError("All datasets are iterable-style datasets.")
        return _MODE_LENGTH[self._mode](lengths)


def _shutdown_workers(loader: Any) -> None:
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    if hasattr(loader, "_iterator"):
        loader._iterator = None


__all__ = ["CombinedLoader"]
