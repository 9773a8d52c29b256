"""ModelCheckpoint's files: the folder they go to (the default one, checked writable before training, another run's
checkpoints in it, a resumed run's earlier folder), their names (the ``filename`` template filled in from the logged
metrics), and what rank 0 does to them for every rank (finds one, links ``last.ckpt``, removes one)."""

import os
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from tandem.callbacks.model_checkpoint_scores import as_number
from tandem.loggers.logger import VERSION_DIR
from tandem.utilities.atomic import atomic_link, check_writable_folder
from tandem.utilities.exceptions import FileWriteError
from tandem.utilities.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from tandem.trainer.trainer import Trainer


# ---------------------------------------------------------------------------------------------- the folder


def default_dirpath(trainer: "Trainer") -> str:
    """``<log_dir of the first logger>/checkpoints``, or ``<default_root_dir>/checkpoints`` without loggers."""
    logger = trainer.loggers[0] if trainer.loggers else None
    log_dir = getattr(logger, "log_dir", None)
    base = log_dir if log_dir is not None else trainer.default_root_dir
    return os.path.join(os.fspath(base), "checkpoints")


def check_writable(trainer: "Trainer", dirpath: str) -> None:
    """Raise [`FileWriteError`][tandem.utilities.exceptions.FileWriteError] on every rank when global rank 0 (the
    rank that writes) cannot create files in ``dirpath``."""
    problem = None
    if trainer.is_global_zero:  # the rank that writes
        try:
            check_writable_folder(dirpath, "the ModelCheckpoint folder")
        except FileWriteError as err:
            problem = (err.errno, f"{err} (Checked before training, so no work is lost.)", dirpath)
    problem = trainer.strategy.broadcast(problem)
    if problem is not None:
        raise FileWriteError(*problem)


def warn_of_other_runs(dirpath: str, extension: str, kept: Iterable[str]) -> None:
    """Warn when ``dirpath`` holds checkpoints (``*<extension>``) other than the ``kept`` ones (this run's own)."""
    folder = os.path.abspath(dirpath)
    own = {os.path.abspath(p) for p in kept if p}
    foreign = sorted(
        name for name in os.listdir(folder) if name.endswith(extension) and os.path.join(folder, name) not in own
    )
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        rank_zero_warn(
            f"Checkpoint directory {dirpath} exists and is not empty: it holds {len(foreign)} checkpoint(s) "
            f"of another run ({shown}). This run's checkpoints will mix with them (same names get a -v1 "
            "suffix). Give this run its own ModelCheckpoint(dirpath=...), or a logger (a new version folder "
            "per run); to continue that run instead, pass fit(..., ckpt_path=<its checkpoint>)."
        )


def report_moved_folder(
    saved_in: Any, dirpath: str | None, best_k_models: Mapping[str, Any], best_model_path: str, save_top_k: int
) -> None:
    """A restored state saved in ``saved_in``, another folder than ``dirpath``: a note when it is an earlier
    ``version_<n>`` of the run, else Lightning's warning, with what tandem keeps."""
    if _sibling_versions(saved_in, dirpath):  # tandem's resume: each launch gets its own version_<n>
        if best_k_models:
            rank_zero_info(
                f"ModelCheckpoint: resumed a run that saved its checkpoints in {saved_in!r}; they keep their "
                f"rank in the top {save_top_k} (best: {best_model_path!r}) and stay where they are. "
                f"New checkpoints go to {dirpath!r}."
            )
    else:  # another folder than the run's: Lightning's warning, with what tandem keeps
        kept = (
            f"the run's top {save_top_k} keep their rank (best: {best_model_path!r}) and stay where "
            "they are, never deleted from here"
            if best_k_models
            else f"only `best_model_path` ({best_model_path!r}) is reloaded"
        )
        rank_zero_warn(
            f"The dirpath has changed from {saved_in!r} to {dirpath!r}: `last_model_path` is not reloaded "
            f"(last.ckpt is written afresh in the new folder), and {kept}. Checkpoints go to the new folder from "
            "now on; pass ModelCheckpoint(dirpath=<the old folder>) to continue there instead."
        )


