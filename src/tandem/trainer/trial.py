"""Trials: short training runs inside a running fit that leave no trace, for the tuner's searches (the
learning-rate range test, the batch size search). ``Trainer.trial`` opens one.

On entry the fit's whole state goes into a temporary checkpoint (Lightning's way: ``.trial-<uuid>.ckpt`` in
``default_root_dir``, written by rank 0). In the block the fit runs with the search's settings; on exit, error or
not, the settings come back, the checkpoint is loaded back and the RNG states are as on entry, so the fit (or the
next one) goes on exactly as if no search had run.
"""

from __future__ import annotations

import contextlib
import copy
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tandem.callbacks.callback import Callback
from tandem.trainer import checkpointing
from tandem.utilities.exceptions import TandemConfigError, out_of_range
from tandem.utilities.seed import capture_rng_state, restore_rng_state

if TYPE_CHECKING:
    from tandem.trainer.config import TrainerConfig
    from tandem.trainer.evaluation import EvaluationLoop
    from tandem.trainer.hooks import HookDispatcher
    from tandem.trainer.logging.collector import MetricCollector
    from tandem.trainer.nonfinite import NonFiniteGuard
    from tandem.trainer.trainer import Trainer


@dataclass
class TrialParts:
    """What a trial changes and puts back, beside the Trainer's public attributes (the Trainer hands them over)."""

    config: TrainerConfig
    hooks: HookDispatcher
    nonfinite: NonFiniteGuard
    evaluation: EvaluationLoop
    metrics: MetricCollector
    load_data: Callable[[], None] | None  # builds the fit's loaders again (None outside a fit)
    data_from_hooks: bool  # the training loaders come from train_dataloader() of the module or DataModule


class Trial:
    """The search's handle inside ``with trainer.trial(...) as trial``."""

    def __init__(self, trainer: Trainer, parts: TrialParts, start: dict[str, Any]) -> None:
        self._trainer, self._parts, self._start = trainer, parts, start
        self.reloaded = False  # reload_data() ran: the loaders are built again when the trial ends

    @property
    def reloadable(self) -> bool:
        """The training loaders come from ``train_dataloader()`` of the module or DataModule, so
        ``reload_data`` builds them with changed hyperparameters (loaders passed to ``fit`` stay as given)."""
        return self._parts.data_from_hooks

    def run(self) -> None:
        """Train from where the fit was when the trial opened (the loop's counters as then, no gradients), until
        the trial's ``max_steps`` or an exception of the search's callbacks ends it."""
        trainer, loop = self._trainer, self._trainer.fit_loop
        loop.load_state_dict(copy.deepcopy(self._start), announce=False)
        trainer.should_stop = False
        _drop_gradients(trainer)
        loop.run(announce=False)

    def reload_data(self) -> None:
        """Build the fit's loaders again from the module's or DataModule's hooks (after a hyperparameter they
        read, such as ``batch_size``, changed). Trials still validate nothing."""
        load_data = self._parts.load_data
        assert load_data is not None  # open_trial opens no trial without one
        load_data()
        self.reloaded = True


@contextlib.contextmanager
def open_trial(
    trainer: Trainer,
    parts: TrialParts,
    callbacks: Sequence[Callback],
    max_steps: int,
    max_epochs: int | None = None,
    restart_data: bool = False,
) -> Iterator[Trial]:
    """See [`Trainer.trial`][tandem.Trainer.trial]."""
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise out_of_range("trial max_steps", max_steps, "an int >= 1")
    if max_epochs is not None and (isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < -1):
        raise out_of_range("trial max_epochs", max_epochs, "None, -1 (no limit) or an int >= 0")
    module = trainer.training_module
    if trainer.state.fn != "fit" or trainer.state.status != "running" or parts.load_data is None or module is None:
        raise TandemConfigError(
            "Trainer.trial() runs inside a fit: call it from a callback hook such as on_fit_start or "
            "on_train_epoch_start (as LearningRateFinder and BatchSizeFinder do), or use tandem.tuner.Tuner."
        )
    for callback in callbacks:
        if not isinstance(callback, Callback):
            raise TandemConfigError(f"Trainer.trial(callbacks=...) takes tandem.Callback instances; got {callback!r}.")
    strategy, loop, config = trainer.strategy, trainer.fit_loop, parts.config
    path = strategy.broadcast(os.path.join(trainer.default_root_dir, f".trial-{uuid.uuid4().hex}.ckpt"))
    rng = capture_rng_state()
    at_fit_start = loop.needs_training_data  # the fit has not asked for its training loader yet
    try:
        if not trainer.save_checkpoint(path):  # on_nonfinite="warn" with NaN / inf parameters ("raise" raised)
            raise TandemConfigError(
                "The search cannot start: the parameters hold NaN or inf, so the state it must come back to cannot "
                "be saved. Find where they turn non-finite first (Trainer(on_nonfinite='raise'))."
            )
        saved_callbacks, saved_loggers = list(trainer.callbacks), trainer.loggers
        saved_limits = config.max_steps, config.max_epochs
        saved_schedulers = loop.optimization.lr_scheduler_configs
        saved_validates = loop.validates
        trial = Trial(trainer, parts, copy.deepcopy(loop.state_dict()))
        try:
            trainer.callbacks = list(callbacks)
            parts.hooks.collect(trainer, module, trainer.callbacks)
            trainer.loggers = []
            config.max_steps = loop.state.global_step + max_steps
            bound = loop.state.epoch + max_steps  # an epoch without a step cannot make it loop forever
            config.max_epochs = bound if max_epochs is None or max_epochs == -1 else min(max_epochs, bound)
            loop.optimization.lr_scheduler_configs = []
            loop.validates = False  # trials validate nothing (no sanity check either)
            with parts.nonfinite.paused():
                yield trial
        finally:
            trainer.callbacks = saved_callbacks
            parts.hooks.collect(trainer, module, saved_callbacks)
            trainer.loggers = saved_loggers
            config.max_steps, config.max_epochs = saved_limits
            loop.optimization.lr_scheduler_configs = saved_schedulers
            loop.validates = saved_validates
            if trial.reloaded:  # the fit goes on with loaders of the hyperparameters the search left
                parts.load_data()
                parts.evaluation.forget("validate")  # asked for again where the fit next needs them
            elif restart_data and parts.data_from_hooks:  # Lightning's LR finder: the loaders are built again
                if at_fit_start:  # where the fit first asks for them: after the search, with the RNG as it was
                    loop.forget_training()
                else:
                    parts.load_data()
            _drop_gradients(trainer)
            checkpointing.restore(trainer, path, "fit", rng=False, announce=False)
            strategy.barrier("trial")  # every rank has read the file before rank 0 removes it
            strategy.remove_checkpoint(path)
            parts.metrics.reset()
            parts.metrics.clear_published()  # the trials' logged values are not the fit's
            trainer.should_stop = False
    finally:
        restore_rng_state(rng)


def _drop_gradients(trainer: Trainer) -> None:
    """No gradients left by an interrupted trial (an out-of-memory error between backward and the step)."""
    module = trainer.training_module
    assert module is not None  # open_trial opens no trial without one
    module.zero_grad(set_to_none=True)
    trainer.fit_loop.optimization.has_gradients = False
