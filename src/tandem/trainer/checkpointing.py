"""Checkpoints: the state a checkpoint holds, restoring a run from one, and what ``ckpt_path`` names
("best", "last" or a file). Writing files is the strategy's (rank 0 writes, atomically)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from tandem.trainer.replicas import check_replicas
from tandem.utilities.checkpoint import CHECKPOINT_MARKER
from tandem.utilities.checkpoint_format import from_plain, to_plain
from tandem.utilities.cloud_io import glob_files, is_url, modified_time
from tandem.utilities.exceptions import TandemConfigError, TandemUserCodeError, no_checkpoint_path
from tandem.utilities.rank_zero import rank_zero_warn
from tandem.utilities.seed import capture_rng_state
from tandem.utilities.temporaries import remove_stale_temporaries_in
from tandem.version import __version__

if TYPE_CHECKING:
    from tandem.strategies.replica_groups import LiveState
    from tandem.trainer.trainer import Trainer


def checkpoint_state(trainer: Trainer, weights_only: bool = False, check: bool = True) -> dict[str, Any]:
    """What a checkpoint holds, built on every rank: the weights and hparams, and unless ``weights_only`` the
    loop state, every optimizer and scheduler, the precision's scaler, callbacks, RNG states, DataModule.
    ``weights_only`` weights are always whole (gathered under FSDP, whatever its ``state_dict_type``): a file
    to load into a plain module. DDP's ranks are first checked to hold the same weights (rank 0's are saved),
    unless ``check=False`` (a live state built outside the main thread, see `live_state`)."""
    if check:
        check_replicas(trainer.strategy, "before saving a checkpoint", trainer.on_replica_divergence)
    module, strategy = trainer.fit_loop.context.module, trainer.strategy
    checkpoint: dict[str, Any] = {
        CHECKPOINT_MARKER: __version__,
        "epoch": trainer.current_epoch,
        "global_step": trainer.global_step,
        "state_dict": strategy.full_module_state_dict() if weights_only else strategy.module_state_dict(),
        "hparams": dict(module.hparams),
    }
    if trainer.datamodule is not None:
        checkpoint["datamodule_hparams"] = dict(trainer.datamodule.hparams)
    if not weights_only:
        checkpoint.update(
            loops=trainer.fit_loop.state_dict(),
            train_metrics=trainer.metric_collector.state_dict(),
            optimizer_states=[trainer.strategy.optimizer_state(o) for o in trainer.optimizers],
            lr_schedulers=[c.scheduler.state_dict() for c in trainer.lr_scheduler_configs],
            precision=trainer.strategy.precision.state_dict(),
            callbacks={c.state_key: c.state_dict() for c in trainer.callbacks},
            rng_states=capture_rng_state(),
        )
        if trainer.datamodule is not None:
            checkpoint["datamodule"] = trainer.datamodule.state_dict()
    trainer.call_hook("on_save_checkpoint", checkpoint)
    return checkpoint


def restore(
    trainer: Trainer,
    ckpt_path: str | os.PathLike,
    fn: str,
    rng: bool = True,
    announce: bool = True,
    weights_only: bool | None = None,
) -> str | None:
    """Load the weights; for ``fit``, everything the run needs to continue exactly. Returns the file loaded
    (None when ``ckpt_path="last"`` found none). Rank 0 first settles what killed saves left in the checkpoint's
    folder (only where the writer is gone): temporaries are removed, a sharded checkpoint moved aside by a
    replacement that never arrived is put back (see ``replace_directory``); the
    other ranks wait for it. ``rng=False``: the RNG states saved are not brought back (a tuner's search keeps the
    RNG as it was itself); ``announce=False``: a search's trial coming back, not a resume (nothing said of the
    data layout); ``weights_only=False``: the file is trusted, and unpickled in full (see
    ``load_checkpoint_file``)."""
    path = resolve_ckpt_path(trainer, ckpt_path, fn)
    if path is None:
        return None
    if trainer.is_global_zero and not is_url(path):  # the resumed run may write to another folder
        remove_stale_temporaries_in(os.path.dirname(os.path.abspath(path)))
    trainer.strategy.barrier("restore")  # every rank reads what rank 0 put back in place
    checkpoint = trainer.strategy.load_checkpoint(path, weights_only=weights_only)
    apply_checkpoint(trainer, checkpoint, path, fn, rng, announce)
    return path


def live_state(trainer: Trainer) -> LiveState:
    """The fit's state for its replica groups (``ddp_ft``): a joining group restores a peer's whole checkpoint, built
    in memory as plain data (as a file is written; it travels weights-only) and restored as from a file."""
    from tandem.strategies.replica_groups import LiveState

    source, warned = "the live state of a healthy replica group", set[tuple[str, str]]()

    def snapshot() -> dict[str, Any]:
        return to_plain(checkpoint_state(trainer, check=False), warned)

    def restore_live(checkpoint: dict[str, Any]) -> None:
        apply_checkpoint(trainer, from_plain(checkpoint, source, trusted=False), source, "fit")

    return LiveState(snapshot, restore_live, trainer.global_step)


def apply_checkpoint(
    trainer: Trainer, checkpoint: dict[str, Any], path: str, fn: str, rng: bool = True, announce: bool = True
) -> None:
    """Load ``checkpoint`` (read from ``path``, which messages name) as `restore` does."""
    module = trainer.strategy.module
    trainer.call_hook("on_load_checkpoint", checkpoint)
    try:
        trainer.strategy.load_module_state_dict(
            checkpoint["state_dict"], strict=getattr(module, "strict_loading", True)
        )
    except RuntimeError as err:
        raise TandemUserCodeError(f"Checkpoint {str(path)!r} does not fit {type(module).__name__}: {err}") from None
    if fn != "fit":
        return
    if "loops" not in checkpoint:
        raise TandemConfigError(
            f"Checkpoint {str(path)!r} holds weights only (saved with weights_only=True), so training cannot "
            "resume from it. Load the weights with model.load_state_dict(torch.load(path)['state_dict']) (or "
            f"{type(module).__name__}.load_from_checkpoint(path)) and fit without ckpt_path."
        )
    saved, optimizers = checkpoint["optimizer_states"], trainer.optimizers
    schedulers = trainer.lr_scheduler_configs
    if len(saved) != len(optimizers) or len(checkpoint["lr_schedulers"]) != len(schedulers):
        raise TandemConfigError(
            f"Checkpoint {str(path)!r} holds {len(saved)} optimizer(s) and {len(checkpoint['lr_schedulers'])} "
            f"scheduler(s), but configure_optimizers returned {len(optimizers)} and {len(schedulers)}. Resume "
            "with the configure_optimizers the checkpoint was trained with."
        )
    # mid-epoch: the epoch's partial metric sums come back too; the RNG states where the loop reaches their point
    rng_states = checkpoint.get("rng_states") if rng else None
    trainer.fit_loop.load_state_dict(checkpoint["loops"], checkpoint.get("train_metrics"), rng_states, announce)
    _check_max_epochs(trainer, checkpoint.get("epoch", 0), path)
    for optimizer, state in zip(optimizers, saved):
        trainer.strategy.load_optimizer_state(optimizer, state)
        if checkpoint.get("global_step", 0) > 0:
            _stepped_before(optimizer)
    for config, state in zip(schedulers, checkpoint["lr_schedulers"]):
        config.scheduler.load_state_dict(state)
    trainer.strategy.precision.load_state_dict(checkpoint.get("precision", {}))
    saved_callbacks = checkpoint.get("callbacks", {})
    for callback in trainer.callbacks:
        keys = (callback.state_key, *getattr(callback, "earlier_state_keys", ()))  # then a key of an earlier version
        key = next((k for k in keys if k in saved_callbacks), None)
        if key is not None:
            callback.load_state_dict(saved_callbacks[key])
    if trainer.datamodule is not None and "datamodule" in checkpoint:
        trainer.datamodule.load_state_dict(checkpoint["datamodule"])


def _check_max_epochs(trainer: Trainer, epoch: int, path: str) -> None:
    """Lightning's check: a checkpoint saved in epoch ``epoch`` (its ``current_epoch`` then, 0-based) cannot
    continue under a ``max_epochs`` below it; at or just above it, the fit ends at once, as in Lightning."""
    max_epochs = trainer.max_epochs
    if max_epochs is not None and max_epochs != -1 and epoch > max_epochs:
        raise TandemConfigError(
            f"You restored a checkpoint with current_epoch={epoch} ({str(path)!r}), but you have set "
            f"Trainer(max_epochs={max_epochs}): that run is already past the end. max_epochs counts all the "
            "epochs, not the ones to add: set it above the epochs already trained to train on, or fit without "
            "ckpt_path to start over."
        )


def _stepped_before(optimizer: Any) -> None:
    """The restored run's optimizer stepped before the checkpoint, as torch's LR schedulers see it: a scheduler
    wraps ``optimizer.step`` to set ``optimizer._opt_called``, and warns "Detected call of `lr_scheduler.step()`
    before `optimizer.step()`" at its first step (``_step_count == 1``, restored from a checkpoint written before
    it ever stepped) when that flag is unset. A resume whose first scheduler step comes before its first optimizer
    step (a stop between an epoch's last optimizer step and its scheduler's) is in order: no warning."""
    optimizer._opt_called = True


def best_checkpoint(trainer: Trainer) -> str | None:
    """The monitored best checkpoint of the first ModelCheckpoint, if it saved one."""
    callback = trainer.checkpoint_callback
    if callback is None or callback.monitor is None or not callback.best_model_path:
        return None
    return callback.best_model_path


def resolve_ckpt_path(trainer: Trainer, ckpt_path: str | os.PathLike, fn: str) -> str | None:
    """The file to load. "best" is the same on every rank (checkpoint decisions are rank 0's);
    "last" is searched for on rank 0 and broadcast, so every rank loads the same file."""
    if ckpt_path == "best":
        callback = trainer.checkpoint_callback
        if callback is None:
            raise TandemConfigError(
                f"trainer.{fn}(ckpt_path='best') needs a ModelCheckpoint; add callbacks=[ModelCheckpoint(monitor="
                "'val_loss')] or pass a checkpoint file."
            )
        if callback.monitor is None and not callback.best_model_path and callback.last_model_path:
            # Lightning's meaning: with no monitor, best_model_path is the latest checkpoint; with save_top_k=0
            # only last.ckpt is that
            return trainer.strategy.broadcast(callback.last_model_path)
        if not callback.best_model_path:
            raise TandemConfigError(
                f"trainer.{fn}(ckpt_path='best') found no saved checkpoint: the ModelCheckpoint has not saved one "
                "yet. Fit first, or pass a checkpoint file."
            )
        # rank 0's: another rank ranks by its own values of the monitor (see ModelCheckpoint), and every rank
        # must load the same file
        return trainer.strategy.broadcast(callback.best_model_path)
    if ckpt_path == "last":
        return trainer.strategy.broadcast(find_last_checkpoint(trainer) if trainer.is_global_zero else None)
    if not os.fspath(ckpt_path):
        raise TandemConfigError(no_checkpoint_path(f"trainer.{fn}(ckpt_path='')"))
    return os.fspath(ckpt_path)


def own_checkpoint_folders(trainer: Trainer) -> list[str]:
    """Where ``ckpt_path="last"`` looks: the checkpoint callbacks' folders, and the ``checkpoints`` folder of each
    of this run's versions. A logger that numbers its versions (``version_<n>``, the default) gives a new version
    to each launch, so every ``version_<n>`` of its experiment folder counts; a logger given a version by name
    (``version="exp-b"``) and a run without a logger count their own folder only. Other folders beside them
    (another experiment's, another named version's, whatever else is in the working directory) never count: a
    file there is not this run's, and whoever can write there could plant one."""
    from tandem.loggers.logger import VERSION_DIR

    folders = [callback.dirpath for callback in trainer.checkpoint_callbacks if callback.dirpath]
    folders.append(os.path.join(trainer.log_dir, "checkpoints"))  # where a pre-emption stop writes without one
    for logger in trainer.loggers:
        if logger.log_dir is None:  # no local folder (a remote MLflow or W&B run)
            continue
        if isinstance(logger.version, int) and logger.root_dir is not None:
            versions = glob_files(os.path.join(logger.root_dir, "version_*"))
            folders += [os.path.join(v, "checkpoints") for v in versions if VERSION_DIR.match(os.path.basename(v))]
        folders.append(os.path.join(logger.log_dir, "checkpoints"))
    return list(dict.fromkeys(folders))


def last_checkpoint_path(trainer: Trainer) -> str:
    """Where a ``last.ckpt`` written outside ModelCheckpoint's schedule (a pre-emption stop) goes, so that
    ``find_last_checkpoint`` finds it: the first ModelCheckpoint's ``last`` file, else the run folder's
    ``checkpoints`` (the folder a ModelCheckpoint would use)."""
    callback = trainer.checkpoint_callback
    if callback is not None and callback.dirpath:
        return callback.format_checkpoint_name({}, callback.CHECKPOINT_NAME_LAST)
    return os.path.join(trainer.log_dir, "checkpoints", "last.ckpt")


def find_last_checkpoint(trainer: Trainer) -> str | None:
    """Rank 0: the newest ``last*.ckpt`` of this run's own checkpoint folders (``own_checkpoint_folders``).
    Those folders are first settled (``remove_stale_temporaries_in``): a sharded
    ``last.ckpt`` whose replacement a kill interrupted is put back, so it is found."""
    folders = own_checkpoint_folders(trainer)
    candidates = []
    for folder in folders:
        if not is_url(folder):
            remove_stale_temporaries_in(folder)
        candidates += glob_files(os.path.join(folder, "last*.ckpt"))
    for path in [p for p in candidates if not is_url(p) and os.path.islink(p) and not os.path.exists(p)]:
        rank_zero_warn(f"{path} is a link to {os.readlink(path)}, which no longer exists: ckpt_path='last' skips it.")
        candidates.remove(path)
    candidates = sorted(set(candidates), key=modified_time)
    if not candidates:
        rank_zero_warn("ckpt_path='last' found no last.ckpt yet; training starts from scratch.")
        return None
    return candidates[-1]
