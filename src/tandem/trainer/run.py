"""``TrainerRun``: one run of an entry point. ``_launch`` starts it on the strategy's processes; in each,
``_run_stage`` sets up (in Lightning's order: processes, prepare_data, the setup hooks, configure_model, the module
on its device, data, optimizers), restores a checkpoint, runs the loop and tears down. A base class of ``Trainer``
(see ``tandem.trainer.trainer``)."""

from __future__ import annotations

import contextlib
import functools
import os
from typing import TYPE_CHECKING, Any, cast

import torch

from tandem.module import DataModule, TrainingModule
from tandem.profilers import Profiler
from tandem.strategies.side_channel import entry_point
from tandem.trainer import checkpointing, data, optim, preemption
from tandem.trainer.arguments import _with_module_callbacks
from tandem.trainer.logging.barebones import BarebonesLog
from tandem.trainer.logging.collector import MetricCollector
from tandem.trainer.logging.compiled import CompiledStepLog
from tandem.trainer.optimization.configure import configure_optimization
from tandem.trainer.profiling import active, timed_transfer
from tandem.trainer.services import TrainerServices
from tandem.trainer.state import TrainerFn, TrainerStatus
from tandem.utilities.compile import Compiler, unwrap_compiled
from tandem.utilities.exceptions import (
    HparamsMergeError,
    Preempted,
    TandemConfigError,
    TandemUserCodeError,
    TunerExit,
    incompatible,
    note_unpacked_mapping,
)
from tandem.utilities.memory import free_cuda_memory

if TYPE_CHECKING:
    from tandem.trainer.trainer import Trainer


class TrainerRun(TrainerServices):
    """One run of an entry point, in every process (a base of ``Trainer``)."""

    # set by Trainer.__init__
    profiler: Profiler
    deterministic: bool
    benchmark: bool | None
    detect_anomaly: bool
    datamodule: DataModule | None
    metric_collector: MetricCollector | BarebonesLog | CompiledStepLog
    _collector: MetricCollector | BarebonesLog

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
                    self._ckpt_path = checkpointing.restore(
                        cast("Trainer", self), ckpt_path, fn, weights_only=weights_only
                    )
                if fn == "fit":
                    model._note_weights_from("fit")  # a later trainer.test(model) tests what it learnt
                    anomaly = torch.autograd.detect_anomaly() if self.detect_anomaly else contextlib.nullcontext()
                    with (
                        anomaly,
                        preemption.catching_signals(self.fit_loop.state.progress),
                        self._hooks.running("train"),
                    ):
                        if self.strategy.replica_groups is not None:  # ddp_ft: a late group takes a peer's state
                            self.strategy.replica_groups.join(checkpointing.live_state(cast("Trainer", self)))
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
        model._trainer = cast("Trainer", self)
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
            callback.setup(cast("Trainer", self), model, stage=fn)
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
        self._hooks.collect(cast("Trainer", self), model, self.callbacks, self.fit_loop.context.profiler)
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
            callback.teardown(cast("Trainer", self), module, stage=fn)
        module.teardown(stage=fn)
        for logger in self.loggers:
            logger.finalize(status)
        self.strategy.teardown()
        self._metrics.set_batch(None)  # the last batch (on the device) is not kept past the run
        free_cuda_memory(self.strategy.root_device)  # cuBLAS's workspaces and the cache, as Lightning's teardown


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