def exists(trainer: "Trainer", path: str) -> bool:
    return trainer.strategy.broadcast(os.path.exists(path))  # rank 0's view (a sharded checkpoint is a folder)


def link(trainer: "Trainer", target: str, path: str) -> None:
    """``save_last="link"``: rank 0 points ``path`` at ``target`` (a relative symbolic link, or a copy where
    links cannot be made), atomically; every rank then waits for it."""
    if trainer.is_global_zero and os.path.abspath(target) != os.path.abspath(path):
        checkpoint_io = trainer.strategy.checkpoint_io
        # a copy (where links cannot be made) needs the target on the disk: a background write finished
        ready = None if checkpoint_io is None else lambda: checkpoint_io.wait_for(target)
        atomic_link(target, path, what="the last checkpoint", before_copy=ready)
    trainer.strategy.barrier()


def remove(trainer: "Trainer", dirpath: str | None, path: str) -> None:
    """Delete a checkpoint the callback no longer keeps, unless it lives outside ``dirpath`` (a file of
    an earlier launch of the run, in its own folder: never deleted from here) or is the checkpoint this fit
    resumed from (as in Lightning)."""
    folder = os.path.abspath(dirpath or ".")
    resumed = trainer.ckpt_path is not None and os.path.abspath(trainer.ckpt_path) == os.path.abspath(path)
    if os.path.dirname(os.path.abspath(path)) == folder and not resumed:
        trainer.strategy.remove_checkpoint(path)


# ---------------------------------------------------------------------------------------------- the names


def warn_unlogged_filename_metrics(filename: str | None, metrics: Mapping[str, Any]) -> bool:
    """A ``filename`` placeholder that names no logged metric is written as 0 (as in Lightning): say so,
    once, with the names that were logged (a misspelt ``{val_acc}`` would otherwise go unnoticed). Returns whether
    it warned."""
    missing = [name for name in placeholders(filename) if name not in metrics]
    if not missing:
        return False
    logged = sorted(k for k in metrics if k not in ("epoch", "step"))
    rank_zero_warn(
        f"ModelCheckpoint(filename={filename!r}) names {', '.join(repr(m) for m in missing)}, which was "
        f"not logged (logged: {logged}), so it is written as 0 in the checkpoint names. Log it with "
        f"self.log({missing[0]!r}, value), or name a logged metric in the filename. If it is a validation "
        "metric, it exists only once validation has run before the save. (Shown once.)"
    )
    return True


def placeholders(template: str | None) -> list[str]:
    """The metric names a ``filename`` template fills in (``"{epoch}-{val_loss:.2f}"``: epoch, val_loss)."""
    return sorted({group[1:] for group in re.findall(r"(\{.*?)[:}]", template or "")})


def format_name(
    template: str | None, metrics: Mapping[str, Any], auto_insert_metric_name: bool, join_char: str, equals_char: str
) -> str:
    """Fill ``{name}`` / ``{name:fmt}`` placeholders; a name that was not logged is written as 0."""
    filename = template or f"{{epoch}}{join_char}{{step}}"
    values: dict[str, Any] = {}
    for group in sorted(set(re.findall(r"(\{.*?)[:}]", filename)), key=len, reverse=True):
        name = group[1:]
        if auto_insert_metric_name:
            filename = filename.replace(group, f"{name}{equals_char}{{{name}")
        filename = filename.replace(group, f"{{0[{name}]")  # indexing lets names hold dots and slashes
        values[name] = as_number(metrics.get(name, 0))
    return filename.format(values)


def _sibling_versions(old: Any, new: str | None) -> bool:
    """Whether ``old`` and ``new`` are the ``checkpoints`` folders of two ``version_<n>`` of one experiment (a
    resumed run's own earlier launch)."""
    if not isinstance(old, str) or new is None:
        return False
    folders = [os.path.normpath(path) for path in (old, new)]
    return (
        all(
            os.path.basename(path) == "checkpoints" and VERSION_DIR.match(os.path.basename(os.path.dirname(path)))
            for path in folders
        )
        and len({os.path.dirname(os.path.dirname(path)) for path in folders}) == 1
    )
