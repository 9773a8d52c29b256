"""The Trainer: entry points (fit, validate, test, predict), set-up, hooks, checkpoints, public state."""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import sys
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch

from tandem.callbacks.callback import Callback, Checkpoint
from tandem.module import DataModule, TrainingModule, calls_hook
from tandem.profilers import Profiler
from tandem.strategies.registry import resolve_strategy
from tandem.strategies.side_channel import entry_point
from tandem.strategies.strategy import Strategy
from tandem.trainer import checkpointing, data, optim, preemption
from tandem.trainer.config import (
    BAREBONES,
    OPT_OUT_DEFAULTS,
    TrainerConfig,
    check_barebones,
    check_unknown_arguments,
    limit_notes,
)
from tandem.trainer.evaluation import EvaluationLoop, format_results
from tandem.trainer.hooks import HookDispatcher
from tandem.trainer.logging import BarebonesLog, CompiledStepLog, LogSink, MetricCollector
from tandem.trainer.loops import FitLoop, LoopContext
from tandem.trainer.nonfinite import NonFiniteGuard, check_reaction, nonfinite_parameters
from tandem.trainer.optim import LRSchedulerConfig
from tandem.trainer.optimization import configure_optimization
from tandem.trainer.profiling import active, resolve_profiler, timed_transfer
from tandem.trainer.rollback import Rollback, RollbackRecord
from tandem.trainer.state import LoopState, TrainerFn, TrainerState, TrainerStatus
from tandem.trainer.trial import Trial, TrialParts, open_trial
from tandem.utilities.checkpoint_format import to_plain
from tandem.utilities.compile import Compiler, unwrap_compiled
from tandem.utilities.exceptions import (
    HparamsMergeError,
    Preempted,
    TandemConfigError,
    TandemUserCodeError,
    TunerExit,
    add_note,
    incompatible,
    note_unpacked_mapping,
)
from tandem.utilities.logged_values import to_float
from tandem.utilities.memory import free_cuda_memory
from tandem.utilities.rank_zero import rank_zero_info, rank_zero_print, rank_zero_warn

if TYPE_CHECKING:
    from tandem.callbacks.early_stopping import EarlyStopping
    from tandem.callbacks.model_checkpoint import ModelCheckpoint
    from tandem.callbacks.progress_bar import ProgressBar
    from tandem.loggers.logger import Logger


