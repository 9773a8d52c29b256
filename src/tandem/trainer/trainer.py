"""The Trainer: its arguments, its construction and its entry points (fit, validate, test, predict).

The Trainer class is this file and its base classes, each a file of its own: ``run`` (one run: launch, set up,
restore, loop, tear down), ``services`` (its calls besides the entry points: checkpoints, loggers, hooks, trials)
and ``properties`` (its public state, under Lightning's names). ``arguments`` resolves the arguments that are more
than numbers (loggers, callbacks).
"""

from __future__ import annotations

import inspect
import os
import weakref
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from tandem.callbacks.callback import Callback
from tandem.module import DataModule, TrainingModule
from tandem.profilers import Profiler
from tandem.strategies.registry import resolve_strategy
from tandem.strategies.strategy import Strategy
from tandem.trainer import checkpointing, data, preemption
from tandem.trainer.arguments import _add_timer, _build_callbacks, _build_loggers, _init_arguments, _init_signature
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
from tandem.trainer.logging.barebones import BarebonesLog
from tandem.trainer.logging.collector import MetricCollector
from tandem.trainer.logging.compiled import CompiledStepLog
from tandem.trainer.logging.sink import LogSink
from tandem.trainer.loops import FitLoop, LoopContext
from tandem.trainer.nonfinite import NonFiniteGuard, check_reaction
from tandem.trainer.profiling import resolve_profiler
from tandem.trainer.properties import TrainerProperties
from tandem.trainer.rollback import Rollback
from tandem.trainer.run import TrainerRun
from tandem.trainer.services import TrainerServices
from tandem.trainer.state import LoopState, TrainerState
from tandem.utilities.compile import unwrap_compiled
from tandem.utilities.exceptions import TandemConfigError, incompatible
from tandem.utilities.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from tandem.loggers.logger import Logger


class Trainer(TrainerRun, TrainerServices, TrainerProperties):
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


Trainer.__signature__ = _init_signature(Trainer)


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


def _preemption_stop(trainer: Trainer) -> Callable[[], None]:
    """What the fit loop calls at the agreed pre-emption stop: save ``last.ckpt`` and end the job. Holds the
    Trainer weakly (the Trainer holds the loop that holds this)."""
    trainer_ref = weakref.ref(trainer)

    def stop() -> None:
        running = trainer_ref()
        assert running is not None  # called by the fit loop of this Trainer's own running fit
        preemption.stop(running)

    return stop
