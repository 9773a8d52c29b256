"""RichModelSummary: the model summary as a ``rich`` table (rich is imported only when it is printed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tandem.callbacks.model_summary import ModelSummary, summary_rows
from tandem.callbacks.rich_progress import require_rich

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer


class RichModelSummary(ModelSummary):
    """:class:`ModelSummary` printed as a ``rich`` table, once at fit start on global rank 0. Needs
    ``pip install rich``.

    Args:
        max_depth: how deep to list submodules: 1 lists the module's children, -1 every level, 0 only totals.
        console_kwargs: arguments for ``rich.console.Console``.

    Example::

        trainer = Trainer(callbacks=[RichModelSummary(max_depth=2)])
    """

    def __init__(self, max_depth: int = 1, console_kwargs: dict[str, Any] | None = None) -> None:
        require_rich("RichModelSummary")
        super().__init__(max_depth=max_depth)
        self.console_kwargs = dict(console_kwargs or {})

    def on_fit_start(self, trainer: Trainer, module: TrainingModule) -> None:
        if not trainer.is_global_zero:
            return
        from rich.console import Console
        from rich.table import Table

        header, rows, totals = summary_rows(module, self.max_depth)
        console = Console(**self.console_kwargs)
        if rows:
            table = Table(header_style="bold magenta")
            for name in header:
                table.add_column(name, justify="right" if name in ("Params", "Trainable") else "left")
            for row in rows:
                table.add_row(*row)
            console.print(table)
        grid = Table.grid(padding=(0, 1))
        grid.add_column(justify="right")
        grid.add_column()
        for value, label in totals:
            grid.add_row(value, label)
        console.print(grid)
