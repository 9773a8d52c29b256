"""One error type per kind of mistake. Each message says what was wrong, what was expected, and the fix."""

from __future__ import annotations

import errno
import inspect
import os
from collections.abc import Iterable, Mapping
from typing import Any


class MisconfigurationException(Exception):  # noqa: N818 (Lightning's name)
    """Lightning's type for a misconfigured Trainer, callback or checkpoint: ``except MisconfigurationException``
    in a ported program catches tandem's [`TandemConfigError`][tandem.utilities.exceptions.TandemConfigError], which is
    one."""


class TandemConfigError(ValueError, MisconfigurationException):
    """A Trainer, strategy or callback argument is out of range or does not fit the machine."""


class TandemUserCodeError(TypeError):
    """A hook of the user's module returned or passed something tandem cannot use."""


class LogValueError(TandemUserCodeError, ValueError):
    """``self.log`` got a value it cannot log (None, a str, a dict, a list, a tensor of several numbers). A
    ``ValueError`` too, as Lightning raises there."""


class LogCallError(TandemUserCodeError, MisconfigurationException):
    """``self.log`` was called where or how its value would be lost or mixed up (a hook that publishes nothing,
    ``on_step=False, on_epoch=False``, one name logged twice in a hook with different arguments). A
    ``MisconfigurationException`` too, as Lightning raises there."""


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, unreadable, damaged (its checksum does not match), or not a tandem checkpoint."""


class FileWriteError(OSError):
    """A checkpoint or log file could not be written (disk full, read-only, no permission).

    ``errno`` is the operating system's error number; ``filename`` the file or folder concerned.
    """

    def __str__(self) -> str:
        return str(self.strerror)


class RankFailedError(RuntimeError):
    """Another process of the job failed; the message names its rank and carries its traceback."""


class CollectiveMismatchError(RuntimeError):
    """The ranks entered different collectives, or one rank will never enter the one the others wait in
    (raised by the side channel's collective check, ``tandem.strategies.side_channel``)."""


class HangError(RuntimeError):
    """No rank of the job made progress for the strategy's ``hang_timeout``: rank 0 raises this instead of
    waiting for the process-group timeout. The message is a table of where each rank was (stage, hook, epoch,
    step, batch and the user's line it was blocked in); each rank printed its Python stack above it."""


class Preempted(SystemExit):  # noqa: N818 (Lightning's SIGTERMException is a SystemExit too)
    """The fit stopped for a pre-emption signal after saving ``last.ckpt``; the process exits with
    ``128 + signum`` (143 for SIGTERM, 138 for SIGUSR1). A ``SystemExit``: ``except Exception`` does not
    catch it, ``finally`` blocks and context managers run, and Python prints no traceback.

    Attributes:
        signum: the signal received.
        checkpoint: the checkpoint written, to resume with ``trainer.fit(..., ckpt_path="last")``.
        message: what happened, as printed by rank 0.
    """

    def __init__(self, signum: int, checkpoint: str, message: str) -> None:
        super().__init__(128 + int(signum))
        self.signum, self.checkpoint, self.message = int(signum), checkpoint, message

    def __str__(self) -> str:
        return self.message


class StepNotCommitted(Exception):  # noqa: N818 (a signal between the strategy and the loop, not a failure)
    """Raised by ``optimizer_step`` of a strategy whose replica groups commit each step together (``ddp_ft``) when
    the step was not committed (a group left during it): the loop runs the step again with the data of the next
    quorum (`tandem.trainer.step_retry`)."""


class ReplicaGroupBehindError(RuntimeError):
    """This replica group found itself behind the others mid-run (they committed a step it did not): it ends, and its
    restart joins them again with their state."""


class ReplicasDivergedError(RuntimeError):
    """The DDP ranks hold different parameters or buffers, which must be identical on every rank (raised on every
    rank, naming the first tensor that differs; see ``tandem.trainer.replicas``)."""


class NonFiniteError(FloatingPointError):
    """Training produced NaN or inf: in the loss, or in the parameters (``Trainer(on_nonfinite="raise")``)."""


class TunerExit(Exception):  # noqa: N818 (Lightning's _TunerExitException)
    """Raised by a tuner callback (``LearningRateFinder``, ``BatchSizeFinder``) that ``Tuner`` added, after its
    search: the Trainer ends that fit there, as finished (the search already put the state back)."""


class TandemWarning(UserWarning):
    """The class of every warning tandem raises (its subclasses included): silence them all with
    ``warnings.filterwarnings("ignore", category=TandemWarning)``, or make them errors in a test suite with
    ``filterwarnings = ["error::tandem.utilities.exceptions.TandemWarning"]``."""


class PossibleUserWarning(TandemWarning):
    """A warning about something that may be intended (Lightning's ``PossibleUserWarning``); silence it with
    ``warnings.filterwarnings("ignore", category=PossibleUserWarning)``."""


class UnzeroedGradientsWarning(PossibleUserWarning):
    """Under manual optimization an optimizer stepped again with no ``zero_grad`` since its previous step, so its
    gradients pile up over steps; silence it with
    ``warnings.filterwarnings("ignore", category=UnzeroedGradientsWarning)``."""


class MissingStateError(AttributeError):
    """A data hook (``setup``, ``*_dataloader``) read an attribute of the module or DataModule that no hook created
    on this process: ``setup(stage)`` did not build it for the stage that runs, or ``prepare_data`` set it on
    another process."""


class MissingAttributeError(TandemConfigError, AttributeError):
    """A search (the learning rate finder) was told to update an attribute that neither the module nor its hparams
    (nor the DataModule) has. An ``AttributeError``, as Lightning raises there."""


class HparamsMergeError(TandemConfigError, RuntimeError):
    """The module and the DataModule saved one hyperparameter name with different values (a RuntimeError, as
    Lightning raises it)."""


class MissingMetricError(KeyError, RuntimeError, MisconfigurationException):
    """A callback or a scheduler monitors a metric that was never logged. Catchable as each type Lightning raises
    there: ``RuntimeError`` (``EarlyStopping``), ``MisconfigurationException`` (``ModelCheckpoint``, a scheduler's
    ``monitor``), and a ``KeyError``, as before."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def _led(lead: str, message: str) -> str:
    """``message`` after ``lead``, Lightning's sentence for the same mistake (ported programs match it), if any."""
    return f"{lead} {message}" if lead else message


def bad_choice(what: str, value: Any, choices: Iterable[Any], fix: str = "", lead: str = "") -> TandemConfigError:
    """``what=value`` is not one of ``choices``. ``lead``: Lightning's sentence for the same mistake, put first
    (programs match it)."""
    listed = ", ".join(repr(c) for c in choices)
    msg = f"{what}={value!r} is not valid; expected one of: {listed}."
    return TandemConfigError(_led(lead, f"{msg} {fix}".strip()))


def out_of_range(what: str, value: Any, expected: str, fix: str = "", lead: str = "") -> TandemConfigError:
    """``what=value`` is outside the range it must be in. ``lead``: Lightning's sentence, put first."""
    msg = f"{what}={value!r} is out of range; expected {expected}."
    return TandemConfigError(_led(lead, f"{msg} {fix}".strip()))


def missing_metric(owner: str, monitor: str, available: Iterable[str], lead: str = "") -> MissingMetricError:
    """A monitored key was never logged; list the keys that were. ``lead``: Lightning's sentence for the same
    mistake, put first (programs match it)."""
    keys = sorted(available)
    shown = ", ".join(repr(k) for k in keys) if keys else "none"
    return MissingMetricError(
        _led(
            lead,
            f"{owner} monitors {monitor!r}, which was never logged. Logged metrics: {shown}. "
            f"Log it with self.log({monitor!r}, value) in your module, or set monitor to a logged key.",
        )
    )


def non_finite_advice(precision: str) -> str:
    """What to try when training produced NaN or inf."""
    if precision == "16-mixed":
        dtype = "float16 overflows often cause this: try precision='bf16-mixed' or '32-true'"
    elif precision == "16-true":
        dtype = "float16 overflows often cause this: try precision='bf16-true', 'bf16-mixed' or '32-true'"
    elif precision in ("bf16-mixed", "bf16-true"):
        dtype = "precision='32-true', to see whether bfloat16's coarse rounding is the cause"
    else:
        dtype = "a numerically stable loss (F.cross_entropy on logits, log-softmax, no exp of large values)"
    return (
        "To find the cause, try: a lower learning rate; gradient clipping (Trainer(gradient_clip_val=1.0)); "
        f"{dtype}; checking the data for NaN or inf; Trainer(detect_anomaly=True), which names the operation "
        "that first produced it (slow)."
    )


def non_finite(found: str, precision: str) -> NonFiniteError:
    """Training produced NaN or inf: ``found`` says what, where and since when."""
    return NonFiniteError(
        f"NaN or inf in training: {found} {non_finite_advice(precision)} Trainer(on_nonfinite='warn') trains on "
        "instead, without writing checkpoints of non-finite parameters."
    )


def empty_batch(found: list[tuple[int, int, int]], several: bool) -> TandemUserCodeError:
    """Training batches with no samples were trained on: ``found`` holds (rank, epoch, batch_idx) of each."""
    rank, epoch, batch_idx = found[0]
    where = f"Training batch {batch_idx} of epoch {epoch}"
    if several:
        where += f" on rank {rank}" + (f" (and on rank(s) {[r for r, _, _ in found[1:]]})" if len(found) > 1 else "")
    return TandemUserCodeError(
        f"{where} holds no samples (dim 0 of its tensors is 0), and training_step trained on it: a loss over no "
        "samples is NaN (a mean) or 0 (a sum), and the step learns nothing from it. Usual causes: a collate_fn that "
        "filters samples and can drop them all; a Dataset whose __len__ is larger than the data it yields (the last "
        "batches read past its end); a batch_sampler or IterableDataset that yields an empty batch. Fix the "
        "dataset's length or the collate_fn, drop a short last batch with DataLoader(drop_last=True), or, with one "
        "process and automatic optimization, skip such batches: return None from training_step when the batch "
        "is empty."
    )


def unzeroed_gradients(optimizer: str) -> UnzeroedGradientsWarning:
    """Manual optimization: ``optimizer`` stepped on gradients it had stepped on before, never zeroed since."""
    return UnzeroedGradientsWarning(
        f"{optimizer} stepped again on gradients it had already stepped on: no zero_grad of it ran since its previous "
        "step(), so each manual_backward adds to the old gradients and every step applies them again (they pile up "
        "over steps). Call opt.zero_grad() before manual_backward, or after opt.step(). To accumulate gradients over "
        "N batches on purpose, step and zero every N batches: if (batch_idx + 1) % N == 0: opt.step(); "
        "opt.zero_grad(). (Shown once per fit; silence it with warnings.filterwarnings('ignore', "
        "category=tandem.utilities.exceptions.UnzeroedGradientsWarning).)"
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def hyperparameters_renamed(
    owner: str, path: str | os.PathLike, accepted: Iterable[str], unknown: dict[str, Any], unset: dict[str, Any]
) -> TandemConfigError:
    """``owner.load_from_checkpoint(path)``: saved hyperparameters that ``__init__`` no longer takes (``unknown``: name
    -> saved value), while arguments are neither saved nor passed (``unset``: name -> default, or
    ``inspect.Parameter.empty`` for a required one), so the saved values would be dropped for defaults: a model other
    than the one saved."""
    saved = ", ".join(f"{name!r} (saved as {_shown(value)})" for name, value in unknown.items())
    lacking = ", ".join(
        f"{name!r} (required)" if default is inspect.Parameter.empty else f"{name!r} (default {_shown(default)})"
        for name, default in unset.items()
    )
    if len(unknown) == 1 and len(unset) == 1:
        (old, value), new = next(iter(unknown.items())), next(iter(unset))
        shown = _shown(value)
        fix = f"{owner}.load_from_checkpoint(path, {new}={'...' if shown.endswith('...') else shown})"
        fix += f" (if {old!r} was renamed to {new!r})"
        back = f"rename the argument back to {old!r}"
    else:
        fix = f"{owner}.load_from_checkpoint(path, " + ", ".join(f"{name}=..." for name in unset) + ")"
        back = "rename the arguments back"
    return TandemConfigError(
        f"{owner}.load_from_checkpoint({os.fspath(path)!r}): the checkpoint's saved hyperparameters include {saved}, which {owner}.__init__ does not take (it "
        f"takes: {', '.join(accepted) or 'no arguments'}), while {lacking} {'is' if len(unset) == 1 else 'are'} "
        "neither saved nor passed. If an argument was renamed, its saved value would be dropped and the new name "
        f"built from its default: a model other than the one saved. Pass the saved value under the new name: {fix}; "
        "keyword arguments of load_from_checkpoint set or override any argument __init__ takes, and once every "
        "argument is saved or passed, saved names that __init__ does not take are left out. Or "
        f"{back} (or accept the old name, or **kwargs, in __init__)."
    )


def hyperparameters_missing(
    owner: str, path: str | os.PathLike, saved: Iterable[str], missing: list[str]
) -> TandemConfigError:
    """``owner.load_from_checkpoint(path)``: ``__init__`` requires ``missing``, which the checkpoint's saved
    hyperparameters (``saved``, perhaps none) lack and the call does not pass."""
    call, names = f"{owner}.load_from_checkpoint({os.fspath(path)!r})", sorted(saved)
    pass_them = f"{owner}.load_from_checkpoint(path, {', '.join(f'{name}=...' for name in missing)})"
    if not names:
        return TandemConfigError(
            f"{call}: the checkpoint holds no saved hyperparameters (save_hyperparameters() was not called in "
            f"__init__), so it lacks {missing}, which {owner}.__init__ requires. Pass them: {pass_them}; and call "
            "self.save_hyperparameters() in __init__ so that later checkpoints carry them."
        )
    return TandemConfigError(
        f"{call}: the checkpoint's saved hyperparameters {names} lack {missing}, which {owner}.__init__ requires: "
        "probably added to __init__ after the checkpoint was saved (or left out by save_hyperparameters(ignore=...)). "
        f"Pass the value the saved model was built with: {pass_them}; or give the argument a default in __init__."
    )


def no_checkpoint_path(what: str) -> str:
    """The message for an empty checkpoint path: most often ``best_model_path`` of a ModelCheckpoint that kept no
    checkpoint."""
    return (
        f"{what}: the checkpoint path is empty, so there is no file to load. This is what "
        "trainer.checkpoint_callback.best_model_path holds when no best checkpoint was saved: the fit has not "
        "run (or ran with fast_dev_run), ModelCheckpoint(save_top_k=0) keeps none, or its monitor was never "
        "logged (no top-k checkpoint is saved until it is). Pass a checkpoint file, or fit first."
    )


def incompatible(what: str, reason: str, fix: str, lead: str = "") -> TandemConfigError:
    """Arguments that are each valid but cannot work together (or need something that is absent). ``lead``:
    Lightning's sentence, put first."""
    return TandemConfigError(_led(lead, f"{what}: {reason}. {fix}"))


_WRITE_FIXES: dict[int | None, str] = {  # keyed by OSError.errno, which may be None
    errno.ENOSPC: "Free space on that disk, or write somewhere else",
    errno.EDQUOT: "Free space within your disk quota, or write somewhere else",
    errno.EFBIG: "The file is larger than this process may write (ulimit -f); raise the limit, or write elsewhere",
    errno.EACCES: "Make the folder writable for this user, or write somewhere else",
    errno.EPERM: "Make the folder writable for this user, or write somewhere else",
    errno.EROFS: "The filesystem is mounted read-only; write somewhere else",
    errno.ENOTDIR: "A file stands where a folder is needed; remove it, or write somewhere else",
}


def write_failed(path: str | os.PathLike, cause: OSError, what: str = "", kept: bool = False) -> FileWriteError:
    """Writing ``path`` failed with ``cause``; say why in plain words, whether the old file survived, and the fix.

    Args:
        path: the file (or folder) that could not be written.
        cause: the operating system's error.
        what: a phrase naming the file's role, e.g. "the checkpoint"; ``path`` is named either way.
        kept: the previous file at ``path`` is still there, unchanged.
    """
    path = os.fspath(path)
    code = cause.errno
    reason = cause.strerror or str(cause)
    if code is not None and code in errno.errorcode:
        reason = f"{reason} ({errno.errorcode[code]})"
    subject = f"{what} {path!r}" if what else repr(path)
    fix = _WRITE_FIXES.get(code, "Check the folder and the disk, or write somewhere else")
    where = "ModelCheckpoint(dirpath=...), the logger's save_dir or Trainer(default_root_dir=...)"
    kept_text = " The previous file at that path is intact." if kept else ""
    return FileWriteError(code, f"Could not write {subject}: {reason}.{kept_text} {fix} ({where}).", path)


#: Lightning's class names that tandem spells differently
LIGHTNING_RENAMES = {"LightningModule": "TrainingModule", "LightningDataModule": "DataModule"}


def renamed_from_lightning(module: str, name: str) -> Exception:
    """For a module's ``__getattr__``: ``LightningModule`` / ``LightningDataModule`` get an ImportError naming
    tandem's class (an ImportError, so ``from tandem import LightningModule`` shows it); any other missing
    name the usual AttributeError."""
    if name in LIGHTNING_RENAMES:
        return ImportError(
            f"{module} has no {name}: tandem calls it {LIGHTNING_RENAMES[name]}. Port a Lightning program by "
            f"renaming lightning.pytorch to tandem, LightningModule to TrainingModule and LightningDataModule "
            f"to DataModule."
        )
    return AttributeError(f"module {module!r} has no attribute {name!r}")


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``: printed under the error's message (Python 3.11+); on 3.10, appended to it."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    elif error.args and isinstance(error.args[0], str):
        error.args = (f"{error.args[0]}\n{note}", *error.args[1:])


def _keys(batch: Mapping[Any, Any]) -> str:
    keys = list(batch)
    shown = ", ".join(repr(k) for k in keys[:4])
    return shown + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")


def _str_for_tensor(error: BaseException, batch: Mapping[Any, Any]) -> bool:
    """``error`` says a str was used where a tensor was expected: torch's ``must be Tensor, not str`` / ``but got
    str``, or a tensor method looked up on one of ``batch``'s keys (``'str' object has no attribute 'view'``)."""
    if isinstance(error, TypeError):
        text = str(error)
        return "not str" in text or "got str" in text or "got (str" in text
    if isinstance(error, AttributeError):
        word = getattr(error, "obj", None)
        return isinstance(word, str) and word in batch
    return False


def note_unpacked_mapping(error: BaseException, batch: Any) -> None:
    """Add a note to ``error`` when it comes from unpacking a dict batch (``x, y = batch`` gives its keys): a str
    where a tensor was expected, or a wrong number of values to unpack, while the batch running is a Mapping."""
    if type(error).__module__ == __name__:  # tandem's own errors say what is wrong already
        return
    if not isinstance(batch, Mapping) or not batch or not all(isinstance(k, str) for k in batch):
        return
    names = list(batch)[:2]
    fix = f"x, y = batch[{names[0]!r}], batch[{names[-1]!r}]" if len(names) == 2 else f"x = batch[{names[0]!r}]"
    if _str_for_tensor(error, batch):
        add_note(
            error,
            f"[tandem] The batch is a dict (keys {_keys(batch)}), and one of its keys, a str, was used where a tensor "
            "was expected: unpacking a dict (x, y = batch) gives its keys, not its values. Read the values by key: "
            f"{fix}.",
        )
    elif isinstance(error, ValueError) and "values to unpack" in str(error):
        add_note(
            error,
            f"[tandem] The batch is a dict with {len(batch)} keys ({_keys(batch)}): unpacking it (x, y = batch) "
            f"unpacks its keys, not its values. Read the values by key: {fix}.",
        )


def stage_hook_signature(owner: str, hook: str, signature: str, args: str) -> TandemUserCodeError:
    """``owner.hook`` (``setup`` / ``teardown``) cannot take the arguments the Trainer calls it with (``args``)."""
    return TandemUserCodeError(
        f"{owner}.{hook}{signature} cannot be called as {hook}({args}): the Trainer calls {hook} with the stage that "
        "runs ('fit', 'validate', 'test' or 'predict'), as Lightning does. Add the stage argument: "
        f"def {hook}(self, {args.replace('stage', 'stage: str')}) (give it a default, stage=None, to call it "
        "yourself without one)."
    )


#: strings a ``setup`` may compare ``stage`` with by mistake, and the stage meant
STAGE_TYPOS = {
    "train": "'fit'",
    "training": "'fit'",
    "val": "'fit' (trainer.fit validates too) or 'validate'",
    "valid": "'fit' (trainer.fit validates too) or 'validate'",
    "validation": "'fit' (trainer.fit validates too) or 'validate'",
    "eval": "'validate'",
    "testing": "'test'",
    "prediction": "'predict'",
    "inference": "'predict'",
}


def state_not_built(
    owner: str, hook: str, name: str, stage: str, has_setup: bool, typos: Iterable[str] = ()
) -> MissingStateError:
    """``owner.hook()`` read ``self.name``, which nothing created: ``setup(stage)`` ran just before it (when
    ``has_setup``) and did not build it. ``typos``: the strings of ``STAGE_TYPOS`` that ``setup``'s code holds."""
    if not has_setup:
        return MissingStateError(
            f"{owner}.{hook}() reads self.{name}, which does not exist: {owner} defines no setup(stage) and its "
            f"__init__ did not set it. Create it in __init__, or in def setup(self, stage), which the Trainer calls "
            f"before {hook}()."
        )
    hint = "".join(
        f" setup's code holds {typo!r}, which is not a stage: if it tests stage == {typo!r}, test stage == "
        f"{STAGE_TYPOS[typo]}."
        for typo in typos
    )
    return MissingStateError(
        f"{owner}.{hook}() reads self.{name}, which does not exist: setup({stage!r}) ran just before it and did not "
        "create it. The Trainer calls setup with the stage that runs, one of 'fit' (trainer.fit, which validates "
        f"too), 'validate', 'test' or 'predict'; this run's is {stage!r}.{hint} Create self.{name} in setup when "
        f"stage == {stage!r} (or whatever the stage)."
    )


def state_from_prepare_data(
    owner: str, hook: str, name: str, rank: str, assigned: bool, per_node: bool
) -> MissingStateError:
    """``owner.hook`` read ``self.name`` on a process that did not run ``owner.prepare_data`` (``rank`` names it);
    ``assigned``: prepare_data's code sets that name."""
    where = (
        "one process per node (local rank 0)"
        if per_node
        else "one process in all (global rank 0, as prepare_data_per_node=False)"
    )
    what = (
        f"{owner}.prepare_data assigns self.{name}, but prepare_data runs on {where}, so self.{name} exists only there"
        if assigned
        else f"{owner}.prepare_data runs on {where} only; if it assigned self.{name}, that exists only there"
    )
    return MissingStateError(
        f"{owner}.{hook}() reads self.{name}, which does not exist on this process ({rank}): {what}. Download and "
        f"write files in prepare_data; assign state (self.{name} = ...) in setup(stage), which runs on every "
        "process (it may read the files prepare_data wrote)."
    )


def csv_experiment_lacks(name: str, writer: Any) -> AttributeError:
    """``CSVLogger.experiment.<name>``: a call the CSV writer does not have (a SummaryWriter's ``add_image``)."""
    elsewhere = (
        " Images, histograms, text, audio and graphs need a logger that stores them: TensorBoardLogger, whose "
        "experiment is a torch SummaryWriter (logger.experiment.add_image(tag, image, step)). A Trainer takes several "
        "loggers, Trainer(logger=[CSVLogger(...), TensorBoardLogger(...)]); in a module, pick it from self.loggers."
    )
    return AttributeError(
        f"CSVLogger.experiment has no {name!r}: CSVLogger writes numbers to metrics.csv and hyperparameters to "
        "hparams.yaml, and its experiment (an ExperimentWriter, as in Lightning) has only log_metrics(metrics, step), "
        f"log_hparams(params) and save().{elsewhere if name.startswith('add_') else ''}",
        name=name,
        obj=writer,
    )
