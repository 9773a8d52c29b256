"""The Trainer: entry points (fit, validate, test, predict), set-up, hooks, checkpoints."""

from __future__ import annotations

import contextlib
import glob
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader

from tandem.callbacks.callback import Callback
from tandem.module import DataModule, TrainingModule
from tandem.strategies.registry import resolve_strategy
from tandem.strategies.strategy import Strategy
from tandem.trainer import loops
from tandem.trainer.config import TrainerConfig, limit_batches
from tandem.trainer.logging import MetricCollector, to_float
from tandem.trainer.optim import LRSchedulerConfig, parse_optimizers
from tandem.trainer.state import EVAL_STAGES, Progress, TrainerState
from tandem.utilities.checkpoint import CHECKPOINT_MARKER, to_weights_only
from tandem.utilities.data import has_len, make_skippable
from tandem.utilities.exceptions import TandemConfigError, TandemUserCodeError, missing_metric
from tandem.utilities.rank_zero import rank_zero_warn
from tandem.utilities.seed import capture_rng_state


class Trainer:
    """Runs the loop; the strategy decides where and on how many processes.

    Args:
        accelerator: ``"auto"`` (CUDA if available), ``"cpu"`` or ``"cuda"``.
        devices: ``"auto"``, a count (``-1`` for all), or a list of CUDA indices.
        strategy: ``"auto"``, a registered name (``"single_device"``, ``"ddp"``, ``"ddp_spawn"``, ``"fsdp"``,
            ``"dp"``) or a :class:`~tandem.strategies.Strategy` instance.
        num_nodes: machines in a multi-node DDP job.
        precision: ``"32-true"``, ``"64-true"``, ``"bf16-mixed"`` or ``"16-mixed"``.
        max_epochs: stop after this many epochs (default 1000 when ``max_steps`` is not set; -1: no limit).
        max_steps: stop after this many optimizer steps (-1: no limit).
        limit_train_batches / limit_val_batches / limit_test_batches / limit_predict_batches: an int
            number of batches or a fraction of each epoch.
        val_check_interval: validate every this fraction of an epoch (float) or number of batches (int).
        check_val_every_n_epoch: validate every n epochs.
        num_sanity_val_steps: validation batches run before training to catch bugs early (-1: all).
        accumulate_grad_batches: step the optimizer every k batches (gradients of k batches averaged).
        gradient_clip_val: clip gradients at this value (None: no clipping).
        gradient_clip_algorithm: ``"norm"`` (total norm) or ``"value"`` (elementwise).
        callbacks: callbacks, run in the order given.
        logger: True (TensorBoard), False, a Logger or a list of loggers.
        default_root_dir: where logs and checkpoints go (default: the working directory).
        enable_checkpointing: add a ModelCheckpoint writing ``last.ckpt`` every epoch when none is given.
        enable_progress_bar: show a tqdm progress bar (rank zero only).
        enable_model_summary: print parameter counts at fit start (rank zero only).
        log_every_n_steps: send step metrics to the loggers every n optimizer steps.
        deterministic: make torch use deterministic algorithms.
        use_distributed_sampler: let a distributed strategy replace the samplers to shard the data
            (False: shard it yourself).
        fast_dev_run: run 1 (or n) batches of training, validation and test, without loggers or
            checkpoints, to smoke-test a module.

    Example::

        trainer = Trainer(max_epochs=5, strategy="ddp", devices=2)
        trainer.fit(model, train_loader, val_loader)
        trainer.test(model, test_loader)
    """

    def __init__(
        self,
        *,
        accelerator: str = "auto",
        devices: int | str | list[int] = "auto",
        strategy: str | Strategy = "auto",
        num_nodes: int = 1,
        precision: str | int = "32-true",
        max_epochs: int | None = None,
        max_steps: int = -1,
        limit_train_batches: int | float = 1.0,
        limit_val_batches: int | float = 1.0,
        limit_test_batches: int | float = 1.0,
        limit_predict_batches: int | float = 1.0,
        val_check_interval: int | float = 1.0,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int = 2,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
        callbacks: Callback | Iterable[Callback] | None = None,
        logger: Any = True,
        default_root_dir: str | os.PathLike | None = None,
        enable_checkpointing: bool = True,
        enable_progress_bar: bool = True,
        enable_model_summary: bool = True,
        log_every_n_steps: int = 50,
        deterministic: bool = False,
        fast_dev_run: bool | int = False,
        use_distributed_sampler: bool = True,
    ) -> None:
        self._config = TrainerConfig(
            max_epochs=max_epochs,
            max_steps=max_steps,
            limit_train_batches=limit_train_batches,
            limit_val_batches=limit_val_batches,
            limit_test_batches=limit_test_batches,
            limit_predict_batches=limit_predict_batches,
            val_check_interval=val_check_interval,
            check_val_every_n_epoch=check_val_every_n_epoch,
            num_sanity_val_steps=num_sanity_val_steps,
            accumulate_grad_batches=accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm,
            log_every_n_steps=log_every_n_steps,
            fast_dev_run=fast_dev_run,
            precision=precision,
        )
        self.strategy: Strategy = resolve_strategy(strategy, accelerator, devices, num_nodes, precision)
        if not use_distributed_sampler:
            self.strategy.use_distributed_sampler = False
        self.default_root_dir: str = os.fspath(default_root_dir) if default_root_dir is not None else os.getcwd()
        self.deterministic = deterministic
        self.loggers: list[Any] = [] if self.fast_dev_run else _build_loggers(logger, self.default_root_dir)
        self.callbacks: list[Callback] = _build_callbacks(
            callbacks, enable_checkpointing and not self.fast_dev_run, enable_progress_bar, enable_model_summary
        )
        self.should_stop = False
        self.state = TrainerState()
        self._metrics = MetricCollector(self.strategy)
        self._progress = Progress()
        self._optimizer: torch.optim.Optimizer | None = None
        self._lr_scheduler_configs: list[LRSchedulerConfig] = []
        self._has_gradients = False
        self._hooks: dict[str, list[Any]] = {}
        self._resume_rng: dict[str, Any] | None = None  # RNG states to restore when training resumes
        self._resume_train_metrics: dict[str, Any] | None = None
        self._train_skippable = None
        self.datamodule: DataModule | None = None
        self.train_dataloader: DataLoader | None = None
        self.val_dataloaders: DataLoader | None = None
        self.test_dataloaders: DataLoader | None = None
        self.predict_dataloaders: DataLoader | None = None
        self.num_training_batches: int | float = 0
        self.num_val_batches: int | float = 0
        self.num_test_batches: int | float = 0
        self.num_predict_batches: int | float = 0

    # ================================================================== entry points
    def fit(
        self,
        model: TrainingModule,
        train_dataloaders: DataLoader | None = None,
        val_dataloaders: DataLoader | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | os.PathLike | None = None,
    ) -> None:
        """Train ``model``. ``ckpt_path`` (a file, or ``"last"``) resumes exactly where a checkpoint stopped."""
        self._launch("fit", model, train_dataloaders, val_dataloaders, datamodule, ckpt_path)

    def validate(
        self,
        model: TrainingModule,
        dataloaders: DataLoader | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | os.PathLike | None = None,
    ) -> list[dict[str, float]]:
        """One pass over the validation data; returns ``[{metric: value}]``."""
        return self._launch("validate", model, None, dataloaders, datamodule, ckpt_path)

    def test(
        self,
        model: TrainingModule,
        dataloaders: DataLoader | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | os.PathLike | None = None,
    ) -> list[dict[str, float]]:
        """One pass over the test data; returns ``[{metric: value}]``."""
        return self._launch("test", model, None, dataloaders, datamodule, ckpt_path)

    def predict(
        self,
        model: TrainingModule,
        dataloaders: DataLoader | None = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | os.PathLike | None = None,
    ) -> list[Any]:
        """Run ``predict_step`` over the data; returns one output per batch, in dataset order."""
        return self._launch("predict", model, None, dataloaders, datamodule, ckpt_path)

    def _launch(self, fn: str, *args: Any) -> Any:
        if not isinstance(args[0], TrainingModule):
            raise TandemUserCodeError(
                f"Trainer.{fn} expects a tandem.TrainingModule, got {type(args[0]).__name__}. "
                "Subclass tandem.TrainingModule instead of torch.nn.Module."
            )
        launcher = self.strategy.launcher
        if launcher is None:
            return self._run_stage(fn, *args)
        return launcher.launch(self._run_stage, fn, *args, trainer=self)

    def _run_stage(
        self, fn: str, model: TrainingModule, train: Any, evaluation: Any, datamodule: Any, ckpt_path: Any
    ) -> Any:
        """Runs in every process: set up, restore, loop, tear down."""
        self.state.fn, self.should_stop = fn, False
        try:
            self._setup(fn, model, train, evaluation, datamodule)
            if ckpt_path is not None:
                self._restore(ckpt_path, fn)
            if fn == "fit":
                self._call("on_fit_start")
                loops.run_fit(self)
                self._call("on_fit_end")
                result = None
            else:
                result = loops.run_evaluation(self, fn)
                result = result if fn == "predict" else [result]
        except BaseException as exception:
            self._call("on_exception", exception)
            status = "interrupted" if isinstance(exception, KeyboardInterrupt) else "failed"
            self._finish(fn, status)
            raise
        self._finish(fn, "success")
        return result

    def init_module(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager:
        """Build the module where the strategy wants its tensors: directly on the device (in float64 under
        "64-true"), or, with ``strategy="fsdp"`` and ``empty_init=True``, without memory (meta parameters)
        so that each rank materialises only its shard.

        Args:
            empty_init: True to skip allocating (and initialising) the parameters now; FSDP then calls each
                submodule's ``reset_parameters()`` on this rank's shard. Other strategies build as for None.

        Example::

            trainer = Trainer(strategy="fsdp", devices=4)
            with trainer.init_module(empty_init=True):
                model = LargeModel()
        """
        return self.strategy.tensor_init_context(empty_init)

    # ================================================================== set-up
    def _setup(self, fn: str, model: TrainingModule, train: Any, evaluation: Any, datamodule: Any) -> None:
        if datamodule is not None and (train is not None or evaluation is not None):
            raise TandemConfigError(f"Trainer.{fn} got both dataloaders and a datamodule; pass one of them.")
        if self.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
        self.strategy.setup_environment()
        model._trainer = self
        self.datamodule = datamodule
        if datamodule is not None:
            datamodule.trainer = self
            if self.strategy.local_rank == 0:
                datamodule.prepare_data()  # once per node; the other ranks wait at the barrier
            self.strategy.barrier("prepare_data")
            datamodule.setup(fn)
        with self.strategy.tensor_init_context():
            model.configure_model()  # layers built (and sharded) late, on the device, once the processes exist
        self.strategy.setup(model)
        for logger in self.loggers:  # every rank agrees on the run folder
            logger.version = self.strategy.broadcast(logger.version)
        self._setup_data(fn, model, train, evaluation, datamodule)
        if fn == "fit":
            self._optimizer, self._lr_scheduler_configs = parse_optimizers(model.configure_optimizers())
            (self._optimizer,) = self.strategy.setup_optimizers([self._optimizer])
        self._hooks = _collect_hooks(model, self.callbacks)
        self._has_gradients = False
        for callback in self.callbacks:
            callback.setup(self, model, fn)
        if fn == "fit":
            for logger in self.loggers:
                logger.log_hyperparams(dict(model.hparams))

    def _setup_data(self, fn: str, model: TrainingModule, train: Any, evaluation: Any, datamodule: Any) -> None:
        def from_datamodule(name: str) -> Any:
            return getattr(datamodule, name)() if datamodule is not None else None

        config, strategy = self._config, self.strategy
        if fn == "fit":
            loader = train if train is not None else from_datamodule("train_dataloader")
            if loader is None:
                raise TandemConfigError(
                    "Trainer.fit needs training data: pass train_dataloaders=DataLoader(...), or a datamodule whose "
                    "train_dataloader() returns one."
                )
            loader = strategy.process_dataloader(_check_loader(loader, "train_dataloaders"), "fit")
            self.train_dataloader, self._train_skippable = make_skippable(loader)
            self.num_training_batches = limit_batches(
                "limit_train_batches", config.limit_train_batches, len(loader) if has_len(loader) else math.inf
            )
            if self.num_training_batches == 0:
                rank_zero_warn("No training batches (limit_train_batches or an empty dataloader): fit trains nothing.")
        stage = EVAL_STAGES["validate" if fn == "fit" else fn]
        loader = evaluation if evaluation is not None else from_datamodule(stage.datamodule_hook)
        if loader is None and fn != "fit":
            raise TandemConfigError(
                f"Trainer.{fn} needs data: pass dataloaders=DataLoader(...), or a datamodule whose "
                f"{stage.datamodule_hook}() returns one."
            )
        unimplemented = getattr(type(model), stage.step) is getattr(TrainingModule, stage.step)
        if loader is not None and stage.name != "predict" and unimplemented:
            if fn != "fit":
                raise TandemUserCodeError(f"Trainer.{fn} needs {type(model).__name__}.{stage.step} to be defined.")
            rank_zero_warn(f"{type(model).__name__} defines no validation_step: validation data is ignored.")
            loader = None
        count = 0
        if loader is not None:
            loader = strategy.process_dataloader(
                _check_loader(loader, "dataloaders"), "validate" if fn == "fit" else fn
            )
            available = len(loader) if has_len(loader) else math.inf
            count = limit_batches(stage.limit_attr, getattr(config, stage.limit_attr), available)
        setattr(self, stage.loaders_attr, loader)
        setattr(self, stage.count_attr, count)

    def _finish(self, fn: str, status: str) -> None:
        for callback in self.callbacks:
            callback.teardown(self, self.strategy.module, fn)
        for logger in self.loggers:
            logger.finalize(status)
        if self.datamodule is not None:
            self.datamodule.teardown(fn)
        self.strategy.teardown()
        self.state.stage = None

    # ================================================================== hooks
    def _call(self, hook: str, *args: Any) -> None:
        """Run ``hook`` on the module, then on each callback in the user's order."""
        fns = self._hooks.get(hook)
        if fns:
            self._metrics.hook = hook
            for fn in fns:
                fn(*args)

    def _step_schedulers(self, interval: str) -> None:
        count = self.global_step if interval == "step" else self.current_epoch + 1
        for config in self._lr_scheduler_configs:
            if config.interval != interval or count % config.frequency:
                continue
            if config.monitor is None:
                config.scheduler.step()
                continue
            value = self.callback_metrics.get(config.monitor)
            if value is None:
                if config.strict:
                    raise missing_metric("The lr_scheduler config", config.monitor, self.callback_metrics)
                rank_zero_warn(f"lr_scheduler monitor {config.monitor!r} was not logged; the scheduler did not step.")
                continue
            config.scheduler.step(self.strategy.broadcast(float(value)))  # rank 0's value: equal LRs

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Send ``metrics`` (name -> number or scalar tensor) to every logger, on global rank 0.

        The one way values reach the loggers: the loops call it with ``self.log`` values, callbacks with
        theirs (e.g. learning rates). Needs no other process (it is not a collective). ``step``
        defaults to ``global_step``; the values also appear in ``logged_metrics``.
        """
        if not metrics:
            return
        values = to_float(dict(metrics))
        self._metrics.logged_metrics.update(values)
        if step is None:  # as Lightning: every row says its epoch (metrics.csv gets an epoch column)
            values.setdefault("epoch", self.current_epoch)
        if self.loggers and self.is_global_zero:
            for logger in self.loggers:
                logger.log_metrics(values, step=self.global_step if step is None else step)

    # ================================================================== checkpoints
    def save_checkpoint(self, filepath: str | os.PathLike, weights_only: bool = False) -> None:
        """Write a checkpoint. Every rank must call this (it builds the state on each); rank 0 writes it
        atomically; all ranks meet at a barrier after."""
        self.strategy.save_checkpoint(to_weights_only(self._checkpoint_state(weights_only)), filepath)

    def _checkpoint_state(self, weights_only: bool = False) -> dict[str, Any]:
        from tandem import __version__

        module = self.strategy.module
        checkpoint: dict[str, Any] = {
            CHECKPOINT_MARKER: __version__,
            "epoch": self.current_epoch,
            "global_step": self.global_step,
            "state_dict": self.strategy.module_state_dict(),
            "hparams": dict(module.hparams),
        }
        if not weights_only:
            checkpoint.update(
                loops=self._progress.state_dict(),
                train_metrics=self._metrics.state_dict(),
                optimizer_states=[self.strategy.optimizer_state(o) for o in self.optimizers],
                lr_schedulers=[c.scheduler.state_dict() for c in self._lr_scheduler_configs],
                precision=self.strategy.precision.state_dict(),
                callbacks={c.state_key: c.state_dict() for c in self.callbacks},
                rng_states=capture_rng_state(),
            )
            if self.datamodule is not None:
                checkpoint["datamodule"] = self.datamodule.state_dict()
        self._call("on_save_checkpoint", checkpoint)
        return checkpoint

    def _restore(self, ckpt_path: str | os.PathLike, fn: str) -> None:
        path = self._resolve_ckpt_path(ckpt_path)
        if path is None:
            return
        checkpoint = self.strategy.load_checkpoint(path)
        module = self.strategy.module
        try:
            self.strategy.load_module_state_dict(checkpoint["state_dict"])
        except RuntimeError as err:
            raise TandemUserCodeError(f"Checkpoint {str(path)!r} does not fit {type(module).__name__}: {err}") from None
        self._call("on_load_checkpoint", checkpoint)
        if fn != "fit":
            return
        if "loops" not in checkpoint:
            raise TandemConfigError(
                f"Checkpoint {str(path)!r} holds weights only (saved with weights_only=True), so training cannot "
                "resume from it. Load the weights with model.load_state_dict(torch.load(path)['state_dict'])."
            )
        self._progress.load_state_dict(checkpoint["loops"])
        if self._progress.batches_done:  # mid-epoch: the epoch's partial metric sums come back too
            self._resume_train_metrics = checkpoint.get("train_metrics")
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
            self.strategy.load_optimizer_state(optimizer, state)
        for config, state in zip(self._lr_scheduler_configs, checkpoint["lr_schedulers"]):
            config.scheduler.load_state_dict(state)
        self.strategy.precision.load_state_dict(checkpoint.get("precision", {}))
        saved = checkpoint.get("callbacks", {})
        for callback in self.callbacks:
            if callback.state_key in saved:
                callback.load_state_dict(saved[callback.state_key])
        if self.datamodule is not None and "datamodule" in checkpoint:
            self.datamodule.load_state_dict(checkpoint["datamodule"])
        self._resume_rng = checkpoint.get("rng_states")

    def _resolve_ckpt_path(self, ckpt_path: str | os.PathLike) -> str | None:
        """The file to load. "best" is the same on every rank (checkpoint decisions are rank 0's);
        "last" is searched for on rank 0 and broadcast, so every rank loads the same file."""
        if ckpt_path == "best":
            callback = self.checkpoint_callback
            if callback is None or not callback.best_model_path:
                raise TandemConfigError(
                    "ckpt_path='best' needs a ModelCheckpoint(monitor=...) that has saved a checkpoint."
                )
            return callback.best_model_path
        if ckpt_path == "last":
            return self.strategy.broadcast(self._find_last_checkpoint() if self.is_global_zero else None)
        return os.fspath(ckpt_path)

    def _find_last_checkpoint(self) -> str | None:
        candidates = []
        for callback in self.checkpoint_callbacks:
            if callback.dirpath:
                candidates += glob.glob(os.path.join(callback.dirpath, "last*.ckpt"))
        # The run folder's version changes with each launch; "last" means the newest last.ckpt of any version.
        roots = [os.path.join(lg.save_dir, lg.name) for lg in self.loggers] or [self.default_root_dir]
        for root in roots:
            candidates += glob.glob(os.path.join(root, "*", "checkpoints", "last*.ckpt"))
            candidates += glob.glob(os.path.join(root, "checkpoints", "last*.ckpt"))
        candidates = sorted(set(candidates), key=os.path.getmtime)
        if not candidates:
            rank_zero_warn("ckpt_path='last' found no last.ckpt yet; training starts from scratch.")
            return None
        return candidates[-1]

    # ================================================================== public state
    @property
    def current_epoch(self) -> int:
        return self._progress.epoch

    @property
    def global_step(self) -> int:
        return self._progress.global_step

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        return self._metrics.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, float]:
        return self._metrics.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, torch.Tensor]:
        return self._metrics.progress_bar_metrics

    @property
    def training_module(self) -> TrainingModule | None:
        """The user's module (Lightning: ``lightning_module``)."""
        return self.strategy.module

    lightning_module = training_module

    @property
    def model(self) -> torch.nn.Module | None:
        """The module as the steps run it (possibly wrapped by DDP or DataParallel)."""
        return self.strategy.model

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self._optimizer] if self._optimizer is not None else []

    @property
    def lr_scheduler_configs(self) -> list[LRSchedulerConfig]:
        return list(self._lr_scheduler_configs)

    @property
    def logger(self) -> Any:
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        return self.loggers[0].log_dir if self.loggers else self.default_root_dir

    @property
    def checkpoint_callbacks(self) -> list[Any]:
        from tandem.callbacks.model_checkpoint import ModelCheckpoint

        return [c for c in self.callbacks if isinstance(c, ModelCheckpoint)]

    @property
    def checkpoint_callback(self) -> Any:
        callbacks = self.checkpoint_callbacks
        return callbacks[0] if callbacks else None

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
    def is_global_zero(self) -> bool:
        return self.strategy.is_global_zero

    @property
    def max_epochs(self) -> int:
        return self._config.max_epochs

    @property
    def max_steps(self) -> int:
        return self._config.max_steps

    @property
    def accumulate_grad_batches(self) -> int:
        return self._config.accumulate_grad_batches

    @property
    def log_every_n_steps(self) -> int:
        return self._config.log_every_n_steps

    @property
    def fast_dev_run(self) -> int:
        return self._config.fast_dev_run

    @property
    def precision(self) -> str:
        return self.strategy.precision.precision

    @property
    def num_sanity_val_steps(self) -> int | float:
        """Validation batches the sanity check runs (0 when there is no validation data)."""
        steps = self._config.num_sanity_val_steps
        return self.num_val_batches if steps == -1 else min(steps, self.num_val_batches)

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
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps the fit will take (for schedulers such as OneCycleLR)."""
        per_epoch = math.ceil(self.num_training_batches / self.accumulate_grad_batches)
        total = per_epoch * self._config.epoch_limit
        return min(total, self.max_steps) if self.max_steps != -1 else total


# ====================================================================== construction helpers
def _build_loggers(logger: Any, root: str) -> list[Any]:
    from tandem.loggers.logger import Logger

    if logger is True:
        from tandem.loggers.tensorboard import TensorBoardLogger

        return [TensorBoardLogger(save_dir=root)]
    if logger is False or logger is None:
        return []
    loggers = list(logger) if isinstance(logger, (list, tuple)) else [logger]
    for item in loggers:
        if not isinstance(item, Logger):
            raise TandemConfigError(
                f"logger={item!r} is not a tandem Logger; pass True, False, a TensorBoardLogger / CSVLogger, or a list."
            )
    return loggers


def _build_callbacks(callbacks: Any, checkpointing: bool, progress_bar: bool, model_summary: bool) -> list[Callback]:
    if callbacks is None:
        callbacks = []
    elif isinstance(callbacks, Callback):
        callbacks = [callbacks]
    callbacks = list(callbacks)
    for callback in callbacks:
        if not isinstance(callback, Callback):
            raise TandemConfigError(f"callbacks must be tandem.Callback instances; got {type(callback).__name__}.")
    if checkpointing:
        from tandem.callbacks.model_checkpoint import ModelCheckpoint

        if not any(isinstance(c, ModelCheckpoint) for c in callbacks):
            callbacks.append(ModelCheckpoint(save_last=True, save_top_k=0))
    if progress_bar:
        from tandem.callbacks.progress_bar import ProgressBar

        if not any(isinstance(c, ProgressBar) for c in callbacks):
            callbacks.append(ProgressBar())
    if model_summary:
        from tandem.callbacks.model_summary import ModelSummary

        if not any(isinstance(c, ModelSummary) for c in callbacks):
            callbacks.insert(0, ModelSummary())
    keys = [c.state_key for c in callbacks]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise TandemConfigError(
            f"Two callbacks share the checkpoint state key {duplicates[0]!r}; give them different settings."
        )
    return callbacks


def _check_loader(loader: Any, name: str) -> Any:
    if isinstance(loader, (list, tuple)):
        if len(loader) != 1:
            raise TandemConfigError(f"{name} got {len(loader)} dataloaders; tandem takes one per stage.")
        loader = loader[0]
    if not isinstance(loader, Iterable):
        raise TandemConfigError(
            f"{name} must be a DataLoader (or an iterable of batches); got {type(loader).__name__}."
        )
    return loader


def _collect_hooks(module: TrainingModule, callbacks: list[Callback]) -> dict[str, list[Any]]:
    """For each hook, the bound methods that do something: overridden on the module, then each callback."""
    hooks: dict[str, list[Any]] = {}
    names = {n for n in dir(Callback) if n.startswith("on_")}
    for name in names:
        fns = []
        if getattr(type(module), name, None) is not getattr(TrainingModule, name, None) and hasattr(module, name):
            fns.append(getattr(module, name))
        for callback in callbacks:
            if getattr(type(callback), name) is not getattr(Callback, name):
                fns.append(_bind_callback(getattr(callback, name), module))
        hooks[name] = fns
    return hooks


def _bind_callback(method: Any, module: TrainingModule) -> Any:
    trainer = module._trainer

    def call(*args: Any) -> None:
        method(trainer, module, *args)

    return call
