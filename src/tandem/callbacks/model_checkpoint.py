"""ModelCheckpoint: save the k best checkpoints by a monitored metric, and/or the last one."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from tandem.callbacks.callback import Callback
from tandem.utilities.checkpoint import check_writable_folder
from tandem.utilities.exceptions import FileWriteError, bad_choice, incompatible, missing_metric, out_of_range
from tandem.utilities.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer

_MODES = ("min", "max")
_MODE_FIX = "Use 'min' for losses, 'max' for accuracies."


class ModelCheckpoint(Callback):
    """Save checkpoints during training: the ``save_top_k`` best by ``monitor``, and/or ``last.ckpt``.

    A save event happens every ``every_n_train_steps`` optimizer steps, or else at the end of every
    ``every_n_epochs``-th training epoch (after that epoch's validation, so validation metrics can be
    monitored). Nothing is saved during the sanity check or with ``fast_dev_run``. Every decision uses the
    metric value of global rank 0, so all processes save and delete the same files.

    Args:
        dirpath: folder of the checkpoints. Default: ``<log_dir of the first logger>/checkpoints``, or
            ``<default_root_dir>/checkpoints`` without loggers.
        filename: name template without extension. Default ``"{epoch}-{step}"`` gives
            ``epoch=0-step=100.ckpt``; metric names and format specs work too: ``"{epoch}-{val_loss:.2f}"``.
        monitor: the logged metric that ranks checkpoints. ``None`` ranks them by step (the latest are kept).
        mode: ``"min"`` when lower is better (losses), ``"max"`` when higher is better (accuracies).
        save_top_k: how many of the best to keep; ``-1`` keeps all, ``0`` none (``save_last`` still works).
        save_last: also write ``last.ckpt`` at every save event (overwritten each time).
        every_n_train_steps: save every this many optimizer steps (0 or None: not by steps).
        every_n_epochs: save every this many epochs (default 1 when no step interval is set; 0: never).
        auto_insert_metric_name: write ``{epoch}`` as ``epoch=3`` rather than ``3``.
        verbose: say what was saved.

    Example::

        checkpoint = ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=3, save_last=True)
        trainer = Trainer(callbacks=[checkpoint], max_epochs=10)
        trainer.fit(module, datamodule=data)
        print(checkpoint.best_model_path, checkpoint.best_model_score)
    """

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        mode: str = "min",
        save_top_k: int = 1,
        save_last: bool | None = None,
        every_n_train_steps: int | None = None,
        every_n_epochs: int | None = None,
        auto_insert_metric_name: bool = True,
        verbose: bool = False,
    ) -> None:
        if mode not in _MODES:
            raise bad_choice("ModelCheckpoint: mode", mode, _MODES, _MODE_FIX)
        if not isinstance(save_top_k, int) or save_top_k < -1:
            raise out_of_range("ModelCheckpoint: save_top_k", save_top_k, "an int >= -1 (-1 keeps all)")
        for arg, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise out_of_range(f"ModelCheckpoint: {arg}", value, "None or an int >= 0")
        if (every_n_train_steps or 0) > 0 and (every_n_epochs or 0) > 0:
            raise incompatible(
                f"ModelCheckpoint(every_n_train_steps={every_n_train_steps}, every_n_epochs={every_n_epochs})",
                "a checkpoint is saved either by steps or by epochs, not both",
                "Pass only one of them (use two ModelCheckpoint callbacks for both schedules).",
            )
        if every_n_train_steps is None and every_n_epochs is None:
            every_n_epochs = 1
        self._user_dirpath = os.fspath(dirpath) if dirpath is not None else None
        self.dirpath: str | None = self._user_dirpath
        self.filename = filename
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = save_top_k
        self.save_last = save_last
        self.every_n_train_steps = every_n_train_steps or 0
        self.every_n_epochs = every_n_epochs or 0
        self.auto_insert_metric_name = auto_insert_metric_name
        self.verbose = verbose

        self.best_k_models: dict[str, float] = {}  # path -> score (the step when there is no monitor)
        self.kth_best_model_path = ""
        self.kth_value: float | None = None
        self.best_model_path = ""
        self.best_model_score: float | None = None
        self.last_model_path = ""
        self._last_global_step_saved = -1
        self._pending_state: dict[str, Any] | None = None  # restored before setup resolved the dirpath

    @property
    def state_key(self) -> str:
        key = {
            "monitor": self.monitor,
            "mode": self.mode,
            "every_n_train_steps": self.every_n_train_steps,
            "every_n_epochs": self.every_n_epochs,
        }
        return f"{type(self).__qualname__}{key!r}"

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: Trainer, module: TrainingModule, stage: str) -> None:
        if self._user_dirpath is None:
            logger = trainer.loggers[0] if trainer.loggers else None
            log_dir = getattr(logger, "log_dir", None)
            base = log_dir if log_dir is not None else trainer.default_root_dir
            self.dirpath = trainer.strategy.broadcast(os.path.join(os.fspath(base), "checkpoints"))
        if stage == "fit":  # find an unwritable folder now, not at the first save after an epoch of work
            problem = None
            if trainer.is_global_zero:  # the rank that writes
                try:
                    check_writable_folder(self.dirpath, "the ModelCheckpoint folder")
                except FileWriteError as err:
                    problem = (err.errno, f"{err} (Checked before training, so no work is lost.)", self.dirpath)
            problem = trainer.strategy.broadcast(problem)
            if problem is not None:
                raise FileWriteError(*problem)
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            self._restore(state)

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if self.every_n_train_steps <= 0 or step == 0 or step % self.every_n_train_steps != 0:
            return
        if not self._skip(trainer):
            self._save(trainer)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainingModule) -> None:
        if self.every_n_train_steps > 0 or self.every_n_epochs <= 0:
            return
        if (trainer.current_epoch + 1) % self.every_n_epochs == 0 and not self._skip(trainer):
            self._save(trainer)

    def _skip(self, trainer: Trainer) -> bool:
        already_saved = trainer.global_step == self._last_global_step_saved
        return bool(trainer.sanity_checking or trainer.fast_dev_run or already_saved)

    # ------------------------------------------------------------------ saving
    def _save(self, trainer: Trainer) -> None:
        metrics = self._monitor_candidates(trainer)
        self._last_global_step_saved = trainer.global_step
        if self.save_top_k != 0:
            self._save_top_k(trainer, metrics)
        if self.save_last:
            self._save_last(trainer, metrics)

    def _monitor_candidates(self, trainer: Trainer) -> dict[str, Any]:
        """Global rank 0's metrics, as numbers: every rank then names, ranks and deletes the same files."""
        metrics = {name: _number(value) for name, value in trainer.callback_metrics.items()}
        metrics.setdefault("epoch", trainer.current_epoch)
        metrics["step"] = trainer.global_step
        return trainer.strategy.broadcast(metrics)

    def _score(self, trainer: Trainer, metrics: Mapping[str, Any]) -> float:
        """Rank 0's value of the monitored metric (the step without a monitor); NaN ranks last."""
        if self.monitor is None:
            return float(trainer.global_step)
        value = metrics.get(self.monitor)  # rank 0's (see _monitor_candidates)
        score = float(value) if value is not None else None
        if score is None:
            available = [k for k in metrics if k not in ("epoch", "step")]
            raise missing_metric("ModelCheckpoint", self.monitor, available)
        if math.isnan(score):
            score = math.inf if self.mode == "min" else -math.inf
        return score

    def _better(self, a: float, b: float) -> bool:
        maximize = self.monitor is None or self.mode == "max"
        return a > b if maximize else a < b

    def _save_top_k(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        score = self._score(trainer, metrics)
        full = self.save_top_k != -1 and len(self.best_k_models) >= self.save_top_k
        if full and not self._better(score, self.kth_value):
            if self.verbose:
                where = f"Epoch {trainer.current_epoch}, step {trainer.global_step}"
                rank_zero_info(f"{where}: {self.monitor!r} was not in the top {self.save_top_k}")
            return
        dropped = None
        if full:
            dropped = self.kth_best_model_path
            del self.best_k_models[dropped]
        path = self._free_path(trainer, metrics, keep=dropped)
        self.best_k_models[path] = score
        self._update_best()
        if self.verbose:
            where = f"Epoch {trainer.current_epoch}, step {trainer.global_step}"
            what = ""
            if self.monitor is not None:
                what = f"{self.monitor!r} reached {score:0.5f} (best {self.best_model_score:0.5f}), "
            rank_zero_info(f"{where}: {what}saving {path!r}")
        trainer.save_checkpoint(path)  # the callback's state saved with it already counts this file
        if dropped is not None and dropped not in (path, self.last_model_path):
            trainer.strategy.remove_checkpoint(dropped)

    def _update_best(self) -> None:
        best_first = self._better(1.0, 0.0)  # True when higher is better
        ranked = sorted(self.best_k_models, key=self.best_k_models.__getitem__, reverse=best_first)
        self.best_model_path = ranked[0]
        self.best_model_score = self.best_k_models[ranked[0]] if self.monitor is not None else None
        if self.save_top_k == -1 or len(ranked) >= self.save_top_k:
            self.kth_best_model_path = ranked[-1]
            self.kth_value = self.best_k_models[ranked[-1]]

    def _free_path(self, trainer: Trainer, metrics: Mapping[str, Any], keep: str | None) -> str:
        """The formatted path, with ``-v1``, ``-v2``... appended while that file exists (rank 0 looks)."""
        path = self.format_checkpoint_name(metrics)
        version = 0
        while path != keep and (path in self.best_k_models or self._exists(trainer, path)):
            version += 1
            path = self.format_checkpoint_name(metrics, ver=version)
        return path

    @staticmethod
    def _exists(trainer: Trainer, path: str) -> bool:
        return trainer.strategy.broadcast(os.path.isfile(path))  # rank 0's view: other nodes may not see it

    def _save_last(self, trainer: Trainer, metrics: Mapping[str, Any]) -> None:
        previous, path = self.last_model_path, self.format_checkpoint_name(metrics, self.CHECKPOINT_NAME_LAST)
        self.last_model_path = path
        trainer.save_checkpoint(path)
        if previous and previous != path and previous not in self.best_k_models:
            trainer.strategy.remove_checkpoint(previous)

    # ------------------------------------------------------------------ names
    def format_checkpoint_name(
        self, metrics: Mapping[str, Any], filename: str | None = None, ver: int | None = None
    ) -> str:
        """The checkpoint path for ``metrics`` (name -> number or 0-dim tensor).

        Example::

            ModelCheckpoint(dirpath="ckpts", filename="{epoch}-{val_loss:.2f}").format_checkpoint_name(
                {"epoch": 3, "val_loss": 0.1234})  # 'ckpts/epoch=3-val_loss=0.12.ckpt'
        """
        name = _format_name(filename or self.filename, metrics, self.auto_insert_metric_name)
        if ver is not None:
            name = f"{name}{self.CHECKPOINT_JOIN_CHAR}v{ver}"
        name += self.FILE_EXTENSION
        return os.path.join(self.dirpath, name) if self.dirpath else name

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor,
            "best_model_score": self.best_model_score,
            "best_model_path": self.best_model_path,
            "best_k_models": dict(self.best_k_models),
            "kth_best_model_path": self.kth_best_model_path,
            "kth_value": self.kth_value,
            "dirpath": self.dirpath,
            "last_model_path": self.last_model_path,
            "last_global_step_saved": self._last_global_step_saved,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.dirpath is None:  # the Trainer restored before setup: wait for the dirpath
            self._pending_state = state
        else:
            self._restore(state)

    def _restore(self, state: dict[str, Any]) -> None:
        self.best_model_path = state["best_model_path"]
        self._last_global_step_saved = state.get("last_global_step_saved", -1)
        if state.get("dirpath") != self.dirpath:
            # another folder: ranking or deleting the old run's files from here would be wrong
            rank_zero_info(
                f"ModelCheckpoint: the checkpoint folder changed from {state.get('dirpath')!r} to "
                f"{self.dirpath!r}; only best_model_path is restored, the top-k ranking starts afresh."
            )
            return
        self.best_model_score = state["best_model_score"]
        self.best_k_models = dict(state["best_k_models"])
        self.kth_best_model_path = state["kth_best_model_path"]
        self.kth_value = state["kth_value"]
        self.last_model_path = state["last_model_path"]


def _format_name(template: str | None, metrics: Mapping[str, Any], auto_insert_metric_name: bool) -> str:
    """Fill ``{name}`` / ``{name:fmt}`` placeholders; a name that was not logged is written as 0."""
    filename = template or f"{{epoch}}{ModelCheckpoint.CHECKPOINT_JOIN_CHAR}{{step}}"
    values: dict[str, Any] = {}
    for group in sorted(set(re.findall(r"(\{.*?)[:}]", filename)), key=len, reverse=True):
        name = group[1:]
        if auto_insert_metric_name:
            filename = filename.replace(group, f"{name}{ModelCheckpoint.CHECKPOINT_EQUALS_CHAR}{{{name}")
        filename = filename.replace(group, f"{{0[{name}]")  # indexing lets names hold dots and slashes
        values[name] = _number(metrics.get(name, 0))
    return filename.format(values)


def _number(value: Any) -> int | float:
    if isinstance(value, torch.Tensor):
        return int(value.item()) if not value.is_floating_point() else float(value.item())
    return value
