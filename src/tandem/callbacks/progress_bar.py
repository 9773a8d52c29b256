"""ProgressBar: tqdm bars for training, validation, testing and prediction, on global rank 0 only."""

from __future__ import annotations

import math
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from tandem.callbacks.callback import Callback
from tandem.utilities.exceptions import out_of_range
from tandem.utilities.logged_values import to_float
from tandem.utilities.rank_zero import set_bar_writer

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer

_POSTFIX_EVERY_S = 0.5  # reading metrics syncs the device, so the numbers are refreshed at most this often
_LINE_EVERY_S = 30.0  # not a terminal: a progress line at most this often during a bar, besides the epoch's end
_MIN_BAR = 10  # columns the bar keeps: on a narrow terminal the times and counts give way, not the bar or metrics
_LAYOUTS = (  # widest first; the first that leaves the bar _MIN_BAR columns is used. {metrics}: ", a=1, b=2"
    "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{metrics}]",  # tqdm's own
    "{l_bar}{bar}| {n_fmt}/{total_fmt} [{remaining}{metrics}]",
    "{l_bar}{bar}| {n_fmt}/{total_fmt}{metrics}",
    "{l_bar}{bar}|{metrics}",
)


class ProgressBar(Callback):
    """Progress bars with tqdm: ``Epoch n`` for training, and bars for the sanity check, validation,
    testing and prediction. Only global rank 0 draws; other processes print nothing.

    The training bar shows every value logged with ``prog_bar=True`` and the step ``loss`` (unless one of
    those values already is the loss); these numbers are refreshed at most every half second and at the end
    of each epoch. On a narrow terminal (80 columns) the bar drops its times rather than the metrics.

    When stderr is not a terminal (output redirected to a file or a pipe, e.g. a cluster job's log), no
    frames are drawn: one plain line per training epoch (at its end, with the metrics), one after each
    validation within an epoch, one when testing or predicting ends, and during a long stage a line at most
    every 30 seconds. While bars are drawn on a terminal, ``rank_zero_info`` messages (``EarlyStopping``,
    ``ModelCheckpoint(verbose=True)``, ...) and ``self.print`` start on their own line above the bars.

    Args:
        refresh_rate: advance the bars every this many batches; 0 disables the bars.
        leave: keep each epoch's training bar on screen (a new line per epoch) instead of reusing one line.

    Example:
        ```python
        trainer = Trainer(callbacks=[ProgressBar(refresh_rate=10, leave=True)])
        ```
    """

    def __init__(self, refresh_rate: int = 1, leave: bool = False) -> None:
        if not isinstance(refresh_rate, int) or refresh_rate < 0:
            raise out_of_range("ProgressBar: refresh_rate", refresh_rate, "an int >= 0 (0: no bars)")
        self.refresh_rate = refresh_rate
        self.leave = leave
        self.process_position = 0  # terminal lines above the bars (TQDMProgressBar's argument)
        self._bars: dict[str, Any] = {}  # "train" | "eval" | "test" | "predict" -> tqdm
        self._loss: torch.Tensor | None = None
        self._postfix_time = 0.0

    # set in setup; weakly, as the module refers to its Trainer: a finished fit is freed without the garbage collector
    _trainer: Callable[[], Trainer | None] = staticmethod(lambda: None)

    @property
    def trainer(self) -> Trainer:
        """The Trainer this bar reports on (Lightning's ``ProgressBar.trainer``), known from ``setup`` on: a
        subclass's hooks and ``get_metrics`` may read it."""
        trainer = self._trainer()
        if trainer is None:
            raise TypeError(
                f"`{type(self).__name__}.trainer` is not set yet: the Trainer sets it when the run sets up the "
                "callbacks (Callback.setup). Read it from a hook, or call super().setup(...) in an overriding setup."
            )
        return trainer

    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        self._trainer = weakref.ref(trainer)

    def _enabled(self, trainer: Trainer) -> bool:
        return self.refresh_rate > 0 and trainer.is_global_zero

    def _open(self, kind: str, desc: str, total: float | None, leave: bool) -> None:
        from tqdm import tqdm

        self._close(kind)
        self.__dict__.setdefault("_seen", {})[kind] = 0
        total = None if total is None or math.isinf(total) else int(total)
        if not _is_terminal(sys.stderr):  # a file or a pipe: plain lines, no frames
            self._bars[kind] = _LineBar(desc, total, leave, sys.stderr)
            return
        position = self.process_position + (1 if kind == "eval" and "train" in self._bars else 0)
        self._bars[kind] = tqdm(
            desc=desc,
            total=total,
            leave=leave,
            position=position,
            dynamic_ncols=True,
            file=sys.stderr,
            smoothing=0,
        )
        set_bar_writer(_write_above_bars)  # messages printed meanwhile start on their own line

    def _close(self, kind: str) -> None:
        bar = self._bars.pop(kind, None)
        if bar is not None:
            bar.close()
        if not self._bars:
            set_bar_writer(None)

    def _advance(self, kind: str, batch_idx: int) -> None:
        bar = self._bars.get(kind)
        if bar is None:
            return
        n = batch_idx + 1
        if n % self.refresh_rate == 0 or n == bar.total:
            bar.update(n - bar.n)

    def _advance_count(self, kind: str) -> None:
        """Evaluation bars count batches over all loaders (each loader's batch_idx starts at 0)."""
        seen = self.__dict__.setdefault("_seen", {})
        seen[kind] = seen.get(kind, 0) + 1 if kind in self._bars else 0
        self._advance(kind, seen[kind] - 1)

    def get_metrics(self, trainer: Trainer, module: TrainingModule) -> dict[str, Any]:
        """The items the training bar shows (Lightning's hook: override it to change them): the loss, then the
        ``prog_bar=True`` values (``trainer.progress_bar_metrics``)."""
        values = to_float(dict(trainer.progress_bar_metrics))
        if self._loss is not None:
            loss = float(self._loss)
            if loss not in values.values():  # shown once: train_loss logged with prog_bar=True is the loss
                values = {"loss": loss, **values}
        return values

    def _show_metrics(self, trainer: Trainer, module: TrainingModule, refresh: bool) -> None:
        bar = self._bars.get("train")
        if bar is None:
            return
        self._draw_metrics(bar, self.get_metrics(trainer, module), refresh)
        self._postfix_time = time.monotonic()

    def _draw_metrics(self, bar: Any, values: dict[str, float], refresh: bool) -> None:
        """Show ``values`` on the training bar (subclasses drawing another kind of bar override this)."""
        text = ", ".join(f"{k}={bar.format_num(v)}" for k, v in values.items())
        if bar.total is None or isinstance(bar, _LineBar):  # no bar to fit: tqdm's counter layout
            bar.set_postfix_str(text, refresh=False)
        else:
            _fit_layout(bar, text)
        if refresh:
            bar.refresh()

    # ------------------------------------------------------------------ training
    def on_train_epoch_start(self, trainer: Trainer, module: TrainingModule) -> None:
        if not self._enabled(trainer):
            return
        desc, total = f"Epoch {trainer.current_epoch}", trainer.num_training_batches
        bar = self._bars.get("train")
        if bar is None:
            self._open("train", desc, total, leave=True)
        else:  # one line reused across epochs
            bar.set_description(desc, refresh=False)
            bar.reset(total=None if math.isinf(total) else int(total))
        self._loss = None
        self._postfix_time = time.monotonic()

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if "train" not in self._bars:
            return
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            self._loss = loss.detach()  # no graph kept alive, no device sync yet
        self._advance("train", batch_idx)
        if time.monotonic() - self._postfix_time >= _POSTFIX_EVERY_S:
            self._show_metrics(trainer, module, refresh=False)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainingModule) -> None:
        self._show_metrics(trainer, module, refresh=True)
        self._print_line()
        if self.leave:
            self._close("train")

    def on_train_end(self, trainer: Trainer, module: TrainingModule) -> None:
        self._close("train")

    # ------------------------------------------------------------------ sanity check and validation
    def on_validation_start(self, trainer: Trainer, module: TrainingModule) -> None:
        if not self._enabled(trainer):
            return
        if trainer.sanity_checking:
            self._open("eval", "Sanity Checking", trainer.num_sanity_val_steps, leave=False)
        else:
            self._open("eval", "Validation", _total(trainer.num_val_batches), leave=False)

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        module: TrainingModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._advance_count("eval")

    def on_validation_end(self, trainer: Trainer, module: TrainingModule) -> None:
        self._close("eval")
        if not trainer.sanity_checking:
            self._show_metrics(trainer, module, refresh=True)
            bar = self._bars.get("train")
            if bar is not None and bar.n != bar.total:  # within the epoch (its end prints a line anyway)
                self._print_line()

    def _print_line(self) -> None:
        """Not a terminal: the training bar's state as one line (a terminal's bar shows it in place)."""
        bar = self._bars.get("train")
        if isinstance(bar, _LineBar):
            bar.print_line()

    def on_sanity_check_end(self, trainer: Trainer, module: TrainingModule) -> None:
        self._close("eval")

    # ------------------------------------------------------------------ test and predict
    def on_test_start(self, trainer: Trainer, module: TrainingModule) -> None:
        if self._enabled(trainer):
            self._open("test", "Testing", _total(trainer.num_test_batches), leave=True)

    def on_test_batch_end(
        self,
        trainer: Trainer,
        module: TrainingModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._advance_count("test")

    def on_test_end(self, trainer: Trainer, module: TrainingModule) -> None:
        self._close("test")

    def on_predict_start(self, trainer: Trainer, module: TrainingModule) -> None:
        if self._enabled(trainer):
            self._open("predict", "Predicting", _total(trainer.num_predict_batches), leave=True)

    def on_predict_batch_end(
        self,
        trainer: Trainer,
        module: TrainingModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._advance_count("predict")

    def on_predict_end(self, trainer: Trainer, module: TrainingModule) -> None:
        self._close("predict")

    def on_exception(self, trainer: Trainer, module: TrainingModule, exception: BaseException) -> None:
        for kind in list(self._bars):
            self._close(kind)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_bars"], state["_loss"] = {}, None  # tqdm objects cannot be pickled (spawned processes)
        state.pop("_trainer", None)  # set again by the spawned process's setup
        return state


def _is_terminal(file: Any) -> bool:
    """Whether bars can redraw in place: a terminal, or a Jupyter notebook (its output renders ``\r``)."""
    isatty = getattr(file, "isatty", None)
    return bool(isatty is not None and isatty()) or "ipykernel" in sys.modules


def _write_above_bars(text: str, file: Any) -> None:
    from tqdm import tqdm

    tqdm.write(text, file=file, end="")  # clears the bars, writes, draws them again below


class _LineBar:
    """A bar for a file or a pipe: plain lines instead of ``\r`` frames. Implements the part of tqdm's interface
    [`ProgressBar`][tandem.callbacks.ProgressBar] uses; a line is printed on request (``print_line``), at most every
    ``_LINE_EVERY_S`` seconds while it advances, and when a bar that stays (``leave``) closes."""

    def __init__(self, desc: str, total: int | None, leave: bool, file: Any) -> None:
        self.desc, self.total, self.leave, self.file = desc, total, leave, file
        self.n, self.postfix = 0, ""
        self._start = self._last_line = time.monotonic()
        self._printed: tuple[str, int] | None = None  # (desc, n) of the last line, so that none repeats

    @staticmethod
    def format_num(value: float) -> str:
        from tqdm import tqdm

        return tqdm.format_num(value)

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self._last_line >= _LINE_EVERY_S:
            self.print_line()

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text

    def reset(self, total: int | None = None) -> None:
        self.n, self.total, self.postfix = 0, total, ""
        self._start = self._last_line = time.monotonic()

    def refresh(self) -> None:
        """Frames are not drawn: nothing to redraw."""

    def print_line(self) -> None:
        from tqdm import tqdm

        if self._printed == (self.desc, self.n):
            return
        now = time.monotonic()
        line = tqdm.format_meter(
            self.n,
            self.total,
            now - self._start,
            prefix=self.desc,
            bar_format="{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
            if self.total
            else "{desc}: {n_fmt} [{elapsed}, {rate_fmt}{postfix}]",
            postfix=self.postfix or None,
        )
        self.file.write(line + "\n")
        self.file.flush()
        self._printed, self._last_line = (self.desc, self.n), now

    def close(self) -> None:
        if self.leave and self.n:
            self.print_line()


def _total(batches: Any) -> int | float:
    """Batches over all loaders (``trainer.num_val_batches`` is a list, one count per loader)."""
    return sum(batches) if isinstance(batches, (list, tuple)) else batches


def _fit_layout(bar: Any, metrics: str) -> None:
    """Pick the widest layout that leaves the bar ``_MIN_BAR`` columns of the terminal (left alone, tqdm squeezes
    the bar to one column and then cuts the metrics off)."""
    from tqdm.utils import disp_len

    metrics = (", " if metrics else "") + metrics.replace("{", "{{").replace("}", "}}")
    if metrics:
        layouts = [layout.replace("{metrics}", metrics) for layout in _LAYOUTS]
    else:
        layouts = [_LAYOUTS[0].replace("{metrics}", "")]
    state = bar.format_dict  # also reads the terminal's current width
    width = state.get("ncols")
    chosen = layouts[0] if not width else layouts[-1]
    for layout in layouts if width else ():
        text = bar.format_meter(**{**state, "bar_format": layout.replace("{bar}", ""), "ncols": None})
        if width - disp_len(text) >= _MIN_BAR:
            chosen = layout
            break
    bar.bar_format = chosen.replace("|, ", "| ", 1)
