"""ModelCheckpoint: save the k best checkpoints by a monitored metric, and/or the last one."""

import math
import os
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import IO, TYPE_CHECKING, Any, Literal

import torch

from tandem.callbacks.callback import Checkpoint
from tandem.callbacks.model_checkpoint_arguments import check_arguments
from tandem.callbacks.model_checkpoint_files import (
    check_writable,
    default_dirpath,
    exists,
    format_name,
    link,
    remove,
    report_moved_folder,
    warn_of_other_runs,
    warn_unlogged_filename_metrics,
)
from tandem.callbacks.model_checkpoint_scores import (
    as_score,
    as_score_or_none,
    better,
    current_score,
    monitor_candidates,
)
from tandem.loggers.logger import Logger
from tandem.utilities.atomic import atomic_write
from tandem.utilities.cloud_io import is_url
from tandem.utilities.exceptions import (
    CheckpointError,
    NonFiniteError,
    Preempted,
    add_note,
    incompatible,
    missing_metric,
)
from tandem.utilities.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer


class ModelCheckpoint(Checkpoint):
    """Save checkpoints during training: the ``save_top_k`` best by ``monitor``, and/or ``last.ckpt``.

    Save points, as in Lightning: every ``every_n_train_steps`` optimizer steps, every
    ``train_time_interval`` of training, or else every ``every_n_epochs``-th epoch, at the end of the
    training epoch (after that epoch's validation) or, when validation does not run exactly once at the
    end of each epoch, at the end of each validation (``save_on_train_epoch_end`` picks one). ``last.ckpt``
    (Lightning 2.6's rule) is written whenever a checkpoint is saved: at every step or time save point, at an
    epoch save point only when a top-k checkpoint was written there, and at the end of a fit that saved nothing.
    Nothing is saved during the sanity check, outside ``fit`` or with ``fast_dev_run``. File names come from global rank 0's metric values, so all processes name the same
    files; a checkpoint that would replace one of the top k is saved only when every rank finds its own value of
    ``monitor`` better (Lightning's rule: a metric logged without ``sync_dist`` differs between ranks).
    ``best_model_score``, ``current_score``, ``kth_value`` and the values of ``best_k_models`` are 0-dim
    tensors, as in Lightning. A resumed fit restores the ranking, so ``best_model_path`` and
    ``ckpt_path="best"`` keep meaning the best of the whole run; files of the run that live in another
    folder (an earlier ``version_<n>``) keep their rank but are never deleted from here.

    Args:
        dirpath: folder of the checkpoints (``~`` is expanded, and the path made absolute). Default: ``<log_dir of the first logger>/checkpoints``, or
            ``<default_root_dir>/checkpoints`` without loggers.
        filename: name template without extension. Default ``"{epoch}-{step}"`` gives
            ``epoch=0-step=100.ckpt``; metric names and format specs work too: ``"{epoch}-{val_loss:.2f}"``.
        monitor: the logged metric that ranks checkpoints. ``None``: the latest are kept, ``best_model_path``
            names the newest and no score is kept (``best_k_models`` stays empty).
        verbose: say what was saved, and when a checkpoint did not make the top k.
        save_last: also write ``last.ckpt`` whenever a checkpoint is saved (overwritten each time), so
            ``ckpt_path="last"`` finds the latest. ``"link"`` (local folders only): ``last.ckpt`` is a symbolic link
            to the latest checkpoint (a copy where links cannot be made), put in place atomically; without top-k
            checkpoints to point to (``save_top_k=0``) it is a file.
        save_top_k: how many of the best to keep; ``-1`` keeps all, ``0`` none (``save_last`` still works).
        save_on_exception: when the run raises (in the module, a callback, or Ctrl-C), write a checkpoint named
            by ``filename`` (``last.ckpt`` too with ``save_last``), as Lightning does; not during the sanity
            check, with ``fast_dev_run``, or when this step was saved already. It is not ranked among the top k.
            Parameters holding NaN or inf are never written (a note on the exception says so).
        save_weights_only: write only the weights and hyperparameters (such a file cannot resume training).
        mode: ``"min"`` when lower is better (losses), ``"max"`` when higher is better (accuracies).
        auto_insert_metric_name: write ``{epoch}`` as ``epoch=3`` rather than ``3``.
        every_n_train_steps: save every this many optimizer steps (0 or None: not by steps).
        train_time_interval: save when this much time (a ``datetime.timedelta``) has passed since the last
            time-based save, checked after each training batch (rank 0's clock decides).
        every_n_epochs: save every this many epochs (default 1 when no other interval is set; 0: never).
        save_on_train_epoch_end: save at the end of the training epoch (True) or of validation (False).
            ``None``: at the training epoch end when there is no validation, or when it runs once at the end
            of every epoch; else after each validation.
        enable_version_counter: when a file of the same name exists, write ``name-v1.ckpt``, ``-v2``...
            instead of overwriting it.

    Example:
        ```python
        checkpoint = ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=3, save_last=True)
        trainer = Trainer(callbacks=[checkpoint], max_epochs=10)
        trainer.fit(module, datamodule=data)
        print(checkpoint.best_model_path, checkpoint.best_model_score)
        ```
    """

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | Literal["link"] | None = None,
        save_top_k: int = 1,
        save_on_exception: bool = False,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: timedelta | None = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
    ) -> None:
        check_arguments(mode, save_last, save_top_k, every_n_train_steps, every_n_epochs, train_time_interval, monitor)
        if every_n_train_steps is None and every_n_epochs is None and train_time_interval is None:
            every_n_epochs = 1
        if dirpath is not None:
            dirpath = os.fspath(dirpath)
            if dirpath and not is_url(dirpath):  # as Lightning: "~/ckpts" is the home folder's, and absolute
                dirpath = os.path.realpath(os.path.expanduser(dirpath))
        self._user_dirpath = dirpath
        self.dirpath: str | None = self._user_dirpath
        self.filename = filename
        self.monitor = monitor
        self.verbose = verbose
        self.save_last = save_last
        self.save_top_k = save_top_k
        self.save_on_exception = save_on_exception
        self.save_weights_only = save_weights_only
        self.mode = mode
        self.auto_insert_metric_name = auto_insert_metric_name
        self.every_n_train_steps = every_n_train_steps or 0
        self.train_time_interval = train_time_interval
        self.every_n_epochs = every_n_epochs or 0
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.enable_version_counter = enable_version_counter

        # scores are 0-dim tensors, as Lightning's (programs call .item() on them); without a monitor no score
        # is kept: best_k_models stays empty and best_model_path names the latest checkpoint
        self.best_k_models: dict[str, torch.Tensor] = {}  # path -> score
        self.kth_best_model_path = ""
        self.kth_value: torch.Tensor = torch.tensor(math.inf if mode == "min" else -math.inf)
        self.best_model_path = ""
        self.best_model_score: torch.Tensor | None = None
        self.current_score: torch.Tensor | None = None
        self.last_model_path = ""
        self._latest: list[str] = []  # without a monitor: the checkpoints kept, oldest first
        self._last_global_step_saved = 0  # nothing to save before the first step
        self._last_checkpoint_saved = ""  # the newest file this callback wrote in this process: what "link" names
        self._last_time_checked: float | None = None
        self._validated = False  # a validation ran in this fit: a missing monitor is then an error
        self._warned_missing = False
        self._warned_filename = False  # a filename placeholder naming an unlogged metric was reported
        self._pending_state: dict[str, Any] | None = None  # restored before setup resolved the dirpath
        self._sanity_checking = False  # still True in on_exception when the sanity check raised

    @property
    def state_key(self) -> str:
        """Lightning's key (``train_time_interval`` always in it), so callbacks differing in these arguments
        keep their own state."""
        return f"{type(self).__qualname__}{self._key_fields()!r}"

    @property
    def earlier_state_keys(self) -> tuple[str, ...]:
        """Keys this callback's state had in checkpoints of earlier tandem versions (without
        ``train_time_interval`` when it was None); a restore finds the state under them too."""
        if self.train_time_interval is not None:
            return ()
        fields = self._key_fields()
        del fields["train_time_interval"]
        return (f"{type(self).__qualname__}{fields!r}",)

    def _key_fields(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor,
            "mode": self.mode,
            "every_n_train_steps": self.every_n_train_steps,
            "every_n_epochs": self.every_n_epochs,
            "train_time_interval": self.train_time_interval,
        }

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: "Trainer", pl_module: "TrainingModule", stage: str) -> None:
        self._sanity_checking = False
        dirpath = self._user_dirpath
        if dirpath is None:
            dirpath = default_dirpath(trainer)
        # rank 0's folder on every rank, as Lightning: a dirpath built on each rank (from the time, a random id)
        # differs, and the other ranks would look for rank 0's files where none were written
        self.dirpath = trainer.strategy.broadcast(dirpath)
        if self.save_last == "link" and is_url(self.dirpath):
            raise incompatible(
                f"ModelCheckpoint(save_last='link', dirpath={self.dirpath!r})",
                "a symbolic link can only be made in a local folder",
                "Use save_last=True (a copy named last.ckpt), or a local dirpath.",
                lead=f"`ModelCheckpoint(save_last='link')` is only supported for local file paths, got "
                f"`dirpath={self.dirpath}`.",
            )
        if stage == "fit":  # find an unwritable folder now, not at the first save after an epoch of work
            check_writable(trainer, self.dirpath)
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            self._restore(state)

    def on_sanity_check_start(self, trainer: "Trainer", pl_module: "TrainingModule") -> None:
        self._sanity_checking = True

    def on_sanity_check_end(self, trainer: "Trainer", pl_module: "TrainingModule") -> None:
        self._sanity_checking = False

    def on_exception(self, trainer: "Trainer", pl_module: "TrainingModule", exception: BaseException) -> None:
        """``save_on_exception``: save where the run failed, named as a regular checkpoint (Lightning's rule). Every
        rank takes part (as every rank fails alike in a distributed run); the run's own exception goes on, and a
        save that could not be made (parameters holding NaN or inf, a full disk) becomes a note on it."""
        if not self._saves_on_exception(trainer, exception):
            return
        metrics = monitor_candidates(trainer)
        before = self.state_dict()
        try:
            path = self.format_checkpoint_name(metrics)
            kept = {*self.best_k_models, *self._latest, self.best_model_path, self.last_model_path}
            version = self.STARTING_VERSION
            while self.enable_version_counter and path in kept:  # never replaces a checkpoint this callback keeps
                path = self.format_checkpoint_name(metrics, ver=version)
                version += 1
            self._write(trainer, path)
            if self.save_last:
                self._save_last(trainer, metrics)
        except Exception as err:
            self._restore(before)
            why = "its parameters hold NaN or inf" if isinstance(err, (_Skipped, NonFiniteError)) else f"{err!r}"
            add_note(exception, f"[tandem] ModelCheckpoint(save_on_exception=True) wrote no checkpoint: {why}.")
            return
        rank_zero_info(
            f"An {type(exception).__name__} was raised with message: {exception}, saved checkpoint to {path}"
        )

    def _saves_on_exception(self, trainer: "Trainer", exception: BaseException) -> bool:
        """Lightning's ``_should_save_on_exception``; a pre-emption (``Preempted``) wrote its exact ``last.ckpt``
        already."""
        return (
            self.save_on_exception
            and self.dirpath is not None  # set up: the failure was not in the Trainer's own setup
            and not isinstance(exception, Preempted)
            and not trainer.fast_dev_run
            and not self._sanity_checking
            and self._last_global_step_saved != trainer.global_step
        )

    def on_train_start(self, trainer: "Trainer", pl_module: "TrainingModule") -> None:
        self._last_time_checked = time.monotonic()
        self._validated = False
        if trainer.is_global_zero and not trainer.fast_dev_run:
            self._warn_if_dir_not_empty(trainer)

    def _warn_if_dir_not_empty(self, trainer: "Trainer") -> None:
        """Checkpoints of another run in ``dirpath`` mix with this run's (Lightning warns the same). Not when
        this fit resumed from a checkpoint in that folder: continuing there is the point. Runs after the restore,
        so the files the restored state names (this run's own) do not count."""
        dirpath = self.dirpath  # resolved in setup
        if (self.save_top_k == 0 and not self.save_last) or dirpath is None or not os.path.isdir(dirpath):
            return
        folder = os.path.abspath(dirpath)
        resumed = trainer.ckpt_path
        if resumed is not None and os.path.dirname(os.path.abspath(resumed)) == folder:
            return
        kept = (*self.best_k_models, *self._latest, self.best_model_path, self.last_model_path)
        warn_of_other_runs(dirpath, self.FILE_EXTENSION, kept)

    def on_train_batch_end(
        self, trainer: "Trainer", pl_module: "TrainingModule", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (self.every_n_train_steps <= 0 and self.train_time_interval is None) or self._skip(trainer):
            return  # the first test is all the per-step cost of an epoch schedule
        step = trainer.global_step
        due = self.every_n_train_steps > 0 and step % self.every_n_train_steps == 0
        if self.train_time_interval is not None:
            now = time.monotonic()
            elapsed = now - (self._last_time_checked if self._last_time_checked is not None else now)
            # rank 0's clock decides: ranks whose clocks disagree would otherwise save different steps
            if trainer.strategy.broadcast(elapsed >= self.train_time_interval.total_seconds()):
                self._last_time_checked, due = now, True
        if due:
            self._save(trainer, top_k=True, last=True)

    def on_train_epoch_end(self, trainer: "Trainer", pl_module: "TrainingModule") -> None:
        if not self._skip(trainer) and self._on_train_epoch_end(trainer):
            self._save(trainer, top_k=self._epoch_due(trainer), last=False)

    def on_validation_end(self, trainer: "Trainer", pl_module: "TrainingModule") -> None:
        if trainer.sanity_checking:
            return
        self._validated = True
        if not self._skip(trainer) and not self._on_train_epoch_end(trainer):
            self._save(trainer, top_k=self._epoch_due(trainer), last=False)

    def on_train_end(self, trainer: "Trainer", pl_module: "TrainingModule") -> None:
        """``save_last`` when the fit wrote no checkpoint (Lightning's rule): ``last.ckpt`` of its final state."""
        if self.save_last and not self._last_checkpoint_saved and not self._skip(trainer):
            self._save(trainer, top_k=False, last=True)

    def _epoch_due(self, trainer: "Trainer") -> bool:
        return self.every_n_epochs > 0 and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    def _on_train_epoch_end(self, trainer: "Trainer") -> bool:
        """Whether epoch save points are at the training epoch end (else at validation ends); Lightning's rule."""
        if self.save_on_train_epoch_end is not None:
            return self.save_on_train_epoch_end
        return trainer.fit_loop.validates_only_at_epoch_ends

    def _skip(self, trainer: "Trainer") -> bool:
        already_saved = trainer.global_step == self._last_global_step_saved
        return bool(trainer.sanity_checking or trainer.fast_dev_run or trainer.state.fn != "fit" or already_saved)

    # ------------------------------------------------------------------ saving
    def _save(self, trainer: "Trainer", top_k: bool, last: bool) -> None:
        """A save point: the top k when ``top_k``; ``last.ckpt`` when ``last`` (step and time save points), else
        only when this step's top-k checkpoint was written (Lightning 2.6: "a copy whenever a checkpoint file gets
        saved"), or to point the link at the latest checkpoint again."""
        metrics = monitor_candidates(trainer)
        before = self.state_dict()
        try:
            if top_k and self.save_top_k != 0:
                self._save_top_k(trainer, metrics)
            saved_now = self._last_global_step_saved == trainer.global_step
            if self.save_last and (last or saved_now or self._links_last()):
                self._save_last(trainer, metrics)
        except (_Skipped, NonFiniteError) as reason:
            # The parameters hold NaN or inf, so nothing was written: as if this save point had not come (no
            # ranking of a file that does not exist, no deletion of the previous ones).
            self._restore(before)
            self._last_global_step_saved = trainer.global_step
            if isinstance(reason, NonFiniteError):
                raise

    def _current(self, trainer: "Trainer", metrics: Mapping[str, Any], monitor: str) -> torch.Tensor | None:
        """This rank's value of the monitored metric, as a tensor (Lightning's ``current_score``); NaN ranks last;
        None when the metric was not logged before the first validation (a warning, as in Lightning). Whether it
        was logged is rank 0's view (``metrics``), so every rank takes the same path."""
        if monitor not in metrics:
            available = [k for k in metrics if k not in ("epoch", "step")]
            if self._validated:
                raise missing_metric("ModelCheckpoint", monitor, available)
            if not self._warned_missing:
                self._warned_missing = True
                rank_zero_warn(
                    f"ModelCheckpoint(monitor={monitor!r}) found no such metric at step {trainer.global_step} "
                    f"(logged: {sorted(available)}); no top-k checkpoint is saved until it is logged. If it is a "
                    "validation metric, this is expected before the first validation."
                )
            return None
        return current_score(trainer, metrics, monitor, self.mode)

    def _makes_top_k(self, trainer: "Trainer", current: torch.Tensor) -> bool:
        """Lightning's ``check_monitor_top_k``: while fewer than k are kept, yes; else only when every rank finds
        its own value better than its k-th (one reduction), so a metric logged without ``sync_dist`` saves
        where Lightning saves."""
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        better_here = better(current, self.best_k_models[self.kth_best_model_path], self.mode)
        return trainer.strategy.reduce_boolean_decision(better_here)

    def _save_top_k(self, trainer: "Trainer", metrics: dict[str, Any]) -> None:
        if self.monitor is None:
            self._save_latest(trainer, metrics)
            return
        current = self._current(trainer, metrics, self.monitor)
        if current is None:
            return
        where = f"Epoch {trainer.current_epoch}, global step {trainer.global_step}"
        if not self._makes_top_k(trainer, current):
            if self.verbose:
                rank_zero_info(f"{where}: {self.monitor!r} was not in top {self.save_top_k}")
            return
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        dropped = None
        if len(self.best_k_models) == k:
            dropped = self.kth_best_model_path
            del self.best_k_models[dropped]
        path = self._free_path(trainer, metrics, keep=dropped)
        self.current_score = current
        self.best_k_models[path] = current
        self._update_best(k)
        if self.verbose:
            rank_zero_info(
                f"{where}: {self.monitor!r} reached {current:0.5f} (best {self.best_model_score:0.5f}), "
                f"saving model to {path!r} as top {k}"
            )
        self._write(trainer, path)  # the callback's state saved with it already counts this file
        if dropped is not None and dropped not in (path, self.last_model_path):
            remove(trainer, self.dirpath, dropped)

    def _save_latest(self, trainer: "Trainer", metrics: dict[str, Any]) -> None:
        """No monitor: ``best_model_path`` is the checkpoint just written, and the latest ``save_top_k`` are kept
        (all with -1); no score is kept (Lightning's ``_save_none_monitor_checkpoint``)."""
        path = self._free_path(trainer, metrics, keep=self.best_model_path or None)
        self._latest = [p for p in self._latest if p != path] + [path]
        dropped = self._latest[: -self.save_top_k] if self.save_top_k > 0 else []
        del self._latest[: len(dropped)]
        self.best_model_path = path  # set first: it is part of the state saved in the file
        if self.verbose:
            rank_zero_info(
                f"Epoch {trainer.current_epoch}, global step {trainer.global_step}: saving model to {path!r}"
            )
        self._write(trainer, path)
        for old in dropped:
            if old not in (path, self.last_model_path):
                remove(trainer, self.dirpath, old)

    def _write(self, trainer: "Trainer", path: str) -> None:
        # set first: part of the state saved in the file (last.ckpt and the top-k file of one step are alike)
        previous = self._last_global_step_saved, self._last_checkpoint_saved
        self._last_global_step_saved, self._last_checkpoint_saved = trainer.global_step, path
        try:
            written = trainer.save_checkpoint(path, self.save_weights_only)  # positional, as Lightning calls it
        except BaseException:
            self._last_global_step_saved, self._last_checkpoint_saved = previous
            raise
        if written is False:  # Trainer(on_nonfinite="warn") refused to write non-finite parameters
            self._last_global_step_saved, self._last_checkpoint_saved = previous
            raise _Skipped
        if trainer.is_global_zero:  # e.g. MLFlowLogger(log_model="all") logs the new file
            readers = [
                lg for lg in trainer.loggers if type(lg).after_save_checkpoint is not Logger.after_save_checkpoint
            ]
            if readers and trainer.strategy.checkpoint_io is not None:
                trainer.strategy.checkpoint_io.wait_for(path)  # written in the background: on the disk first
            for logger in trainer.loggers:
                logger.after_save_checkpoint(self)

    def _update_best(self, k: int) -> None:
        """Lightning's choice among equal scores: the first kept is the best, and the first of the worst is the
        k-th (the next to go)."""
        best, worst = (max, min) if self.mode == "max" else (min, max)
        if len(self.best_k_models) == k:
            self.kth_best_model_path = worst(self.best_k_models, key=self.best_k_models.__getitem__)
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        self.best_model_path = best(self.best_k_models, key=self.best_k_models.__getitem__)
        self.best_model_score = self.best_k_models[self.best_model_path]

    def _free_path(self, trainer: "Trainer", metrics: Mapping[str, Any], keep: str | None) -> str:
        """The formatted path; with the version counter, ``-v1``, ``-v2``... appended while that file
        exists (rank 0 looks)."""
        if not self._warned_filename:
            self._warned_filename = warn_unlogged_filename_metrics(self.filename, metrics)
        path = self.format_checkpoint_name(metrics)
        version = self.STARTING_VERSION
        while self.enable_version_counter and path != keep and (path in self.best_k_models or exists(trainer, path)):
            path = self.format_checkpoint_name(metrics, ver=version)
            version += 1
        # rank 0's name on every rank: another rank's kept files (its own scores rank them) may differ
        return trainer.strategy.broadcast(path)

    def _save_last(self, trainer: "Trainer", metrics: Mapping[str, Any]) -> None:
        previous = self.last_model_path
        path = self.format_checkpoint_name(metrics, self.CHECKPOINT_NAME_LAST)
        version = self.STARTING_VERSION
        while self.enable_version_counter and path != previous and exists(trainer, path):
            path = self.format_checkpoint_name(metrics, self.CHECKPOINT_NAME_LAST, ver=version)
            version += 1
        self.last_model_path = path  # set first: it is part of the state saved in the file
        if self._links_last() and self.save_top_k != 0:
            link(trainer, self._last_checkpoint_saved, path)
        else:
            self._write(trainer, path)
        if previous and previous != path and previous not in self.best_k_models:
            remove(trainer, self.dirpath, previous)

    def _links_last(self) -> bool:
        return self.save_last == "link" and bool(self._last_checkpoint_saved)

    # ------------------------------------------------------------------ names
    def format_checkpoint_name(
        self, metrics: Mapping[str, Any], filename: str | None = None, ver: int | None = None
    ) -> str:
        """The checkpoint path for ``metrics`` (name -> number or 0-dim tensor).

        Example:
            ```python
            ModelCheckpoint(dirpath="ckpts", filename="{epoch}-{val_loss:.2f}").format_checkpoint_name(
                {"epoch": 3, "val_loss": 0.1234})  # 'ckpts/epoch=3-val_loss=0.12.ckpt'
            ```
        """
        name = format_name(
            filename or self.filename,
            metrics,
            self.auto_insert_metric_name,
            ModelCheckpoint.CHECKPOINT_JOIN_CHAR,
            ModelCheckpoint.CHECKPOINT_EQUALS_CHAR,
        )
        if ver is not None:
            name = f"{name}{self.CHECKPOINT_JOIN_CHAR}v{ver}"
        name += self.FILE_EXTENSION
        return os.path.join(self.dirpath, name) if self.dirpath else name

    def to_yaml(self, filepath: str | os.PathLike | None = None) -> None:
        """Write ``best_k_models`` (path -> score as a float) as YAML to ``filepath`` (default:
        ``<dirpath>/best_k_models.yaml``), atomically.

        Example:
            ```python
            checkpoint.to_yaml()  # after fit: {'/run/checkpoints/epoch=3-step=400.ckpt': 0.21, ...}
            ```
        """
        import yaml  # a dependency of omegaconf's

        if filepath is None:
            if self.dirpath is None:
                raise CheckpointError(
                    "ModelCheckpoint.to_yaml(): no dirpath yet; pass a filepath, or call it after fit."
                )
            filepath = os.path.join(self.dirpath, "best_k_models.yaml")
        text = yaml.dump({path: score.item() for path, score in self.best_k_models.items()})

        def write(file: IO[bytes]) -> None:
            file.write(text.encode())

        atomic_write(filepath, write, "the best_k_models YAML file")

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "monitor": self.monitor,
            "best_model_score": self.best_model_score,
            "best_model_path": self.best_model_path,
            "current_score": self.current_score,
            "best_k_models": dict(self.best_k_models),
            "kth_best_model_path": self.kth_best_model_path,
            "kth_value": self.kth_value,
            "dirpath": self.dirpath,
            "last_model_path": self.last_model_path,
            "last_global_step_saved": self._last_global_step_saved,
        }
        if self.monitor is None and self.save_top_k > 1:  # the latest k, oldest first: which one goes next
            state["latest_model_paths"] = list(self._latest)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.dirpath is None:  # the Trainer restored before setup: wait for the dirpath
            self._pending_state = state
        else:
            self._restore(state)

    def _restore(self, state: dict[str, Any]) -> None:
        """The whole ranking comes back, so the best of the run stays the best after a resume. When the run
        saved elsewhere before (a new ``version_<n>`` folder per launch), its files keep their rank there and
        are never deleted from here; the last checkpoint is then written afresh in this folder. A folder that is
        not another version of the run's gets Lightning's warning ("The dirpath has changed ...")."""
        self.best_model_path = state["best_model_path"]
        self.best_model_score = as_score_or_none(state["best_model_score"])
        self.current_score = as_score_or_none(state.get("current_score"))
        best_k_models = {path: as_score(score) for path, score in state["best_k_models"].items()}
        if self.monitor is None:  # no scores; tandem before Lightning's rule ranked these files by step
            self.best_k_models, self.best_model_score = {}, None
            by_step = sorted(best_k_models, key=best_k_models.__getitem__)
            self._latest = list(state.get("latest_model_paths", by_step or [self.best_model_path]))
            self._latest = [p for p in self._latest if p]
        else:  # the k-th means something only where scores rank the files
            self.best_k_models = best_k_models
            self.kth_best_model_path = state["kth_best_model_path"]
            if state["kth_value"] is not None:  # None: written by tandem before 0-dim tensors, fewer than k kept
                self.kth_value = as_score(state["kth_value"])
        self._last_global_step_saved = state.get("last_global_step_saved", -1)
        saved_in = state.get("dirpath", self.dirpath)  # as Lightning: a state without one is this folder's
        if saved_in == self.dirpath:
            self.last_model_path = state["last_model_path"]
        else:
            report_moved_folder(saved_in, self.dirpath, self.best_k_models, self.best_model_path, self.save_top_k)


class _Skipped(Exception):
    """A save the Trainer skipped (the parameters hold NaN or inf)."""
