"""RichProgressBar: the progress bars drawn with ``rich`` (imported only when a bar is drawn)."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from tandem.callbacks.progress_bar import ProgressBar
from tandem.utilities.exceptions import TandemConfigError


def require_rich(owner: str) -> None:
    """Raise a clear error naming the install command when ``rich`` is not installed (without importing it)."""
    if importlib.util.find_spec("rich") is None:
        raise TandemConfigError(f"{owner} draws with the rich package, which is not installed: pip install rich")


class RichProgressBar(ProgressBar):
    """[`ProgressBar`][tandem.callbacks.ProgressBar] drawn with ``rich``: the same bars (``Epoch n``, sanity check,
    validation, test, predict), the step ``loss`` and ``prog_bar`` values, on global rank 0 only. Needs
    ``pip install rich``.

    Args:
        refresh_rate: advance the bars every this many batches; 0 disables the bars.
        leave: keep each epoch's training bar on screen instead of reusing one line.
        console_kwargs: arguments for ``rich.console.Console`` (default: write to stderr).

    Example:
        ```python
        trainer = Trainer(callbacks=[RichProgressBar(leave=True)])
        ```
    """

    def __init__(
        self, refresh_rate: int = 1, leave: bool = False, console_kwargs: Mapping[str, Any] | None = None
    ) -> None:
        require_rich("RichProgressBar")
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        self.console_kwargs = dict(console_kwargs) if console_kwargs is not None else {"stderr": True}
        self._progress: Any = None  # a rich.progress.Progress while any bar is open

    def _open(self, kind: str, desc: str, total: float | None, leave: bool) -> None:
        self._close(kind)
        if self._progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("[progress.description]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[metrics]}"),
                console=Console(**self.console_kwargs),
            )
            self._progress.start()
        self._bars[kind] = _RichBar(self._progress, desc, total, leave)

    def _close(self, kind: str) -> None:
        super()._close(kind)
        if not self._bars and self._progress is not None:
            self._progress.stop()  # prints the bars that stay (leave=True) once more, then releases the terminal
            self._progress = None

    def _draw_metrics(self, bar: Any, values: dict[str, float], refresh: bool) -> None:
        bar.set_postfix(values)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_progress"] = None
        return state


class _RichBar:
    """The part of tqdm's interface [`ProgressBar`][tandem.callbacks.ProgressBar] uses, drawn as one task of a rich
    ``Progress``."""

    def __init__(self, progress: Any, desc: str, total: float | None, leave: bool) -> None:
        self._progress = progress
        self.total = _finite(total)
        self.n = 0
        self.leave = leave
        self._task = progress.add_task(desc, total=self.total, metrics="")

    def update(self, n: int = 1) -> None:
        self.n += n
        self._progress.update(self._task, advance=n)

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self._progress.update(self._task, description=desc)

    def reset(self, total: float | None = None) -> None:
        self.n, self.total = 0, _finite(total)
        self._progress.reset(self._task, total=self.total, metrics="")

    def set_postfix(self, values: Mapping[str, float]) -> None:
        text = "  ".join(f"{name}: {value:.4g}" for name, value in values.items())
        self._progress.update(self._task, metrics=text)

    def close(self) -> None:
        if not self.leave:
            self._progress.remove_task(self._task)


def _finite(total: float | None) -> int | None:
    return None if total is None or total == float("inf") else int(total)