class Trainer:
    """Runs the loop; the strategy decides where and on how many processes.

    Args:
        accelerator: ``"auto"`` (CUDA if available), ``"cpu"``, ``"cuda"`` or ``"gpu"``.
        devices: ``"auto"``, a count (``-1`` for all), or a list of CUDA indices.
        strategy: ``"auto"``, a registered name (``"single_device"``, ``"ddp"``, ``"ddp_spawn"``, ``"ddp_notebook"``, ``"fsdp"``,
            ``"dp"``, ...) or a [`Strategy`][tandem.strategies.Strategy] instance.
        num_nodes: machines in a multi-node DDP job.
        precision: ``"32-true"``, ``"64-true"``, ``"bf16-mixed"`` or ``"16-mixed"`` (autocast), or ``"bf16-true"``
            or ``"16-true"`` (parameters and inputs in 16 bits; build the module with ``trainer.init_module()``
            to create it in that dtype).
        plugins: one plugin or a list, at most one of each kind: a [`Precision`][tandem.strategies.Precision] (instead
            of ``precision=``), a cluster environment from ``tandem.strategies.environments`` (e.g.
            ``SLURMEnvironment(auto_requeue=False)``: no ``scontrol requeue`` after a SIGUSR1 stop), or
            [`TorchSyncBatchNorm`][tandem.strategies.TorchSyncBatchNorm] (``sync_batchnorm=True``).
        max_epochs: stop after this many epochs (default 1000 when neither ``max_steps`` nor ``max_time`` is
            set; -1: no limit).
        min_epochs: train at least this many epochs, even when ``should_stop`` is set (e.g. early stopping).
        max_steps: stop after this many optimizer steps (-1: no limit).
        max_time: stop after this much training time: ``"DD:HH:MM:SS"``, a ``datetime.timedelta`` or a dict such
            as ``{"hours": 12}`` (a [`Timer`][tandem.callbacks.Timer] checked after every batch). With several
            processes every rank stops at the same step: the next publishing step (``log_every_n_steps``).
        min_steps: take at least this many optimizer steps before ``should_stop`` may end the fit.
        limit_train_batches / limit_val_batches / limit_test_batches / limit_predict_batches: an int
            number of batches or a fraction of each epoch (per loader); None (Lightning's default) is 1.0, all.
        val_check_interval: validate every this fraction of an epoch (float) or number of batches (int); None
            (Lightning's default) is 1.0, once an epoch. Or a duration (``"DD:HH:MM:SS"``, a
            ``datetime.timedelta`` or a dict such as ``{"minutes": 30}``): validate after a training batch once
            that much time has passed since the last validation (or since training started), in the epochs
            ``check_val_every_n_epoch`` allows; an epoch's end then validates only when the time has come.
        check_val_every_n_epoch: validate every n epochs (None: ``val_check_interval``, an int or a duration,
            counts across epochs).
        num_sanity_val_steps: validation batches (per loader) run before training to catch bugs early (-1: all;
            default 2). The check draws no randomness from the training run (it runs under ``isolate_rng``).
        accumulate_grad_batches: step the optimizer every k batches (gradients of k batches averaged);
            ``trainer.accumulate_grad_batches`` may be changed between batches (a callback at epoch start).
        gradient_clip_val: clip gradients at this value (None: no clipping).
        gradient_clip_algorithm: ``"norm"`` (total norm, the default) or ``"value"`` (elementwise).
        callbacks: callbacks, run in the order given.
        logger: True (TensorBoard, the default), False, a Logger or a list of loggers.
        default_root_dir: where logs and checkpoints go (default: the working directory).
        enable_checkpointing: add Lightning's default ``ModelCheckpoint()`` when none is given (default): it keeps
            the latest epoch's ``epoch=N-step=M.ckpt``, which ``checkpoint_callback.best_model_path`` names.
            ``False`` with a ModelCheckpoint in ``callbacks`` is an error.
        enable_progress_bar: show a tqdm progress bar (rank zero only; default).
        enable_model_summary: print parameter counts at fit start (rank zero only; default).
        log_every_n_steps: send step metrics to the loggers every n optimizer steps (default 50; 0: never).
        deterministic: make torch use deterministic algorithms.
        benchmark: set ``torch.backends.cudnn.benchmark`` (None: leave it as it is).
        inference_mode: accepted for Lightning programs; tandem evaluates under ``torch.no_grad()`` either way.
        detect_anomaly: run fits under ``torch.autograd.detect_anomaly()`` (slow; finds NaN sources).
        on_replica_divergence: what DDP replicas found different (at an epoch's end, before a save) do: ``"raise"``
            (default) stops every rank with a ``ReplicasDivergedError`` naming the first tensor and the likely
            causes; ``"warn"`` warns and trains on, and checkpoints hold rank 0's values (what Lightning does,
            silently). For programs tandem cannot keep in step, e.g. meta-learning inner loops on per-rank copies.
        on_nonfinite: what a NaN or inf loss or parameter does: ``"raise"`` stops every rank with a
            ``NonFiniteError`` naming the step and what to try; ``"warn"`` warns and trains on; ``"rollback"`` (or
            ``Rollback(...)``, which can also roll back loss spikes) keeps a copy of the training state at clean
            logging steps and, after a batch with a NaN or inf loss on any rank, puts it back on every rank and
            replays without that batch (``trainer.rollbacks`` lists them). No checkpoint of non-finite parameters
            is ever written (under ``"warn"`` and ``"rollback"`` that save is skipped). Checked where values are
            read anyway: at logging steps (the loss; under ``"rollback"`` every batch's, recorded on the device),
            epoch ends and checkpoint saves (the parameters).
        sync_batchnorm: turn BatchNorm layers into SyncBatchNorm (strategies that run several processes).
        use_distributed_sampler: let a distributed strategy replace the samplers to shard the data
            (False: shard it yourself).
        data_order: how the training data is ordered. ``"sampler"`` (default): as Lightning orders it, so a
            ported program gives Lightning's numbers: one process draws what the loader's sampler draws, several
            processes share Lightning's DistributedSampler (shuffling the training data, seeded with the
            ``seed_everything`` seed plus the epoch). ``"global"``: one order whatever the number of processes
            (one process draws the order N processes share; shuffled only if the loader shuffles), so 1 and N
            processes train alike. Either way a run keeps its order when resumed, on any number of processes.
        fast_dev_run: run 1 (or n) batches of training, validation and test, without checkpoints and with a
            ``DummyLogger`` in place of the loggers (``self.logger.experiment`` takes any call and writes
            nothing), to smoke-test a module.
        overfit_batches: train and validate on the first n batches (an int) or fraction of the training data, in
            order (a shuffling loader is made sequential, with a warning): a module that cannot drive the loss of
            a few batches to zero has a bug.
        reload_dataloaders_every_n_epochs: call ``train_dataloader()`` / ``val_dataloader()`` again every n
            epochs (0: build them once per run).
        profiler: time every hook, step and loop phase and report at the end of each run (on rank 0, or
            per rank into ``<dirpath>/<stage>-<filename>[-<rank>].txt`` when the profiler has a ``filename``):
            ``"simple"`` (durations), ``"advanced"`` (cProfile per action), ``"pytorch"`` (``torch.profiler``
            operator tables and TensorBoard traces) or a [`Profiler`][tandem.profilers.Profiler] instance. None: no
            profiling (a ``PassThroughProfiler``), at no cost to the loops.
        barebones: measure tandem's own overhead: no logger, checkpoints, progress bar, model summary, sanity
            check or step logging (``self.log`` warns and does nothing); asking for one of them as well is an
            error.

    Lightning 1.x arguments (``gpus=``, ``resume_from_checkpoint=``, ...) raise an error naming the
    argument to use instead.

    Example:
        ```python
        trainer = Trainer(max_epochs=5, strategy="ddp", devices=2)
        trainer.fit(model, train_loader, val_loader)
        trainer.test(model, test_loader)
        ```
    """

    #: ``inspect.signature(Trainer)``: ``__init__``'s, not ``__new__``'s (set below, and for each subclass)
    __signature__: ClassVar[inspect.Signature]

    def __new__(cls, *args: Any, **kwargs: Any) -> Trainer:
        # Names __init__ does not take (a Lightning 1.x argument, a typo) get an error naming the fix
        # instead of Python's TypeError; __init__ keeps its exact signature (tools read it).
        kind: type = cls
        known = _init_arguments(kind)
        if known is not None:
            unknown = {k: v for k, v in kwargs.items() if k not in known}
            if unknown:
                check_unknown_arguments(unknown, sorted(known))
        return super().__new__(cls)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        kind: type = cls
        cls.__signature__ = _init_signature(kind)  # inspect.signature(cls) is __init__'s, not __new__'s

    def __init__(
        self,
        *,
        accelerator: str = "auto",
        devices: int | str | list[int] = "auto",
        strategy: str | Strategy = "auto",
        num_nodes: int = 1,
        precision: str | int = "32-true",
        plugins: Any = None,
        max_epochs: int | None = None,
        min_epochs: int | None = None,
        max_steps: int = -1,
        min_steps: int | None = None,
        max_time: str | timedelta | dict[str, int] | None = None,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        val_check_interval: int | float | str | timedelta | dict[str, int] | None = None,
        check_val_every_n_epoch: int | None = 1,
        num_sanity_val_steps: int | None = None,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
        callbacks: Callback | Iterable[Callback] | None = None,
        logger: Logger | Sequence[Logger] | bool | None = None,
        default_root_dir: str | os.PathLike | None = None,
        enable_checkpointing: bool | None = None,
        enable_progress_bar: bool | None = None,
        enable_model_summary: bool | None = None,
        log_every_n_steps: int | None = None,
        deterministic: bool = False,
        benchmark: bool | None = None,
        inference_mode: bool = True,
        detect_anomaly: bool = False,
        on_nonfinite: str | Rollback = "raise",
        on_replica_divergence: str = "raise",
        sync_batchnorm: bool = False,
        fast_dev_run: bool | int = False,
        use_distributed_sampler: bool = True,
        data_order: str = "sampler",
        overfit_batches: int | float = 0.0,
        reload_dataloaders_every_n_epochs: int = 0,
        profiler: Profiler | str | None = None,
        barebones: bool = False,
    ) -> None:
        # Lightning's opt-outs: None is the default (on), which barebones turns off; asked for with it, an error
        chosen: dict[str, Any] = dict(
            logger=logger,
            enable_checkpointing=enable_checkpointing,
            enable_progress_bar=enable_progress_bar,
            enable_model_summary=enable_model_summary,
            log_every_n_steps=log_every_n_steps,
            num_sanity_val_steps=num_sanity_val_steps,
        )
        if barebones:
            check_barebones(
                {**chosen, "fast_dev_run": fast_dev_run, "detect_anomaly": detect_anomaly, "profiler": profiler}
            )
        defaults = BAREBONES if barebones else OPT_OUT_DEFAULTS
        chosen = {name: defaults[name] if value is None else value for name, value in chosen.items()}
        logger, enable_checkpointing = chosen["logger"], chosen["enable_checkpointing"]
        enable_progress_bar, enable_model_summary = chosen["enable_progress_bar"], chosen["enable_model_summary"]
        log_every_n_steps, num_sanity_val_steps = chosen["log_every_n_steps"], chosen["num_sanity_val_steps"]
        self.barebones = barebones
        self._config = TrainerConfig(
            max_epochs=max_epochs,
            max_steps=max_steps,
            min_epochs=min_epochs,
            min_steps=min_steps,
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
            max_time=max_time,
            overfit_batches=overfit_batches,
            reload_dataloaders_every_n_epochs=reload_dataloaders_every_n_epochs,
            on_replica_divergence=on_replica_divergence,
        )
        given = dict(
            limit_train_batches=limit_train_batches,
            limit_val_batches=limit_val_batches,
            limit_test_batches=limit_test_batches,
            limit_predict_batches=limit_predict_batches,
            val_check_interval=val_check_interval,
            overfit_batches=overfit_batches,
        )
        for note in limit_notes(given, fast_dev_run):  # an int 1 and a float 1.0 mean different things: say which
            rank_zero_info(note)
        if check_reaction(on_nonfinite) == "rollback" and log_every_n_steps == 0:
            raise incompatible(
                f"on_nonfinite={on_nonfinite!r} with log_every_n_steps=0",
                "a rollback checks the losses at the logging steps, and there are none",
                "Set log_every_n_steps to how often to check (e.g. 50), or use on_nonfinite='raise'",
            )
        #: times the run's hooks, steps and loop phases (a ``PassThroughProfiler`` records nothing)
        self.profiler: Profiler = resolve_profiler(profiler)
        self.strategy: Strategy = resolve_strategy(
            strategy,
            accelerator,
            devices,
            num_nodes,
            precision,
            use_distributed_sampler=use_distributed_sampler,
            data_order=data_order,
            sync_batchnorm=sync_batchnorm,
            plugins=plugins,
        )
        self.default_root_dir: str = os.fspath(default_root_dir) if default_root_dir is not None else os.getcwd()
        self.deterministic = deterministic
        self.benchmark = benchmark
        self.inference_mode = inference_mode
        self.detect_anomaly = detect_anomaly
        loggers = _build_loggers(logger, self.default_root_dir)
        if self.fast_dev_run and loggers:  # as Lightning: self.logger stays usable, nothing is written
            from tandem.loggers.logger import DummyLogger

            loggers = [DummyLogger()]
        self.callbacks: list[Callback] = _build_callbacks(
            callbacks, enable_checkpointing, bool(self.fast_dev_run), enable_progress_bar, enable_model_summary
        )
        _add_timer(self.callbacks, max_time)
        self.state = TrainerState()
        self.datamodule: DataModule | None = None
        # The rooms: the loops own their state and see the Trainer only through this context.
        loop_state = LoopState()
        self._hooks = HookDispatcher(self.state)
        self._metrics = MetricCollector(self.strategy, self.state)
        self._collector: MetricCollector | BarebonesLog = BarebonesLog() if barebones else self._metrics
        #: what ``self.log`` writes into (the module's ``log`` calls its ``log``)
        self.metric_collector: MetricCollector | BarebonesLog | CompiledStepLog = self._collector
        self._sink = LogSink(loggers, self._metrics, self.strategy, loop_state)
        self._nonfinite = NonFiniteGuard(on_nonfinite, self.strategy, self._config)
        context = LoopContext(
            self.strategy, self._hooks, self._metrics, self._config, self.state, self._sink, self._nonfinite
        )
        self._evaluation = EvaluationLoop(context, loop_state)
        self.fit_loop = FitLoop(context, self._evaluation, _preemption_stop(self), loop_state)
        # the module of the latest run, as given (torch.compile'd or not), for validate() without a model
        self._module: TrainingModule | torch.nn.Module | None = None
        self._ckpt_path: str | None = None
        self._left_out: set[tuple[str, str]] = set()  # hyperparameters left out of checkpoints, warned once
        # what the latest fit's loaders were built from (train, evaluation, datamodule): a trial builds them again
        self._fit_sources: tuple[Any, Any, Any] | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:  # a ddp_spawn rank's copy: its loop stops this copy
        self.__dict__.update(state)
        self.fit_loop.bind_preemption_stop(_preemption_stop(self))

    # ================================================================== entry points
    def fit(
        self,
        model: TrainingModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | os.PathLike | None = None,
        weights_only: bool | None = None,
    ) -> None:
        """Train ``model``.

        Args:
            model: the module to train, or ``torch.compile(module)``: the module is what runs (hooks, ``self.log``
                and checkpoints see it, with no ``_orig_mod.`` prefix), and its steps run compiled with the same
                settings, around the strategy's wrapper (as for ``validate`` / ``test`` / ``predict``).
            train_dataloaders: a DataLoader, or a DataModule (as ``fit(model, dm)``); without data, the
                module's ``train_dataloader()`` / ``val_dataloader()`` are used.
            val_dataloaders: one loader, a list or a dict of loaders.
            datamodule: a DataModule giving the loaders.
            ckpt_path: a checkpoint file to resume from exactly, or ``'last'`` (the newest ``last.ckpt`` of this
                run's folders).
            weights_only: ``False`` says the checkpoint file is trusted: it is unpickled in full, which can run
                any code it holds (needed only for files written by other programs or earlier tandem versions).
                ``None`` (default) or ``True``: it is read as tensors and plain data only, as tandem writes it.
        """
        if data.is_datamodule(train_dataloaders):
            datamodule, train_dataloaders = train_dataloaders, None
        self._launch(
            "fit",
            model,
            train_dataloaders=train_dataloaders,
            eval_dataloaders=val_dataloaders,
            datamodule=datamodule,
            ckpt_path=ckpt_path,
            weights_only=weights_only,
        )

    def validate(
        self,
        model: TrainingModule | None = None,
        dataloaders: Any = None,
        ckpt_path: str | os.PathLike | None = None,
        verbose: bool = True,
        datamodule: DataModule | None = None,
        weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """One pass over the validation data; returns ``[{metric: value}]``, one dict per loader.

        Args:
            model: the module; None: the module of the previous run (its best checkpoint when a monitored
                ``ModelCheckpoint`` saved one).
            dataloaders: one loader, a list or a dict of loaders, or a DataModule.
            ckpt_path: weights to load first: a file, ``"best"`` or ``"last"``.
            verbose: print the results table (rank 0).
            datamodule: a DataModule giving the loaders.
            weights_only: ``False`` says the checkpoint file is trusted: it is unpickled in full, which can run
                any code it holds (needed only for files written by other programs or earlier tandem versions).
                ``None`` (default) or ``True``: it is read as tensors and plain data only, as tandem writes it.
        """
        return self._evaluate("validate", model, dataloaders, ckpt_path, verbose, datamodule, weights_only)

    def test(
        self,
        model: TrainingModule | None = None,
        dataloaders: Any = None,
        ckpt_path: str | os.PathLike | None = None,
        verbose: bool = True,
        datamodule: DataModule | None = None,
        weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """One pass over the test data; returns ``[{metric: value}]``, one dict per loader (see
        [`validate`][tandem.Trainer.validate])."""
        return self._evaluate("test", model, dataloaders, ckpt_path, verbose, datamodule, weights_only)

    def predict(
        self,
        model: TrainingModule | None = None,
        dataloaders: Any = None,
        datamodule: DataModule | None = None,
        return_predictions: bool | None = None,
        ckpt_path: str | os.PathLike | None = None,
        weights_only: bool | None = None,
    ) -> list[Any] | None:
        """Run ``predict_step`` over the data; returns one output per batch, in dataset order (a list per
        loader when there are several), or None with ``return_predictions=False`` (e.g. when a
        ``BasePredictionWriter`` writes them)."""
        self._evaluation.return_predictions = return_predictions is not False
        return self._evaluate("predict", model, dataloaders, ckpt_path, False, datamodule, weights_only)

    def _evaluate(
        self,
        fn: str,
        model: TrainingModule | None,
        dataloaders: Any,
        ckpt_path: str | os.PathLike | None,
        verbose: bool,
        datamodule: DataModule | None,
        weights_only: bool | None = None,
    ) -> Any:
        if data.is_datamodule(dataloaders):
            datamodule, dataloaders = dataloaders, None
        given: TrainingModule | torch.nn.Module | None = model  # or the previous run's, maybe torch.compile'd
        if given is None:
            given = self._module
            if given is None:
                raise TandemConfigError(
                    f"Trainer.{fn}() got no model and no earlier run has one; pass it: trainer.{fn}(model, ...)."
                )
            if ckpt_path is None and checkpointing.best_checkpoint(self) is not None:
                ckpt_path = "best"
                rank_zero_warn(
                    f"trainer.{fn}() was called without a model: the best checkpoint of the previous fit is loaded "
                    f"first. Pass ckpt_path='best' or 'last' (or the model) to silence this warning."
                )
        elif fn == "test" and ckpt_path is None:
            _say_if_built_weights(model)
        result = self._launch(
            fn,
            given,
            eval_dataloaders=dataloaders,
            datamodule=datamodule,
            ckpt_path=ckpt_path,
            weights_only=weights_only,
        )
        if verbose and result and self.is_global_zero:
            table = format_results(result, fn)
            if table:
                print(table)
        return result

    def _launch(
        self,
        fn: str,
        model: TrainingModule | torch.nn.Module,
        *,
        train_dataloaders: Any = None,
        eval_dataloaders: Any = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | os.PathLike | None = None,
        weights_only: bool | None = None,
    ) -> Any:
        module, compiler = unwrap_compiled(model)  # torch.compile(model): the module runs, compiled after wrapping
        if not isinstance(module, TrainingModule):
            got = type(module).__name__ if compiler is None else f"torch.compile({type(module).__name__})"
            raise TandemUserCodeError(
                f"Trainer.{fn} expects a tandem.TrainingModule (or torch.compile of one), got {got}. "
                "Subclass tandem.TrainingModule instead of torch.nn.Module."
            )
        if compiler is not None and not self.strategy.supports_compile:
            raise incompatible(
                f"a torch.compile'd module with strategy={self.strategy.name!r}",
                "only strategies that keep one module per process (single_device, ddp, fsdp) run compiled modules",
                f"Use strategy='ddp', or pass the module uncompiled: trainer.{fn}(model) instead of "
                f"trainer.{fn}(torch.compile(model)).",
            )
        data.check_stage_hooks(fn, module, datamodule, self.callbacks)  # before any process or hook runs
        self._module = model
        run = (
            self._run_stage
            if self.strategy.launcher is None
            else functools.partial(self.strategy.launcher.launch, self._run_stage, trainer=self)
        )
        return run(
            fn,
            module,
            train_dataloaders=train_dataloaders,
            eval_dataloaders=eval_dataloaders,
            datamodule=datamodule,
            ckpt_path=ckpt_path,
            weights_only=weights_only,
            compiler=compiler,
        )

    def _run_stage(
        self,
        fn: str,
        model: TrainingModule,
        *,
        train_dataloaders: Any = None,
        eval_dataloaders: Any = None,
        datamodule: DataModule | None = None,
        ckpt_path: str | os.PathLike | None = None,
        weights_only: bool | None = None,
        compiler: Compiler | None = None,
    ) -> Any:
        """Runs in every process: set up, restore, loop, tear down. The side channel's collective check names
        ``fn`` as the entry point of every collective inside. ``compiler``: the settings of the
        ``torch.compile`` call ``model`` came in (the strategy compiles its wrapper with them)."""
        self.state.fn, self.state.status, self.state.should_stop = TrainerFn(fn), TrainerStatus.RUNNING, False
        self._metrics.set_batch(None)  # no batch of an earlier run
        with entry_point(fn):
            try:
                self._ckpt_path = None
                self._setup(fn, model, train_dataloaders, eval_dataloaders, datamodule, compiler)
                if ckpt_path is not None:
                    self._ckpt_path = checkpointing.restore(self, ckpt_path, fn, weights_only=weights_only)
                if fn == "fit":
                    model._note_weights_from("fit")  # a later trainer.test(model) tests what it learnt
                    anomaly = torch.autograd.detect_anomaly() if self.detect_anomaly else contextlib.nullcontext()
                    with (
                        anomaly,
                        preemption.catching_signals(self.fit_loop.state.progress),
                        self._hooks.running("train"),
                    ):
                        if self.strategy.replica_groups is not None:  # ddp_ft: a late group takes a peer's state
                            self.strategy.replica_groups.join(checkpointing.live_state(self))
                        self._hooks.call("on_fit_start")
                        model.zero_grad()  # as Lightning, every run starts with no gradients (none left by another)
                        self.fit_loop.run()
                        self._hooks.call("on_fit_end")
                    result = None
                else:
                    model.zero_grad()
                    result = self._evaluation.run(fn)
                self._wait_for_checkpoint_write()  # a failed background write fails the run
            except TunerExit:  # a Tuner's search is done (it put the state back): the fit ends there, finished
                self.state.status = TrainerStatus.FINISHED
                self._finish(fn, "success", model)
                return None
            except BaseException as exception:
                note_unpacked_mapping(exception, self._metrics.batch)  # x, y = batch on a dict batch
                data.note_uneven_batch(exception, self._metrics.batch, self._loaders_of(fn))  # 16 inputs, 15 targets
                self._wait_for_checkpoint_write(exception)
                self.state.status = TrainerStatus.INTERRUPTED
                self._hooks.call("on_exception", exception)
                stopped = isinstance(exception, (KeyboardInterrupt, Preempted))
                self._finish(fn, "interrupted" if stopped else "failed", model)
                self._finish_profiling(fn, report=stopped)  # a stopped run's profile is worth reading
                raise
            self.state.status = TrainerStatus.FINISHED
            self._finish(fn, "success", model)
            self._finish_profiling(fn, report=True)
        return result

    def _loaders_of(self, fn: str) -> dict[str, Any]:
        """The loaders entry point ``fn`` runs, by stage, in the shape given (those not loaded yet: None)."""
        records = self._evaluation.records
        if fn == "fit":
            return {"training": self.fit_loop.data.given, "validation": records["validate"].given}
        return {fn: records[fn].given}

    def _wait_for_checkpoint_write(self, exception: BaseException | None = None) -> None:
        """Wait for the checkpoint written in the background (``AsyncCheckpointIO``), raising its error; while
        ``exception`` ends the run, that error becomes a note on it instead."""
        writer = self.strategy.checkpoint_io
        if writer is None:
            return
        if exception is None:
            writer.wait()
            return
        try:
            writer.wait()
        except Exception as error:
            add_note(
                exception, f"[tandem] The background checkpoint write also failed: {type(error).__name__}: {error}"
            )

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once, on global rank 0 (as ``self.print`` in a module)."""
        rank_zero_print(*args, **kwargs)

    def init_module(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager:
        """Build the module where the strategy wants its tensors: directly on the device (in float64 under
        "64-true"), or, with ``strategy="fsdp"`` and ``empty_init=True``, without memory (meta parameters)
        so that each rank materialises only its shard.

        Args:
            empty_init: True to skip allocating (and initialising) the parameters now; FSDP then calls each
                submodule's ``reset_parameters()`` on this rank's shard. Other strategies build as for None.

        Example:
            ```python
            trainer = Trainer(strategy="fsdp", devices=4)
            with trainer.init_module(empty_init=True):
                model = LargeModel()
            ```
        """
        return self.strategy.tensor_init_context(empty_init)

    def trial(
        self,
        callbacks: Sequence[Callback] = (),
        max_steps: int = 100,
        *,
        max_epochs: int | None = None,
        restart_data: bool = False,
    ) -> contextlib.AbstractContextManager[Trial]:
        """Short training runs inside the running fit that leave no trace: the tuner's searches
        (``LearningRateFinder``, ``BatchSizeFinder``) run in one. Call it from a callback hook of a fit
        (``on_fit_start``, ``on_train_epoch_start``), on every rank.

        On entry the fit's state is saved to a temporary checkpoint in ``default_root_dir``. In the block,
        ``trial.run()`` trains from that point, at most ``max_steps`` optimizer steps and up to epoch ``max_epochs``
        (None: as many epochs as the steps need), calling only ``callbacks`` (and the module's hooks): no loggers,
        progress bar or other callbacks,
        no sanity check or validation, no lr scheduler of the module, and NaN or inf is not acted on (a range test
        drives the loss to diverge). ``trial.reload_data()`` builds the training loaders again from the module's
        or DataModule's hooks (``trial.reloadable`` says whether they come from there). On exit, error or not,
        everything comes back: settings, callbacks, loggers, and from the checkpoint the weights, optimizers,
        schedulers, callbacks' state and loop counters; the RNG states are as on entry. Loaders rebuilt in the
        block are built again with the hyperparameters the block left (e.g. the batch size found).

        ``restart_data=True`` is Lightning's LR finder: on exit the training loaders that come from the hooks are
        asked for again where the fit next needs them (after the search, with the RNG as on entry, as Lightning's
        ``setup_data`` after its ``isolate_rng``), so a search and the fit after it draw the numbers they draw on
        Lightning.

        Example:
            ```python
            class Search(Callback):
                def on_fit_start(self, trainer, module):
                    with trainer.trial([recorder], max_steps=20) as trial:
                        trial.run()
            ```
        """
        load_data, from_hooks = None, False
        if self.state.fn == "fit" and self._fit_sources is not None and self._module is not None:
            load_data = self.fit_loop.reload_training
            from_hooks = self._fit_sources[0] is None
        parts = TrialParts(
            self._config,
            self._hooks,
            self._nonfinite,
            self._evaluation,
            self._metrics,
            load_data,
            from_hooks,
        )
        return open_trial(self, parts, callbacks, max_steps, max_epochs=max_epochs, restart_data=restart_data)

    # ================================================================== set-up
    def _setup(
        self, fn: str, model: TrainingModule, train: Any, evaluation: Any, datamodule: Any, compiler: Compiler | None
    ) -> None:
        """In Lightning's order: processes, prepare_data, the setup hooks, configure_model, the module onto its
        device, data, optimizers."""
        if datamodule is not None and (train is not None or evaluation is not None):
            raise TandemConfigError(f"Trainer.{fn} got both dataloaders and a datamodule; pass one of them.")
        if self.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
        if self.benchmark is not None:
            torch.backends.cudnn.benchmark = self.benchmark
        self.strategy.setup_environment()
        model._trainer = self
        self.datamodule = datamodule
        if datamodule is not None:
            datamodule.trainer = self
        # Every rank agrees on the run folder: rank 0's (a default_root_dir or save_dir computed on each rank, e.g.
        # from the time, differs), in one broadcast per stage
        self.default_root_dir, folders = self.strategy.broadcast(
            (self.default_root_dir, [(logger.save_dir, logger.version) for logger in self.loggers])
        )
        for logger, (save_dir, version) in zip(self.loggers, folders):
            if save_dir is not None and logger.save_dir != save_dir:  # a logger without a folder has none anywhere
                logger.save_dir = save_dir
            logger.version = version
        self._setup_profiling(fn, model)
        self.callbacks = _with_module_callbacks(self.callbacks, model)
        data.prepare_data(model, datamodule, self.strategy)
        if datamodule is not None:
            data.setup(datamodule, fn, self.strategy)
        for callback in self.callbacks:
            callback.setup(self, model, stage=fn)
        data.setup(model, fn, self.strategy)
        data.check_steps(fn, model)
        if fn == "fit":
            optim.check_manual_optimization(model, self.strategy, self._config)
            self._nonfinite.reset()
        with self.strategy.tensor_init_context():
            model.configure_model()  # layers built (and sharded) late, on the device, once the processes exist
        # As Lightning, each entry point starts with no published values (callback_metrics are this run's) and
        # counts its evaluation batches (the loggers' step of evaluation step values) from 0.
        self._metrics.clear_published()
        self._evaluation.seen_batches.clear()
        self.strategy.setup(model, compiler)
        self.metric_collector = self._collector if compiler is None else CompiledStepLog(self._collector)

        # The loaders are asked for where the loops first need them (Lightning's order): a fit's validation loaders
        # in the sanity check or before on_train_start, its training loader after the sanity check; an evaluation's
        # as it starts (after a checkpoint's restore)
        validates = data.check_sources(fn, model, train, evaluation, datamodule, self._config)
        stage = "validate" if fn == "fit" else fn
        self._evaluation.attach(
            stage,
            functools.partial(data.evaluation_record, fn, model, evaluation, datamodule, self.strategy, self._config),
        )
        if fn == "fit":  # a trial (the tuner's batch size search) builds the loaders again
            self.fit_loop.attach(
                functools.partial(
                    data.training_record, model, train, datamodule, self.strategy, self._config, validates
                ),
                validates,
            )
            self._fit_sources = (train, evaluation, datamodule)
        transfer = data.batch_transfer(self.strategy, model, datamodule)
        if self.fit_loop.context.profiler is not None:
            transfer = timed_transfer(self.strategy, transfer, self.fit_loop.context.profiler)
        self.fit_loop.batch_transfer = self._evaluation.batch_transfer = transfer
        if fn == "fit":
            self.fit_loop.optimization = configure_optimization(
                model, self.fit_loop.context, self.fit_loop.state, data.takes_batch_idx(model.training_step)
            )
        self._hooks.collect(self, model, self.callbacks, self.fit_loop.context.profiler)
        hparams = _hyperparameters_to_log(model, datamodule)
        for logger in self.loggers:  # every entry point, as Lightning
            if hparams is not None:
                logger.log_hyperparams(hparams)
            logger.log_graph(model)  # TensorBoardLogger(log_graph=True) traces model.example_input_array

    def _setup_profiling(self, fn: str, model: TrainingModule) -> None:
        """The run's profiler set up (Lightning's arguments), and the loops told whether to time (once per run)."""
        profiler = active(self.profiler)
        self.fit_loop.context.profiler = profiler
        if profiler is None:
            return
        from tandem.profilers.pytorch import PyTorchProfiler

        if isinstance(profiler, PyTorchProfiler):  # it labels the module's layers, and reads its step counts
            profiler.module = model
        local_rank = self.local_rank if self.world_size > 1 else None
        profiler.setup(stage=fn, local_rank=local_rank, log_dir=self.log_dir)

    def _finish_profiling(self, fn: str, report: bool) -> None:
        """The run's report (every rank: to its file, or printed on rank 0), or only the tear-down."""
        profiler = self.fit_loop.context.profiler
        self.fit_loop.context.profiler = None
        if profiler is None:
            return
        if report:
            profiler.describe()
        else:
            profiler.teardown(stage=fn)

    def _finish(self, fn: str, status: str, module: TrainingModule) -> None:
        """The run of ``module`` is over: the teardown hooks (also after a failure before the strategy took the
        module: they get this run's module, never None or an earlier run's), the loggers, the strategy."""
        self.fit_loop.detach()
        self._evaluation.attach(None, None)
        if self.datamodule is not None:
            self.datamodule.teardown(stage=fn)
        for callback in self.callbacks:
            callback.teardown(self, module, stage=fn)
        module.teardown(stage=fn)
        for logger in self.loggers:
            logger.finalize(status)
        self.strategy.teardown()
        self._metrics.set_batch(None)  # the last batch (on the device) is not kept past the run
        free_cuda_memory(self.strategy.root_device)  # cuBLAS's workspaces and the cache, as Lightning's teardown

    # ================================================================== hooks
    def call_hook(self, hook: str, *args: Any) -> None:
        """Run ``hook`` (a ``Callback`` hook name such as ``"on_before_backward"``) on the callbacks, then on the
        module, in Lightning's order, as the loops do; hooks nobody overrides cost nothing."""
        self._hooks.call(hook, *args)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Send ``metrics`` (name -> number or scalar tensor) to every logger, on global rank 0.

        How callbacks write their own values (e.g. learning rates). Needs no other process (it is not a
        collective). ``step`` defaults to the loggers' current step: the number of training batches that stepped
        (``global_step`` with one optimizer; under manual optimization, the batches). The row holds the values alone,
        as Lightning's callbacks write theirs (the rows of ``self.log`` values also name the epoch); the values also
        appear in ``logged_metrics``.
        """
        self._sink.log_metrics(metrics, step, epoch=False)

    # ================================================================== checkpoints
    def save_checkpoint(self, filepath: str | os.PathLike, weights_only: bool = False) -> bool:
        """Write a checkpoint. Every rank must call this (it builds the state on each); rank 0 writes it
        atomically; all ranks meet at a barrier after. With ``plugins=[AsyncCheckpointIO()]``, during a run rank 0
        copies the state and writes it in the background (the run waits for it before it returns).

        Parameters holding NaN or inf are never written: ``on_nonfinite="raise"`` raises a ``NonFiniteError``,
        ``"warn"`` skips the save with a warning and returns False (a file already at ``filepath`` stays).

        Args:
            filepath: where to write (``.ckpt``).
            weights_only: only the weights and hyperparameters (such a file cannot resume training). The
                weights are whole even under ``strategy="fsdp"`` (gathered from the shards, whatever its
                ``state_dict_type``): after an FSDP fit, this is how they leave the sharded module.

        Example:
            ```python
            trainer.fit(model, loader)
            trainer.save_checkpoint("model.ckpt", weights_only=True)  # every rank; rank 0 writes
            plain = MyModule()
            plain.load_state_dict(torch.load("model.ckpt")["state_dict"])
            ```

        Returns:
            True when the checkpoint was written.
        """
        with entry_point("save_checkpoint"):
            nonfinite = nonfinite_parameters(self.strategy.module)  # one fused pass over the parameters
            if self.strategy.reduce_boolean_decision(bool(nonfinite), all=False):  # any rank's shard: all alike
                self._nonfinite.refuse_save(nonfinite, filepath, self.global_step)
                return False
            state = to_plain(self._checkpoint_state(weights_only), self._left_out)
            self.strategy.save_checkpoint(state, os.fspath(filepath))
            if self.state.status != "running":  # outside a run nothing overlaps the write, and nothing reports it
                self._wait_for_checkpoint_write()
            return True

    def _checkpoint_state(self, weights_only: bool = False) -> dict[str, Any]:
        return checkpointing.checkpoint_state(self, weights_only)

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


def _say_if_built_weights(model: Any) -> None:
    """``trainer.test(model)`` without ``ckpt_path`` on a module never fitted nor loaded tests the weights it was built
    with (Lightning does too, without a word): one info line says so."""
    module, _ = unwrap_compiled(model)
    if isinstance(module, TrainingModule) and not module._has_own_weights():
        name = type(module).__name__
        rank_zero_info(
            f"Testing {name} with the weights it was built with: it was neither fitted nor loaded from a checkpoint, "
            f"and no ckpt_path was given. To test trained weights, fit it first, pass ckpt_path='path/to.ckpt', or "
            f"load it with {name}.load_from_checkpoint(path)."
        )


# (called with a variable typed ``type``: mypy does not see ``type[Trainer]`` as the Hashable that the cache takes)
@functools.cache
def _init_signature(cls: type[Any]) -> inspect.Signature:
    signature = inspect.signature(cls.__init__)
    return signature.replace(parameters=list(signature.parameters.values())[1:])


@functools.cache
def _init_arguments(cls: type[Any]) -> frozenset[str] | None:
    """The names ``cls.__init__`` takes; None when it takes any (``**kwargs``)."""
    kind: type = cls
    parameters = _init_signature(kind).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters)


Trainer.__signature__ = _init_signature(Trainer)


# ====================================================================== construction helpers
def _hyperparameters_to_log(model: TrainingModule, datamodule: DataModule | None) -> dict[str, Any] | None:
    """What the loggers get at the start of a run, Lightning's rule: the hyperparameters of the module and the
    DataModule that called ``save_hyperparameters()`` (with ``logger=True``), merged; None when neither did (no
    ``log_hyperparams`` call, so no placeholder ``hp_metric`` either)."""
    sources = [
        owner for owner in (model, datamodule) if owner is not None and getattr(owner, "_log_hyperparams", False)
    ]
    if not sources:
        return None
    if datamodule is not None and len(sources) == 2:
        ours, theirs = dict(model.hparams), dict(datamodule.hparams)
        clashing = sorted(k for k in ours.keys() & theirs.keys() if not _same_value(ours[k], theirs[k]))
        if clashing:
            raise HparamsMergeError(
                f"Error while merging hparams: the keys {clashing} are present in both the LightningModule's and "
                "LightningDataModule's hparams but have different values. The loggers get one value per name: give "
                "them the same value, rename one, or leave it out of one side (save_hyperparameters(ignore=[...]))."
            )
    merged: dict[str, Any] = {}
    for owner in sources:
        merged.update(owner.hparams)
    merged.pop("_class_path", None)  # the CLI's own entry
    return merged


def _same_value(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a is b
    try:
        return bool(a == b)
    except Exception:  # a value whose == is not a plain truth (an array): the same object only
        return a is b


def _build_loggers(logger: Any, root: str) -> list[Logger]:
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
                f"logger={item!r} is not a tandem Logger; pass True, False, a Logger (TensorBoardLogger, CSVLogger, "
                "MLFlowLogger, WandbLogger, a subclass of tandem.loggers.Logger) or a list of them."
            )
    return loggers


def _add_timer(callbacks: list[Callback], max_time: Any) -> None:
    """``max_time`` is a [`Timer`][tandem.callbacks.Timer] checked every batch, unless the user gave a Timer (as
    Lightning)."""
    if max_time is None:
        return
    from tandem.callbacks.timer import Timer

    if any(isinstance(c, Timer) for c in callbacks):
        rank_zero_info("Ignoring Trainer(max_time=...): the callbacks already contain a Timer, whose duration counts.")
        return
    callbacks.append(Timer(duration=max_time, interval="step", verbose=True))


def _build_callbacks(
    callbacks: Any, checkpointing: bool, fast_dev_run: bool, progress_bar: bool, model_summary: bool
) -> list[Callback]:
    if callbacks is None:
        callbacks = []
    elif isinstance(callbacks, Callback):
        callbacks = [callbacks]
    callbacks = list(callbacks)
    for callback in callbacks:
        if not isinstance(callback, Callback):
            raise TandemConfigError(f"callbacks must be tandem.Callback instances; got {type(callback).__name__}.")
    given: list[str] = []
    if callbacks or checkpointing:  # no callback and checkpointing off: the module is not needed (nor imported)
        from tandem.callbacks.model_checkpoint import ModelCheckpoint

        given = [type(c).__name__ for c in callbacks if isinstance(c, ModelCheckpoint)]
    if given and not checkpointing:
        raise incompatible(
            f"Trainer(enable_checkpointing=False, callbacks=[{given[0]}(...)])",
            "enable_checkpointing=False turns checkpointing off, but the callbacks hold a ModelCheckpoint",
            "Remove the ModelCheckpoint from callbacks, or leave enable_checkpointing at True.",
            lead="Trainer was configured with `enable_checkpointing=False` but found `ModelCheckpoint` in callbacks "
            "list.",
        )
    if checkpointing and not fast_dev_run and not given:
        # Lightning's default: the latest epoch's checkpoint (epoch=N-step=M.ckpt), which best_model_path names
        callbacks.append(ModelCheckpoint())
    if progress_bar:
        from tandem.callbacks.progress_bar import ProgressBar
        from tandem.callbacks.tqdm_progress import TQDMProgressBar

        if not any(isinstance(c, ProgressBar) for c in callbacks):
            callbacks.append(TQDMProgressBar())
    if model_summary:
        from tandem.callbacks.model_summary import ModelSummary

        if not any(isinstance(c, ModelSummary) for c in callbacks):
            callbacks.insert(0, _default_summary(callbacks))
    keys = [c.state_key for c in callbacks]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise TandemConfigError(
            f"Two callbacks share the checkpoint state key {duplicates[0]!r}; give them different settings."
        )
    return _lightning_order(callbacks)


def _default_summary(callbacks: list[Callback]) -> Callback:
    """Lightning's default summary: a rich table beside a ``RichProgressBar``, the plain one otherwise."""
    from tandem.callbacks.model_summary import ModelSummary
    from tandem.callbacks.rich_model_summary import RichModelSummary
    from tandem.callbacks.rich_progress import RichProgressBar

    return RichModelSummary() if any(isinstance(c, RichProgressBar) for c in callbacks) else ModelSummary()


def _lightning_order(callbacks: list[Callback]) -> list[Callback]:
    """Lightning's order of the callbacks: the tuner's (``BatchSizeFinder``, ``LearningRateFinder``) first, the
    checkpoint callbacks last (a checkpoint sees what the others logged), each group in the order given."""
    # a tuner's class exists only once its module was imported (tandem.callbacks imports each on first use)
    tuner_classes = (("batch_size_finder", "BatchSizeFinder"), ("lr_finder", "LearningRateFinder"))
    found = ((sys.modules.get(f"tandem.callbacks.{module}"), kind) for module, kind in tuner_classes)
    tuners = tuple(getattr(module, kind) for module, kind in found if module is not None)
    # a stable sort: each group keeps the order given
    return sorted(callbacks, key=lambda c: 0 if isinstance(c, tuners) else 2 if isinstance(c, Checkpoint) else 1)


def _with_module_callbacks(callbacks: list[Callback], module: TrainingModule) -> list[Callback]:
    """The Trainer's callbacks with the module's ``configure_callbacks()`` added; a Trainer callback whose class
    one of them is (a subclass of) is replaced (Lightning's rule)."""
    if not calls_hook(module, "configure_callbacks"):
        return callbacks
    extra = module.configure_callbacks()
    extra = [extra] if isinstance(extra, Callback) else list(extra or [])
    for callback in extra:
        if not isinstance(callback, Callback):
            raise TandemUserCodeError(
                f"{type(module).__name__}.configure_callbacks returned {type(callback).__name__}; return "
                "tandem.Callback instances (one or a list)."
            )
    replaced = {type(c) for c in callbacks if type(c) is not Callback and any(isinstance(e, type(c)) for e in extra)}
    return _lightning_order([c for c in callbacks if type(c) not in replaced and c not in extra] + extra)


def _preemption_stop(trainer: Trainer) -> Callable[[], None]:
    """What the fit loop calls at the agreed pre-emption stop: save ``last.ckpt`` and end the job. Holds the
    Trainer weakly (the Trainer holds the loop that holds this)."""
    trainer_ref = weakref.ref(trainer)

    def stop() -> None:
        running = trainer_ref()
        assert running is not None  # called by the fit loop of this Trainer's own running fit
        preemption.stop(running)

    return stop
