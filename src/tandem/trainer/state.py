"""What the loops read: the training loop's state (also what checkpoints save), one record per data stage,
and what the Trainer is doing now."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

#: the LoopState fields a checkpoint holds (the others are restored state waiting to be applied)
_SAVED = (
    "epoch",
    "global_step",
    "batches_stepped",
    "batches_done",
    "batches_in_earlier_epochs",
    "epoch_finished",
    "epoch_start_rng",
    "epoch_order_rng",
)


@dataclass
class LoopState:
    """Where training is. The loops read and advance it; ``checkpoint["loops"]`` is ``state_dict``.

    ``epoch`` counts from 0; after fit it equals the number of finished epochs.
    """

    epoch: int = 0
    global_step: int = 0  # optimizer steps (each optimizer's; a float16 step skipped for inf/NaN counts too)
    batches_stepped: int = 0  # training batches that ended in an optimizer step (manual: every batch)
    batches_done: int = 0  # training batches finished in the current epoch
    # training batches of the finished epochs: with check_val_every_n_epoch=None, val_check_interval counts them too
    batches_in_earlier_epochs: int = 0
    epoch_finished: bool = False  # the epoch's batches are done; its end (validation, hooks) is running
    # the epoch's end has not stepped the epoch schedulers yet (they step after on_train_epoch_end, as Lightning's;
    # a checkpoint saved before records it, see FitLoop.state_dict; not saved itself)
    schedulers_pending: bool = False
    epoch_start_rng: dict[str, Any] | None = field(default=None, repr=False)  # RNG at iter(train loader)
    # RNG where the epoch's order was drawn (its first batch read), when that came later than iter(train loader):
    # the first epoch's iterator is made with the loader (Lightning's); None: right after iter()
    epoch_order_rng: dict[str, Any] | None = field(default=None, repr=False)
    # The current epoch's batch count: the training loader's (math.inf when unknown); an epoch of unknown length
    # that several processes even gets its count once the ranks find its last batch (not saved).
    epoch_batches: int | float = 0
    uneven_warned: bool = False  # the ranks' uneven training batches were reported (once; not saved)
    # The batch plan, decided once at the top of each training batch (plan_batch; not saved).
    stepping: bool = False  # the batch ends in an optimizer step (manual optimization: every batch)
    log_step: bool = False  # its logged values are published at its end (every log_every_n_steps stepping batch)
    # The loggers' default step (Lightning's): the batches stepped before the current batch, so the first window is
    # written at step log_every_n_steps - 1 and a validation inside the epoch at its batch's; set at each batch's
    # top, to ``batches_stepped - 1`` for the epoch's values (the step of its last batch, as the epoch-end
    # validation's), then to ``batches_stepped`` (not saved).
    logger_step: int = 0
    # Restored from a checkpoint, applied when the loop reaches the point they belong to (not saved).
    resume_rng: dict[str, Any] | None = field(default=None, repr=False)
    resume_train_metrics: dict[str, Any] | None = field(default=None, repr=False)
    # the finished epoch's scheduler step a checkpoint saved at its end had not taken: the plateau monitors' values
    resume_schedulers: dict[str, float] | None = None
    # An elastic resume whose place falls inside one of this run's batches: the global order's item the resumed
    # epoch begins at (tandem.trainer.elastic; not saved)
    resume_start: int | None = None
    # the checkpoint's training order (with several training loaders, one per loader), for loaders built again (not
    # saved)
    order: dict[str, Any] | list[dict[str, Any] | None] | None = None

    def state_dict(self) -> dict[str, Any]:
        state = {name: getattr(self, name) for name in _SAVED}
        if self.epoch_finished:  # resumes with the next epoch: where this one's order was drawn is not needed
            state["epoch_order_rng"] = None
        return state

    def plan_batch(self, batch_idx: int, accumulate: int, log_every: int, automatic: bool) -> None:
        """Decide, at the top of training batch ``batch_idx``, whether it steps (the last micro-batch of each
        ``accumulate`` window and the epoch's last batch; under manual optimization every batch, whose steps are
        the module's) and whether it publishes (every ``log_every``-th stepping batch). The one place for both
        rules: the optimization, the publishing and ``trainer.is_stepping_batch`` / ``is_log_step`` read them."""
        self.stepping = (
            not automatic or accumulate == 1 or (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == self.epoch_batches
        )
        self.log_step = self.stepping and log_every > 0 and (self.batches_stepped + 1) % log_every == 0

    def no_step(self) -> None:
        """The planned step did not happen (no micro-batch of the window returned a loss)."""
        self.stepping = self.log_step = False

    def progress(self) -> tuple[int, int, bool]:
        """(epoch, batches done, epoch end running), read in one expression (another thread may call this)."""
        return self.epoch, self.batches_done, self.epoch_finished

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in _SAVED:
            if key in state:
                setattr(self, key, state[key])
        if "batches_stepped" not in state:  # a checkpoint of an earlier tandem: one step per stepping batch
            self.batches_stepped = self.global_step
        self.logger_step = self.batches_stepped
        if self.epoch_finished:  # saved at the epoch's end: resume with the next epoch
            self.finish_epoch()

    def finish_epoch(self) -> None:
        """Move to the next epoch, in one statement: the side channel's thread reads these (pre-emption) and
        must not see half of it."""
        (
            self.epoch,
            self.batches_in_earlier_epochs,
            self.batches_done,
            self.epoch_finished,
            self.epoch_start_rng,
            self.epoch_order_rng,
        ) = (self.epoch + 1, self.batches_in_earlier_epochs + self.batches_done, 0, False, None, None)


def not_composed(batch: Any, batch_idx: int) -> tuple[Any, Any]:
    """The ``optimize`` stage of a plan no fit composed (``BatchPlan.FULL``, an optimization's copy): it never
    runs a batch."""
    raise RuntimeError("This batch plan was not composed for a fit, so it has no optimization to run a batch with.")


@dataclass(frozen=True)
class BatchPlan:
    """What is on for one fit's training batches, composed once when the fit starts (``FitLoop`` builds it from the
    hook table, the strategy, the precision and the module's overrides): the batch runner and the optimization run
    the stages that are on and never ask about the others. It holds no rule of its own: whether a batch steps or
    publishes is ``LoopState.plan_batch``'s, the hooks' order the dispatcher's. Every stage a plan leaves out is
    a no-op for that fit (a hook nobody overrides, unscaling without a scaler, a transfer that returns the batch),
    so the full plan (``FULL``, every stage on) trains alike, bit for bit.
    """

    #: the optimization's ``run`` (timed when profiling; its losses recorded under on_nonfinite="rollback"); a plan
    #: no fit composed has ``not_composed``
    optimize: Callable[[Any, int], tuple[Any, Any]] = not_composed
    transfer: Callable[[Any], Any] | None = None  # the batch onto its device; None: it stays as the loader made it
    follow: Callable[..., None] | None = None  # the strategy's follow_module, where it follows the module
    batch_start: bool = True  # on_train_batch_start hooks
    batch_end: bool = True  # on_train_batch_end hooks (their outputs dict built only then)
    before_backward: bool = True  # on_before_backward hooks
    after_backward: bool = True  # on_after_backward hooks
    before_optimizer_step: bool = True  # on_before_optimizer_step hooks
    before_zero_grad: bool = True  # on_before_zero_grad hooks
    unscale: bool = True  # the precision unscales gradients before a step (float16's scaler)
    deferred_logs: bool = True  # a compiled training step's self.log calls are logged after it (CompiledStepLog)

    #: every stage on: the plan of an optimization used outside a fit, and the reference the equivalence test
    #: (tests/trainer/test_fit_plan.py) trains every composed plan against
    FULL: ClassVar[BatchPlan]


BatchPlan.FULL = BatchPlan()


class _StrEnum(str, Enum):
    """An enum whose members are their strings: equal to them, hashed and printed as them (``TrainerFn.FITTING ==
    "fit"``, ``f"{stage}"`` is ``"validate"``), as Lightning's state enums."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)


class TrainerFn(_StrEnum):
    """The entry point running: ``trainer.state.fn`` (Lightning's names)."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(_StrEnum):
    """What the loops are running: ``trainer.state.stage`` (Lightning's names)."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self) -> bool:
        """A validation (the sanity check's included) or a test."""
        return self in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)


class TrainerStatus(_StrEnum):
    """How the last run stands: ``trainer.state.status`` (Lightning's names)."""

    INITIALIZING = "initializing"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"

    @property
    def stopped(self) -> bool:
        """The run is over, finished or interrupted."""
        return self in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)


_STATE_ENUMS = {"fn": TrainerFn, "stage": RunningStage, "status": TrainerStatus}


@dataclass
class TrainerState:
    """``fn``: the entry point running (a [`TrainerFn`][tandem.trainer.state.TrainerFn]: "fit", "validate", "test",
    "predict"); ``stage``: a [`RunningStage`][tandem.trainer.state.RunningStage] ("train", "sanity_check", "validate",
    "test" or "predict"); ``status``: a [`TrainerStatus`][tandem.trainer.state.TrainerStatus] ("initializing",
    "running", "finished" or "interrupted": the last run ended with an exception, Ctrl-C included). Each is Lightning's
    string enum, equal to its plain string, and may be set as one. ``stage`` has one writer, the hook dispatcher's
    ``running(stage)``."""

    fn: TrainerFn | None = None
    stage: RunningStage | None = None
    status: TrainerStatus = TrainerStatus.INITIALIZING
    should_stop: bool = False  # asked for by a callback or the module; the fit ends at the next agreed point

    def __setattr__(self, name: str, value: Any) -> None:
        kind = _STATE_ENUMS.get(name)  # a plain string becomes its member (reads stay plain attribute reads)
        super().__setattr__(name, kind(value) if kind is not None and value is not None else value)

    @property
    def finished(self) -> bool:
        """The last run ended normally (Lightning's ``trainer.state.finished``)."""
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        """The last run is over, finished or interrupted (Lightning's ``trainer.state.stopped``)."""
        return self.status.stopped


@dataclass(frozen=True)
class StageNames:
    """The names one data stage uses: its step and hooks (``name``), its loaders and limits (``prefix``)."""

    name: str  # "validation": validation_step, on_validation_batch_end, ...
    prefix: str  # "val": val_dataloaders, limit_val_batches, DataModule.val_dataloader

    @property
    def step(self) -> str:
        return f"{self.name}_step" if self.name != "train" else "training_step"

    @property
    def loader_hook(self) -> str:
        """The DataModule / TrainingModule method that returns the stage's loaders."""
        return f"{self.prefix}_dataloader"

    @property
    def limit(self) -> str:
        return f"limit_{self.prefix}_batches"

    def hook(self, event: str) -> str:
        """``hook("batch_start")`` -> ``"on_validation_batch_start"``."""
        return f"on_{self.name}_{event}"


TRAIN = StageNames("train", "train")
#: evaluation stages by the Trainer entry point that runs them ("fit" validates with VALIDATE)
EVAL_STAGES = {
    "validate": StageNames("validation", "val"),
    "test": StageNames("test", "test"),
    "predict": StageNames("predict", "predict"),
}


@dataclass
class StageData:
    """One stage's data: its loaders (processed for the strategy), how many batches each runs, and the
    shape the user gave them in (one loader, a list or a dict), which the public attributes return."""

    names: StageNames
    loaders: list[Any] = field(default_factory=list)
    num_batches: list[int | float] = field(default_factory=list)
    given: Any = None  # the user's structure holding the processed loaders
    skippable: Any = None  # training: the SkippableSampler that lets a resumed epoch skip its done batches

    @property
    def total_batches(self) -> int | float:
        return sum(self.num_batches) if self.num_batches else 0

    @property
    def several(self) -> bool:
        """More than one loader: steps and hooks get ``dataloader_idx``, metric names a suffix."""
        return len(self.loaders) > 1
