"""``TrainerProperties``: the Trainer's public state, read-only but for a few setters (``should_stop``,
``loggers``, ``accumulate_grad_batches``), under Lightning's names and aliases: progress, logged values, the data,
loggers and callbacks, processes, settings, what is running.

A base class of ``Trainer`` (see ``tandem.trainer.trainer``), so that ``trainer.global_step`` stays one attribute
read; it reads the state ``Trainer.__init__`` sets, declared below.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

import torch

from tandem.callbacks.callback import Callback
from tandem.module import TrainingModule
from tandem.strategies.strategy import Strategy
from tandem.trainer.config import TrainerConfig
from tandem.trainer.evaluation import EvaluationLoop
from tandem.trainer.logging.collector import MetricCollector
from tandem.trainer.logging.sink import LogSink
from tandem.trainer.loops import FitLoop
from tandem.trainer.nonfinite import NonFiniteGuard
from tandem.trainer.optim import LRSchedulerConfig
from tandem.trainer.rollback import RollbackRecord
from tandem.trainer.state import TrainerState
from tandem.utilities.exceptions import TandemConfigError, incompatible
from tandem.utilities.logged_values import to_float
from tandem.utilities.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from tandem.callbacks.early_stopping import EarlyStopping
    from tandem.callbacks.model_checkpoint import ModelCheckpoint
    from tandem.callbacks.progress_bar import ProgressBar
    from tandem.loggers.logger import Logger


class TrainerProperties:
    """The Trainer's public state (a base of ``Trainer``)."""

    # set by Trainer.__init__
    strategy: Strategy
    state: TrainerState
    callbacks: list[Callback]
    default_root_dir: str
    fit_loop: FitLoop
    _config: TrainerConfig
    _metrics: MetricCollector
    _sink: LogSink
    _evaluation: EvaluationLoop
    _nonfinite: NonFiniteGuard
    _ckpt_path: str | None

    # ================================================================== public state
    @property
    def ckpt_path(self) -> str | None:
        """The checkpoint file the latest ``fit`` / ``validate`` / ``test`` / ``predict`` loaded (``ckpt_path=``
        resolved: ``"best"`` and ``"last"`` name the file); None when it loaded none."""
        return self._ckpt_path

    @property
    def current_epoch(self) -> int:
        return self.fit_loop.state.epoch

    @property
    def global_step(self) -> int:
        """Optimizer steps taken: one per step of each optimizer (a GAN stepping two per batch counts two)."""
        return self.fit_loop.state.global_step

    @property
    def is_stepping_batch(self) -> bool:
        """The training batch now running ends in an optimizer step (the last micro-batch of an accumulation
        window; under manual optimization every batch). Decided once at the top of each batch (accelerate's
        ``sync_gradients``)."""
        return self.fit_loop.state.stepping

    @property
    def is_log_step(self) -> bool:
        """The training batch now running publishes its logged values to the loggers at its end (every
        ``log_every_n_steps`` stepping batches). Decided once at the top of each batch; callbacks that log
        per step (``LearningRateMonitor``, ``ThroughputMonitor``) follow it, so every value lands on the same
        steps."""
        return self.fit_loop.state.log_step

    @property
    def should_stop(self) -> bool:
        """Set True (a callback, the module) to end the fit at the next point every rank agrees on."""
        return self.state.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.state.should_stop = bool(value)

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        return self._metrics.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, Any]:
        """What was sent to the loggers (and the training step values logged since), as Lightning's: one-number
        float tensors, in the order first logged."""
        return self._metrics.logged()

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """The ``prog_bar=True`` values as numbers (Lightning's), read now: one host sync for all."""
        return to_float(self._metrics.progress_bar_metrics, torch.float64)  # exact for float32 and float64

    @property
    def training_module(self) -> TrainingModule | None:
        """The user's module (Lightning: ``lightning_module``); None before a run."""
        return cast("TrainingModule | None", self.strategy.module)  # the strategy declares an nn.Module

    lightning_module = training_module

    @property
    def model(self) -> torch.nn.Module | None:
        """The module as the steps run it (possibly wrapped by DDP or DataParallel)."""
        return self.strategy.model

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return list(self.fit_loop.optimization.optimizers)

    @property
    def lr_scheduler_configs(self) -> list[LRSchedulerConfig]:
        return list(self.fit_loop.optimization.lr_scheduler_configs)

    # ------------------------------------------------------------------ data, as Lightning names it
    @property
    def train_dataloader(self) -> Any:
        """The training loader as the loop reads it (sharded under DDP); None before a fit."""
        return self.fit_loop.data.given

    @property
    def val_dataloaders(self) -> Any:
        """The validation loader(s) in the shape given (one, a list or a dict); None when there are none."""
        return self._evaluation.records["validate"].given

    @property
    def test_dataloaders(self) -> Any:
        return self._evaluation.records["test"].given

    @property
    def predict_dataloaders(self) -> Any:
        return self._evaluation.records["predict"].given

    @property
    def num_training_batches(self) -> int | float:
        """Training batches per epoch (after ``limit_train_batches``; ``inf`` for an unsized loader)."""
        num_batches = self.fit_loop.data.num_batches
        return num_batches[0] if num_batches else 0

    @property
    def num_val_batches(self) -> list[int | float]:
        """Validation batches of each validation loader (a list, as in Lightning)."""
        return list(self._evaluation.records["validate"].num_batches)

    @property
    def num_test_batches(self) -> list[int | float]:
        return list(self._evaluation.records["test"].num_batches)

    @property
    def num_predict_batches(self) -> list[int | float]:
        return list(self._evaluation.records["predict"].num_batches)

    @property
    def num_sanity_val_batches(self) -> list[int | float]:
        """The sanity check's batches of each validation loader."""
        return [min(self._config.sanity_steps, n) for n in self._evaluation.records["validate"].num_batches]

    @property
    def num_sanity_val_steps(self) -> int | float:
        """Validation batches the sanity check runs, over all loaders (0 without validation data)."""
        return sum(self.num_sanity_val_batches)

    # ------------------------------------------------------------------ loggers and callbacks
    @property
    def loggers(self) -> list[Logger]:
        return self._sink.loggers

    @loggers.setter
    def loggers(self, loggers: Iterable[Logger]) -> None:
        self._sink.loggers = list(loggers)

    @property
    def logger(self) -> Logger | None:
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        log_dir = self.loggers[0].log_dir if self.loggers else None  # None: a logger without a local folder
        return log_dir if log_dir is not None else self.default_root_dir

    @property
    def checkpoint_callbacks(self) -> list[ModelCheckpoint]:
        from tandem.callbacks.model_checkpoint import ModelCheckpoint

        return [c for c in self.callbacks if isinstance(c, ModelCheckpoint)]

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        callbacks = self.checkpoint_callbacks
        return callbacks[0] if callbacks else None

    @property
    def progress_bar_callback(self) -> ProgressBar | None:
        """The progress bar callback in use (the first ``ProgressBar`` among the callbacks), or None without one."""
        from tandem.callbacks.progress_bar import ProgressBar

        return next((c for c in self.callbacks if isinstance(c, ProgressBar)), None)

    @property
    def early_stopping_callbacks(self) -> list[EarlyStopping]:
        from tandem.callbacks.early_stopping import EarlyStopping

        return [c for c in self.callbacks if isinstance(c, EarlyStopping)]

    @property
    def early_stopping_callback(self) -> EarlyStopping | None:
        callbacks = self.early_stopping_callbacks
        return callbacks[0] if callbacks else None

    # ------------------------------------------------------------------ processes
    @property
    def global_rank(self) -> int:
        return self.strategy.global_rank

    @property
    def local_rank(self) -> int:
        return self.strategy.local_rank

    @property
    def node_rank(self) -> int:
        return self.strategy.node_rank

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def num_nodes(self) -> int:
        return self.strategy.num_nodes

    @property
    def num_devices(self) -> int:
        return len(self.strategy.parallel_devices or [self.strategy.root_device])

    @property
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    # ------------------------------------------------------------------ settings
    @property
    def max_epochs(self) -> int:
        max_epochs = self._config.max_epochs
        assert max_epochs is not None  # TrainerConfig resolved None (Lightning's default)
        return max_epochs

    @property
    def min_epochs(self) -> int | None:
        return self._config.min_epochs

    @property
    def max_steps(self) -> int:
        return self._config.max_steps

    @property
    def min_steps(self) -> int | None:
        return self._config.min_steps

    @property
    def accumulate_grad_batches(self) -> int:
        """Batches per optimizer step; read at every batch, so a callback may change it (e.g. at epoch start)."""
        return self._config.accumulate_grad_batches

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TandemConfigError(f"accumulate_grad_batches={value!r} is out of range; expected an int >= 1.")
        if value != 1 and not self.fit_loop.optimization.automatic:
            raise incompatible(
                f"accumulate_grad_batches={value} with manual optimization",
                "the Trainer cannot accumulate gradients for optimizers the module steps itself",
                "Step the optimizers every N batches in training_step instead.",
            )
        self._config.accumulate_grad_batches = value

    @property
    def gradient_clip_val(self) -> float | None:
        return self._config.gradient_clip_val

    @property
    def gradient_clip_algorithm(self) -> str | None:
        return self._config.gradient_clip_algorithm

    @property
    def limit_train_batches(self) -> int | float:
        limit = self._config.limit_train_batches
        assert limit is not None  # TrainerConfig resolved None (1.0)
        return limit

    @property
    def limit_val_batches(self) -> int | float:
        limit = self._config.limit_val_batches
        assert limit is not None  # TrainerConfig resolved None (1.0)
        return limit

    @property
    def limit_test_batches(self) -> int | float:
        limit = self._config.limit_test_batches
        assert limit is not None  # TrainerConfig resolved None (1.0)
        return limit

    @property
    def limit_predict_batches(self) -> int | float:
        limit = self._config.limit_predict_batches
        assert limit is not None  # TrainerConfig resolved None (1.0)
        return limit

    @property
    def val_check_interval(self) -> int | float | str | timedelta | dict[str, Any]:
        interval = self._config.val_check_interval
        assert interval is not None  # TrainerConfig resolved None (1.0)
        return interval

    @property
    def enable_validation(self) -> bool:
        """Whether the fit validates: validation data is given (or a ``val_dataloader`` hook defined), the module has
        ``validation_step``, and ``limit_val_batches`` is not 0 (Lightning's property; known once a fit started)."""
        return self.fit_loop.validates

    @property
    def check_val_every_n_epoch(self) -> int | None:
        return self._config.check_val_every_n_epoch

    @property
    def log_every_n_steps(self) -> int:
        return self._config.log_every_n_steps

    @property
    def fast_dev_run(self) -> bool | int:
        """As given to the Trainer (``1`` reads as ``True``, as in Lightning)."""
        return self._config.fast_dev_run

    @property
    def overfit_batches(self) -> int | float:
        return self._config.overfit_batches

    @property
    def reload_dataloaders_every_n_epochs(self) -> int:
        return self._config.reload_dataloaders_every_n_epochs

    @property
    def on_replica_divergence(self) -> str:
        return self._config.on_replica_divergence

    @property
    def precision(self) -> str:
        return self.strategy.precision.precision

    @property
    def on_nonfinite(self) -> str:
        return self._nonfinite.reaction

    @property
    def rollbacks(self) -> list[RollbackRecord]:
        """The rollbacks of the latest fit under ``on_nonfinite="rollback"``, oldest first (empty otherwise)."""
        rollback = self._nonfinite.rollback
        return [] if rollback is None else list(rollback.history)

    # ------------------------------------------------------------------ what is running
    @property
    def sanity_checking(self) -> bool:
        return self.state.stage == "sanity_check"

    @property
    def training(self) -> bool:
        return self.state.stage == "train"

    @property
    def validating(self) -> bool:
        return self.state.stage == "validate"

    @property
    def testing(self) -> bool:
        return self.state.stage == "test"

    @property
    def predicting(self) -> bool:
        return self.state.stage == "predict"

    @property
    def interrupted(self) -> bool:
        """The last run ended with an exception (Ctrl-C included)."""
        return self.state.status == "interrupted"

    @property
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps the fit will take (for schedulers such as OneCycleLR)."""
        running = self.state.fn == "fit" and self.state.status == "running"
        if running and self._config.epoch_limit != math.inf and self.fit_loop.needs_training_data:
            rank_zero_info("Loading `train_dataloader` to estimate number of stepping batches.")
            self.fit_loop.load_training()  # as Lightning: asked for early (configure_optimizers), not again later
        per_epoch = math.ceil(self.num_training_batches / self.accumulate_grad_batches)
        total = per_epoch * self._config.epoch_limit
        return min(total, self.max_steps) if self.max_steps != -1 else total
