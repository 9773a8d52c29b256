"""RichModelSummary: the model summary as a ``rich`` table (rich is imported only when it is printed)."""

from __future__ import annotations

from typing import Any

from tandem.callbacks.model_summary import ModelSummary
from tandem.callbacks.rich_progress import require_rich
from tandem.utilities.model_summary import get_formatted_model_size, get_human_readable_count


class RichModelSummary(ModelSummary):
    """[`ModelSummary`][tandem.callbacks.ModelSummary] printed as a ``rich`` table, once at fit start on global rank 0.
    Needs ``pip install rich``.

    Args:
        max_depth: how deep to list submodules: 1 lists the module's children, -1 every level, 0 turns it off.
        **summarize_kwargs: ``header_style`` (default ``"bold magenta"``); ``console_kwargs``, arguments for a
            ``rich.console.Console`` (default: rich's global console).

    Example:
        ```python
        trainer = Trainer(callbacks=[RichModelSummary(max_depth=2)])
        ```
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        require_rich("RichModelSummary")
        super().__init__(max_depth, **summarize_kwargs)

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        from rich import get_console
        from rich.console import Console
        from rich.table import Table

        console_kwargs = summarize_kwargs.get("console_kwargs")
        console = get_console() if console_kwargs is None else Console(**console_kwargs)
        headers = [header for header, _ in summary_data]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        table.add_column(" ", style="dim")
        table.add_column("Name", justify="left", no_wrap=True)
        table.add_column("Type")
        table.add_column("Params", justify="right")
        table.add_column("Mode")
        table.add_column("FLOPs", justify="right")
        for header in ("In sizes", "Out sizes"):
            if header in headers:
                table.add_column(header, justify="right", style="white")
        for row in zip(*(cells for _, cells in summary_data)):
            table.add_row(*row)
        console.print(table)

        totals = [
            ("Trainable params", f"{get_human_readable_count(trainable_parameters):<10}"),
            ("Non-trainable params", f"{get_human_readable_count(total_parameters - trainable_parameters):<10}"),
            ("Total params", f"{get_human_readable_count(total_parameters):<10}"),
            ("Total estimated model params size (MB)", f"{get_formatted_model_size(model_size):<10}"),
            ("Modules in train mode", total_training_modes["train"]),
            ("Modules in eval mode", total_training_modes["eval"]),
            ("Total FLOPs", get_human_readable_count(total_flops)),
        ]
        grid = Table.grid(expand=True)
        grid.add_column()
        grid.add_column()
        for label, value in totals:
            grid.add_row(f"[bold]{label}[/]: {value}")
        console.print(grid)
