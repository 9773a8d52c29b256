"""LearningRateFinder: the learning-rate range test (Leslie Smith's) at the start of a fit, as Lightning's
(``lightning.pytorch.callbacks.LearningRateFinder``, ``tuner.lr_finder``).

The search trains ``num_training`` steps with the learning rate rising from ``min_lr`` to ``max_lr``, records the
smoothed loss of each, and suggests the rate where the loss falls fastest. It runs in a ``Trainer.trial``, so the
fit then starts from the state it had before (weights, optimizer, counters), with the RNG and the loaders as
Lightning's search leaves them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from tandem.callbacks.callback import Callback
from tandem.utilities.exceptions import MissingAttributeError, TunerExit, bad_choice, incompatible, out_of_range
from tandem.utilities.parsing import lightning_hasattr, lightning_setattr
from tandem.utilities.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer

_LR_NAMES = ("lr", "learning_rate")
log = logging.getLogger(__name__)


class LRFinder:
    """What a learning-rate range test found (Lightning's ``_LRFinder``).

    Attributes:
        results: ``{"lr": [...], "loss": [...]}``: the learning rate of each step and the smoothed loss after it
            (NaN for a step whose ``training_step`` returned no loss).
        mode: ``"exponential"`` or ``"linear"``: how the rate rose.
    """

    def __init__(self, mode: str, lr_min: float, lr_max: float, num_training: int) -> None:
        self.mode, self.lr_min, self.lr_max, self.num_training = mode, lr_min, lr_max, num_training
        self.results: dict[str, list[float]] = {}
        self._optimal_idx: int | None = None

    def schedule(self) -> list[float]:
        """The learning rate of each step, as Lightning's search sets it: ``min_lr`` at step 0, then at step
        ``k >= 1`` the fraction ``r = (k + 1) / num_training`` of the way to ``max_lr`` (on a log scale in
        ``"exponential"`` mode: ``min_lr * (max_lr / min_lr) ** r``), so the last step trains with ``max_lr`` and no
        step with ``r = 1 / num_training``."""
        low, high, n = self.lr_min, self.lr_max, self.num_training
        if self.mode == "linear":
            return [low] + [low + (k + 1) / n * (high - low) for k in range(1, n)]
        return [low] + [low * (high / low) ** ((k + 1) / n) for k in range(1, n)]

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The learning rate where the loss falls fastest, by Lightning's rule: the most negative gradient of the
        loss over the learning rate itself (``torch.gradient`` with the rates as coordinates, in the default dtype,
        also in ``"exponential"`` mode), among the points left after the first ``skip_begin`` and the last
        ``skip_end`` and the non-finite ones; None (with an error logged, as Lightning's) when fewer than two points
        are left.

        Args:
            skip_begin: leading points left out (the noisy start).
            skip_end: trailing points left out (the blow-up); 0 keeps them all.
        """
        stop = -skip_end if skip_end else None
        losses = torch.tensor(self.results.get("loss", [])[skip_begin:stop])
        lrs = torch.tensor(self.results.get("lr", [])[skip_begin:stop])
        finite = torch.isfinite(losses)
        losses, lrs = losses[finite], lrs[finite]
        if len(losses) < 2:  # torch.gradient needs two points
            log.error(
                "Failed to compute suggestion for learning rate: fewer than 2 finite losses are left after "
                f"skip_begin={skip_begin} and skip_end={skip_end}. Raise num_training (or max_epochs, which also ends "
                "the search), use more training data, or make early stopping less sensitive (a higher "
                "early_stop_threshold, or None)."
            )
            self._optimal_idx = None
            return None
        slopes = torch.gradient(losses, spacing=[lrs])[0]
        kept = torch.arange(len(self.results["loss"]))[skip_begin:stop][finite]
        self._optimal_idx = int(kept[int(torch.argmin(slopes))])
        return self.results["lr"][self._optimal_idx]

    def plot(self, suggest: bool = False, show: bool = False, ax: Any = None) -> Any:
        """Loss over learning rate (a log axis for ``"exponential"``); ``suggest`` marks the suggestion in red.
        Needs matplotlib. Returns the figure.

        Args:
            suggest: mark the suggested learning rate.
            show: call ``plt.show()``.
            ax: a matplotlib ``Axes`` to draw into (default: a new figure).
        """
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError(
                "LRFinder.plot() needs matplotlib, which is not installed: pip install matplotlib. "
                "(The numbers are in lr_finder.results.)"
            ) from None
        lrs, losses = self.results["lr"], self.results["loss"]
        if ax is None:
            fig, ax = plt.subplots()
        else:
            fig = ax.figure
        ax.plot(lrs, losses)
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        index = self._optimal_idx if suggest and self.suggestion() is not None else None  # suggestion() sets it
        if index is not None:
            ax.plot(lrs[index], losses[index], markersize=10, marker="o", color="red")
        if show:
            plt.show()
        return fig


class _Diverged(Exception):  # noqa: N818 - the range test's own stop, caught by lr_find
    """The smoothed loss rose above ``early_stop_threshold`` times its best: the search stops (every rank)."""


class _Done(Exception):  # noqa: N818 - the range test's own stop, caught by lr_find
    """Every learning rate of the schedule was tried (batches whose ``training_step`` returned None included)."""


class _LRRecorder(Callback):
    """Sets each step's learning rate and records the smoothed loss after it (Lightning's ``_LRCallback``).

    The loss is an exponential moving average (``beta``) corrected for its start as Lightning corrects it: after the
    ``n``-th step of the search it is divided by ``1 - beta ** (n + 1)``. The search stops after a step (recorded)
    whose smoothed loss exceeds ``early_stop_threshold`` times the best one, from the second step on; the best is the
    first step's smoothed loss, then any lower one. A NaN loss stops nothing (it is recorded, and every smoothed loss
    after it is NaN); an infinite one stops the search.

    ``n`` counts the search's own steps. Lightning reads ``trainer.global_step`` instead: the same for a search at
    fit start, but in a search started later in a fit its best loss then stays 0 and the first step stops it.
    """

    def __init__(self, schedule: list[float], early_stop_threshold: float | None, beta: float = 0.98) -> None:
        self.schedule, self.early_stop_threshold, self.beta = schedule, early_stop_threshold, beta
        self.lrs: list[float] = []
        self.losses: list[float] = []
        self._average = 0.0
        self._best = 0.0
        self._open = False  # a stepping batch started: its loss is recorded at its end

    def on_train_batch_start(self, trainer: Trainer, module: TrainingModule, batch: Any, batch_idx: int) -> None:
        if not trainer.is_stepping_batch:
            return
        if len(self.lrs) >= len(self.schedule):  # a batch whose training_step returned None used a rate, no step
            raise _Done
        lr = self.schedule[len(self.lrs)]
        for group in trainer.optimizers[0].param_groups:
            group["lr"] = lr
        self.lrs.append(lr)
        self._open = True

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._open:
            return
        self._open = False
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if not isinstance(loss, torch.Tensor):  # the step returned no loss: a point the suggestion leaves out
            self.losses.append(math.nan)
            return
        step = len(self.lrs)  # Lightning's trainer.global_step here, for a search that starts at step 0
        self._average = self.beta * self._average + (1 - self.beta) * loss.item()  # one read per search step
        smoothed = self._average / (1 - self.beta ** (step + 1))
        threshold = self.early_stop_threshold
        diverged = threshold is not None and step > 1 and smoothed > threshold * self._best
        if smoothed < self._best or step == 1:
            self._best = smoothed
        self.losses.append(smoothed)
        if trainer.strategy.broadcast(diverged):  # rank 0 decides: every rank stops at the same step
            raise _Diverged


def _lr_attribute(model: TrainingModule, attr_name: str) -> str:
    """The attribute holding the learning rate: ``attr_name``, else ``lr`` or ``learning_rate`` (Lightning's)."""
    if attr_name:
        if not lightning_hasattr(model, attr_name):
            raise MissingAttributeError(
                f"The learning rate finder was told attr_name={attr_name!r}, but neither {type(model).__name__} nor "
                "its hparams (nor the DataModule) has it. Pass the attribute configure_optimizers reads."
            )
        return attr_name
    for name in _LR_NAMES:
        if lightning_hasattr(model, name):
            return name
    raise MissingAttributeError(
        f"The learning rate finder updates the learning rate it finds, so {type(model).__name__} (or its hparams) "
        f"should have one of these fields: {_LR_NAMES}. Store it as self.lr (or save_hyperparameters(lr=...)) and "
        "read it in configure_optimizers, pass attr_name=<its name>, or update_attr=False."
    )


def lr_find(
    trainer: Trainer,
    model: TrainingModule,
    min_lr: float = 1e-8,
    max_lr: float = 1,
    num_training: int = 100,
    mode: str = "exponential",
    early_stop_threshold: float | None = 4.0,
    update_attr: bool = False,
    attr_name: str = "",
) -> LRFinder | None:
    """The range test, run from a hook of a fit on every rank; see
    [`LearningRateFinder`][tandem.callbacks.LearningRateFinder]. Returns the results (the same on every rank: rank 0's),
    or None under ``fast_dev_run``."""
    if trainer.fast_dev_run:
        rank_zero_warn("Skipping the learning rate finder: fast_dev_run is set.")
        return None
    if update_attr:
        attr_name = _lr_attribute(model, attr_name)
    if len(trainer.optimizers) != 1:
        raise incompatible(
            f"configure_optimizers returned {len(trainer.optimizers)} optimizers",
            "the learning rate finder only works with single optimizer setups (it searches one optimizer's rate)",
            "Let configure_optimizers return one optimizer while you search, or search each rate separately.",
        )
    finder = LRFinder(mode, min_lr, max_lr, num_training)
    recorder = _LRRecorder(finder.schedule(), early_stop_threshold)
    # As Lightning's: the fit's max_epochs ends the search too, and the loaders are built again after it
    with trainer.trial([recorder], max_steps=num_training, max_epochs=trainer.max_epochs, restart_data=True) as trial:
        try:
            trial.run()
        except _Done:
            pass
        except _Diverged:
            rank_zero_info(
                f"The learning rate finder stopped early after {len(recorder.losses)} steps: the loss diverged."
            )
    finder.results = trainer.strategy.broadcast({"lr": recorder.lrs, "loss": recorder.losses})
    if update_attr:
        lr = finder.suggestion()
        if lr is not None:  # after the trial: the restored state keeps it, and the fit goes on with it
            lightning_setattr(model, attr_name, lr)
            for optimizer in trainer.optimizers:
                for group in optimizer.param_groups:
                    group["lr"] = lr
            rank_zero_info(f"Learning rate set to {lr}")
    return finder


def check_lr_find_arguments(min_lr: float, max_lr: float, num_training: int, mode: str) -> str:
    """The range test's arguments, validated before anything runs; returns ``mode`` in lower case."""
    mode = mode.lower() if isinstance(mode, str) else mode
    if mode not in LearningRateFinder.SUPPORTED_MODES:
        raise bad_choice("mode", mode, LearningRateFinder.SUPPORTED_MODES)
    if isinstance(num_training, bool) or not isinstance(num_training, int) or num_training < 1:
        raise out_of_range("num_training", num_training, "an int >= 1 (the steps of the search)")
    # min_lr > max_lr searches downwards, as Lightning's; a log scale needs both rates above 0
    if mode == "exponential" and not (min_lr > 0 and max_lr > 0):
        raise out_of_range("min_lr, max_lr", (min_lr, max_lr), "both > 0 in mode='exponential' (a log scale)")
    if mode == "linear" and not (min_lr >= 0 and max_lr >= 0):
        raise out_of_range("min_lr, max_lr", (min_lr, max_lr), "both >= 0")
    return mode


class LearningRateFinder(Callback):
    """Runs the learning-rate range test when the fit starts, then trains with the rate it suggests.

    The search trains ``num_training_steps`` steps with the rate rising from ``min_lr`` to ``max_lr`` (the same rate
    for every parameter group), records the loss, smoothed, after each, and stops early once it exceeds
    ``early_stop_threshold`` times the best so far. The fit then starts from exactly the state it had (weights,
    optimizer, counters, callbacks, RNG) with the suggested rate set on the module (``update_attr``) and its
    optimizer. Under DDP every rank searches and rank 0's results count for all. ``lr_finder`` holds the results
    (``.results``, ``.suggestion()``, ``.plot()``); ``optimal_lr`` is the same object, as in Lightning.

    Args:
        min_lr: the first learning rate tried.
        max_lr: the last.
        num_training_steps: optimizer steps of the search (the learning rates tried).
        mode: ``"exponential"`` (evenly spaced on a log scale) or ``"linear"``.
        early_stop_threshold: stop when the smoothed loss exceeds this times its best (None: never).
        update_attr: set the suggestion on the module's ``lr`` / ``learning_rate`` (or ``attr_name``), its hparams
            or the DataModule, wherever it is found, and on the optimizer.
        attr_name: the attribute holding the learning rate, when it is not ``lr`` or ``learning_rate``.

    Example:
        ```python
        trainer = Trainer(callbacks=[LearningRateFinder(num_training_steps=50)])
        trainer.fit(model)  # searches first, then trains with model.lr set to the suggestion
        ```

    Override ``on_fit_start`` and call [`lr_find`][tandem.callbacks.LearningRateFinder.lr_find] from another hook (e.g.
    ``on_train_epoch_start`` at some epochs, when fine-tuning) to search elsewhere.
    """

    SUPPORTED_MODES = ("linear", "exponential")

    def __init__(
        self,
        min_lr: float = 1e-8,
        max_lr: float = 1,
        num_training_steps: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
    ) -> None:
        self._mode = check_lr_find_arguments(min_lr, max_lr, num_training_steps, mode)
        self._min_lr, self._max_lr, self._num_training_steps = min_lr, max_lr, num_training_steps
        self._early_stop_threshold, self._update_attr, self._attr_name = early_stop_threshold, update_attr, attr_name
        self._early_exit = False  # set by Tuner: the fit ends after the search
        self.lr_finder: LRFinder | None = None
        self.optimal_lr: LRFinder | None = None

    def lr_find(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        """Run the search now (on every rank) and keep its results in ``lr_finder`` / ``optimal_lr``."""
        self.lr_finder = self.optimal_lr = lr_find(
            trainer,
            pl_module,
            min_lr=self._min_lr,
            max_lr=self._max_lr,
            num_training=self._num_training_steps,
            mode=self._mode,
            early_stop_threshold=self._early_stop_threshold,
            update_attr=self._update_attr,
            attr_name=self._attr_name,
        )
        if self._early_exit:
            raise TunerExit

    def on_fit_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self.lr_find(trainer, pl_module)
