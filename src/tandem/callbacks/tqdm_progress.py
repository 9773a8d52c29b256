"""TQDMProgressBar: the tqdm progress bars under Lightning's name and arguments."""

from __future__ import annotations

from tandem.callbacks.progress_bar import ProgressBar
from tandem.utilities.exceptions import out_of_range


class TQDMProgressBar(ProgressBar):
    """The tqdm progress bars (see [`ProgressBar`][tandem.callbacks.ProgressBar], the name tandem gave them first, which
    keeps working): ``Epoch n`` for training, bars for the sanity check, validation, testing and prediction, on global
    rank 0. The Trainer's default bar.

    Args:
        refresh_rate: advance the bars every this many batches; 0 disables the bars.
        process_position: terminal lines to leave above the bars (for several programs sharing a terminal).
        leave: keep each epoch's training bar on screen (a new line per epoch) instead of reusing one line.

    Example:
        ```python
        trainer = Trainer(callbacks=[TQDMProgressBar(refresh_rate=10)])
        ```
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        if isinstance(process_position, bool) or not isinstance(process_position, int) or process_position < 0:
            raise out_of_range("TQDMProgressBar: process_position", process_position, "an int >= 0 (lines above)")
        self.process_position = process_position
