"""ModelSummary: the module's summary table (``tandem.utilities.model_summary``), logged once at fit start."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from tandem.callbacks.callback import Callback
from tandem.utilities.exceptions import out_of_range
from tandem.utilities.model_summary import format_summary_table, summarize

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer

log = logging.getLogger(__name__)


class ModelSummary(Callback):
    """Log the module's [`ModelSummary`][tandem.utilities.model_summary.ModelSummary] table when ``fit`` starts.

    Every process computes the summary (its forward pass of ``example_input_array`` may need all of them, as
    with sharded parameters); global rank 0 logs it, on the ``tandem`` logger (stderr unless the application
    configured logging). ``Trainer(enable_model_summary=True)`` (the default) adds one with ``max_depth=1``
    unless a ``ModelSummary`` is among the callbacks.

    Override the static method [`summarize`][tandem.callbacks.ModelSummary.summarize] to show the summary another way.

    Args:
        max_depth: how deep to list submodules: 1 lists the module's children, 2 their children too,
            -1 every level, 0 turns the summary off.
        **summarize_kwargs: passed on to [`summarize`][tandem.callbacks.ModelSummary.summarize].

    Example:
        ```python
        trainer = Trainer(callbacks=[ModelSummary(max_depth=2)])
        ```
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < -1:
            raise out_of_range("ModelSummary: max_depth", max_depth, "an int >= -1 (-1: every level, 0: off)")
        self.max_depth = max_depth
        self.summarize_kwargs = summarize_kwargs

    def on_fit_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if not self.max_depth:
            return
        summary = summarize(pl_module, max_depth=self.max_depth)
        if trainer.is_global_zero:
            self.summarize(
                summary.summary_data,
                summary.total_parameters,
                summary.trainable_parameters,
                summary.model_size,
                summary.total_training_modes,
                total_flops=summary.total_flops,
                **self.summarize_kwargs,
            )

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
        """Show the summary: its columns as (header, cells) and the totals. Logs Lightning's table."""
        table = format_summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *summary_data
        )
        log.info("\n" + table)
