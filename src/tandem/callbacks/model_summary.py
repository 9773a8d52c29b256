"""ModelSummary: a table of the module's layers and parameter counts, printed once at fit start."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from tandem.callbacks.callback import Callback
from tandem.utilities.exceptions import out_of_range

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer


class ModelSummary(Callback):
    """Print the module's submodules with their parameter counts, and the totals, when ``fit`` starts.

    Printed once, by global rank 0 only. ``Trainer(enable_model_summary=True)`` (the default) adds one
    with ``max_depth=1`` unless a ``ModelSummary`` is among the callbacks.

    Args:
        max_depth: how deep to list submodules: 1 lists the module's children, 2 their children too,
            -1 every level, 0 only the totals.

    Example::

        trainer = Trainer(callbacks=[ModelSummary(max_depth=2)])
    """

    def __init__(self, max_depth: int = 1) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < -1:
            raise out_of_range("ModelSummary: max_depth", max_depth, "an int >= -1 (-1: every level, 0: totals only)")
        self.max_depth = max_depth

    def on_fit_start(self, trainer: Trainer, module: TrainingModule) -> None:
        if trainer.is_global_zero:
            print(summarize(module, self.max_depth))


def summarize(module: nn.Module, max_depth: int = 1) -> str:
    """The summary table of ``module`` as text (what :class:`ModelSummary` prints)."""
    header, rows, totals = summary_rows(module, max_depth)
    table = [header, *rows]
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    lines = []
    if rows:
        lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
        lines.insert(1, "-" * len(lines[0]))
        lines.append("-" * len(lines[0]))
    lines += [f"{value:<10} {label}" for value, label in totals]
    return "\n".join(lines)


def summary_rows(
    module: nn.Module, max_depth: int = 1
) -> tuple[tuple[str, ...], list[tuple[str, ...]], list[tuple[str, str]]]:
    """The table's header, one row per listed submodule, and the (value, label) totals below it."""
    header = ("", "Name", "Type", "Params", "Trainable")
    rows = []
    for i, (name, child) in enumerate(_listed(module, max_depth)):
        total, trainable = _count(child.parameters())
        rows.append((str(i), name, type(child).__name__, _human(total), _human(trainable)))
    total, trainable = _count(module.parameters())
    size_mb = sum(p.numel() * p.element_size() for p in _unique(module.parameters()) if _known(p)) / 1e6
    totals = [
        (_human(trainable), "Trainable params"),
        (_human(total - trainable), "Non-trainable params"),
        (_human(total), "Total params"),
        (f"{size_mb:.3f}", "Total estimated model params size (MB)"),
    ]
    return header, rows, totals


def _listed(module: nn.Module, max_depth: int) -> list[tuple[str, nn.Module]]:
    if max_depth == 0:
        return []
    return [
        (name, child)
        for name, child in module.named_modules()
        if name and (max_depth == -1 or name.count(".") < max_depth)
    ]


def _unique(params: object) -> list[nn.Parameter]:
    seen: dict[int, nn.Parameter] = {}
    for p in params:  # type: ignore[attr-defined]
        seen.setdefault(id(p), p)
    return list(seen.values())


def _known(p: nn.Parameter) -> bool:
    return not isinstance(p, nn.parameter.UninitializedParameter)


def _count(params: object) -> tuple[int, int]:
    """(total, trainable) over distinct, initialized parameters (a shared weight counts once)."""
    unique = [p for p in _unique(params) if _known(p)]
    return sum(p.numel() for p in unique), sum(p.numel() for p in unique if p.requires_grad)


def _human(n: int) -> str:
    """1234 -> '1.2 K', 3_400_000 -> '3.4 M' (Lightning's style)."""
    for limit, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= limit:
            return f"{n / limit:.1f} {suffix}"
    return str(n)
