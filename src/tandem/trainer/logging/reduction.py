"""The reduction across processes, by name, of the values ``self.log(..., sync_dist=True)`` logged: packed sums
and maxima when every rank sends the same names (``pack``, ``unpack``), else gathered and combined in rank order
(``combine_by_name``). See the package's docstring."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from tandem.trainer.logging.entry import _HALF_DTYPES
from tandem.utilities.exceptions import TandemUserCodeError
from tandem.utilities.logged_values import to_float

if TYPE_CHECKING:
    from tandem.strategies.strategy import Strategy

_FLOAT32_EXACT = _HALF_DTYPES | {torch.float32}  # read exactly through float32

# ---------------------------------------------------------------------- reduction across processes, by name


def _agree(everyone: Sequence[Mapping[str, tuple[str, bool, Any]]]) -> dict[str, tuple[str, Any]]:
    """The keys some process wants reduced, sorted, with their operation and options; the same on every
    process. One name logged with different ``reduce_fx`` on different processes is an error on all."""
    wanted: dict[str, tuple[str, Any]] = {}
    seen: dict[str, tuple[str, int]] = {}
    for rank, mine in enumerate(everyone):
        for key, (op, want, flags) in mine.items():
            if key in seen and seen[key][0] != op:
                other_op, other_rank = seen[key]
                name = key.split("/", 1)[1]
                raise TandemUserCodeError(
                    f"self.log({name!r}, ..., sync_dist=True) used reduce_fx={other_op!r} on rank {other_rank} "
                    f"and reduce_fx={op!r} on rank {rank}; the ranks cannot combine it. Log it with the same "
                    "reduce_fx on every rank."
                )
            seen.setdefault(key, (op, rank))
            if want and key not in wanted:
                wanted[key] = (op, flags)
    return dict(sorted(wanted.items()))


def as_floats(values: Mapping[str, tuple[torch.Tensor | None, torch.Tensor | None]]) -> dict[str, tuple[Any, Any]]:
    """``values`` (name -> value, weight: 0-dim tensors or None) as float64 Python numbers, in one conversion
    (one device sync when they live on an accelerator)."""
    present = {(name, i): t for name, pair in values.items() for i, t in enumerate(pair) if t is not None}
    # read in float32 when every value is a float of at most 32 bits (exact: a Python float holds each one), which
    # stacks them as they are; float64 for the rest (a float64 sum, an integer count)
    narrow = all(t.dtype in _FLOAT32_EXACT for t in present.values())
    floats = to_float(present, torch.float32 if narrow else torch.float64)
    return {name: (floats.get((name, 0)), floats.get((name, 1))) for name in values}


def combine_by_name(
    wanted: Mapping[str, tuple[str, Any]], everyone: list[dict[str, tuple[Any, Any]]]
) -> dict[str, float | None]:
    """Reduce the ``wanted`` names (name -> operation, options) over what each rank sent (``everyone``, in rank
    order: name -> value, weight as floats), the same way on every rank. ``"mean"``: the sum of the values over the
    sum of the weights (a step value weighs 1); ``"sum"``, ``"max"``, ``"min"``: of the values. A rank that did
    not send a name is absent from it; None for a name no rank had. NaN propagates."""
    out: dict[str, float | None] = {}
    for key, (op, _) in wanted.items():
        if key.startswith("metric/"):
            continue
        sent = [theirs[key] for theirs in everyone if key in theirs and theirs[key][0] is not None]
        values = [value for value, _ in sent]
        if not sent:
            out[key] = None
        elif op == "mean":
            weight = sum(1.0 if w is None else w for _, w in sent)
            out[key] = sum(values) / weight if weight > 0 else None
        elif op == "sum":
            out[key] = sum(values)
        else:
            nan = next((v for v in values if math.isnan(v)), None)
            out[key] = nan if nan is not None else (max if op == "max" else min)(values)
    return out


def _as_local(result: float | None, op: str, value: torch.Tensor | None) -> torch.Tensor | None:
    """A reduced number as a tensor in this rank's dtype (``value``: what it sent, or None; float32 where it sent
    nothing; an integer sum, max or min stays an integer) on its device."""
    if result is None:
        return None
    keep_integer = value is not None and not value.is_floating_point() and op != "mean"
    dtype = value.dtype if value is not None and (value.is_floating_point() or keep_integer) else torch.float32
    return torch.tensor(result, dtype=dtype, device=value.device if value is not None else "cpu")


# ---------------------------------------------------------------------- the same, when every rank sends the same names


def pack(
    mine: Mapping[str, tuple[str, bool, Any]], floats: Mapping[str, tuple[Any, Any]], note: Any = None
) -> tuple[int, dict[str, tuple[str, Any]], torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's side of a reduction by agreement: the layout (a 63-bit hash of the sorted names, options and the
    note's shape: equal on every rank exactly when they pack alike), the names wanted (sorted), the note's flags
    (int64), the sums and the maxima (float64).

    Each ``"mean"`` or ``"sum"`` name takes three sums (value, weight, present: 0 for a rank without the value); each
    ``"max"`` or ``"min"`` name three maxima (the value, negated for ``"min"``, -inf for NaN or none; NaN; present);
    each loss since the last check (``note``'s window, under on_nonfinite="rollback") two sums (the loss where
    finite; 1 where it was). The sums are rank-order free: on two ranks they equal ``combine_by_name``'s bit for
    bit; on more, the backend's order of summing, as Lightning's ``sync_dist`` reduction.
    """
    wanted = _agree([mine])
    finite, stop, empty, window = note if note is not None else (True, False, None, None)
    sums: list[float] = []
    maxes: list[float] = []
    for key, (op, _) in wanted.items():
        if key.startswith("metric/"):
            continue
        value, weight = floats.get(key, (None, None))
        present = value is not None
        if op in ("mean", "sum"):
            sums += [value, 1.0 if weight is None else weight, 1.0] if present else [0.0, 0.0, 0.0]
        elif not present:
            maxes += [-math.inf, 0.0, 0.0]
        elif math.isnan(value):
            maxes += [-math.inf, 1.0, 1.0]
        else:
            maxes += [value if op == "max" else -value, 0.0, 1.0]
    bad_window = False
    for _, loss in window or ():
        clean = loss is not None and math.isfinite(loss)
        bad_window |= loss is not None and not clean
        sums += [loss if clean else 0.0, float(clean)]
    shape = (sorted(mine.items()), note is None, None if window is None else [batch_idx for batch_idx, _ in window])
    layout = int.from_bytes(hashlib.blake2b(repr(shape).encode(), digest_size=8).digest(), "little") >> 1
    # the note's flags, reduced by max: any but the stop sends every rank to the gathering, which names the ranks
    flags = torch.tensor([not finite, bool(stop), empty is not None, bad_window], dtype=torch.int64)
    return layout, wanted, flags, torch.tensor(sums, dtype=torch.float64), torch.tensor(maxes, dtype=torch.float64)


def unpack(
    wanted: Mapping[str, tuple[str, Any]], sums: list[float], maxes: list[float], window: Any = None
) -> tuple[dict[str, float | None], Any]:
    """The reduced numbers of ``pack``'s layout: each wanted name's result (as ``combine_by_name``), and the
    window of the ranks' mean losses (batch index, mean; None where no rank's loss was finite), or None."""
    out: dict[str, float | None] = {}
    i = j = 0
    for key, (op, _) in wanted.items():
        if key.startswith("metric/"):
            continue
        if op in ("mean", "sum"):
            total, weight, present = sums[i : i + 3]
            i += 3
            if op == "sum":
                out[key] = total if present else None
            else:
                out[key] = total / weight if present and weight > 0 else None
        else:
            value, nan, present = maxes[j : j + 3]
            j += 3
            out[key] = None if not present else math.nan if nan else value if op == "max" else -value
    if window is None:
        return out, None
    pairs = sums[i:]
    means = [(batch_idx, s / c if c else None) for (batch_idx, _), s, c in zip(window, pairs[::2], pairs[1::2])]
    return out, means


def _packed_reduction(
    strategy: Strategy, mine: Mapping[str, tuple[str, bool, Any]], floats: Mapping[str, Any], note: Any
) -> tuple[dict[str, tuple[str, Any]], dict[str, float | None], list[Any]] | None:
    """The names wanted, their results and the one note for all ranks, when every rank packed alike and no note
    asks for the gathering (``pack``); None otherwise, on every rank."""
    layout, wanted, flags, sums, maxes = pack(mine, floats, note)
    reduced = strategy.reduce_if_agreed(layout, flags, sums, maxes)
    if reduced is None:
        return None
    not_finite, stop, empty, bad_window = (bool(f) for f in reduced[0].tolist())
    if not_finite or empty or bad_window:  # the gathering names the ranks (the same verdict on every rank)
        return None
    window = note[3] if note is not None else None
    results, means = unpack(wanted, reduced[1].tolist(), reduced[2].tolist(), window)
    return wanted, results, [(True, stop, None, means)]


def _metric_missing(name: str, everyone: list[dict[str, Any]]) -> TandemUserCodeError:
    key = f"metric/{name}"
    having = [r for r, mine in enumerate(everyone) if key in mine]
    lacking = [r for r, mine in enumerate(everyone) if key not in mine]
    return TandemUserCodeError(
        f"The torchmetrics Metric {name!r} was logged on rank(s) {having} but not on rank(s) {lacking} in this "
        "epoch (a rank with no batches, e.g. fewer evaluation samples than processes, or a conditional "
        "self.log). torchmetrics reduces inside compute(), which every rank must call. Log the metric on every "
        "rank, or give every rank data."
    )
