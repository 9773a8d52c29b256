"""SaveConfigCallback: the run's resolved config, written once as ``config.yaml`` next to its logs."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tandem.callbacks.callback import Callback
from tandem.cli.errors import CLIError
from tandem.loggers.logger import atomic_write_text
from tandem.utilities.cloud_io import read_text

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer


#: the first line of every config file tandem saves: what tells its own files (another run's, to replace with
#: ``--overwrite``) from the user's (never called another run's)
SAVED_MARK = "# Saved by tandem's SaveConfigCallback"
_FIRST_LINE = f"{SAVED_MARK}: the resolved config of a run (run it again with --config this file)\n"


def saved_text(config: str) -> str:
    """What ``config.yaml`` holds for ``config``: tandem's first line, then the YAML."""
    return _FIRST_LINE + config


class SaveConfigCallback(Callback):
    """Writes the config a [`CLI`][tandem.cli.CLI] run was built from to ``<trainer.log_dir>/config.yaml``.

    Global rank 0 writes it (atomically) when the first stage sets up, under a first line that marks it as
    tandem's (``SAVED_MARK``); feeding the file back with ``--config`` gives the same run. A different
    config that tandem saved already in that folder belongs to another run: every rank stops with an error
    unless ``overwrite=True`` (``--overwrite``). A file without the mark is not tandem's (often the user's own
    ``config.yaml``, with ``trainer.logger: false`` in its folder): the error says so and never suggests
    overwriting it. Nothing is written under ``fast_dev_run``.

    Override ``save_config(trainer, module, stage)`` to save the config somewhere else too (a logger's
    hyperparameters, as Lightning's docs show); ``save_to_log_dir=False`` then skips the file.

    Args:
        config: the resolved config as YAML text.
        config_filename: the file's name in the log folder.
        overwrite: replace a different config file that is already there.
        save_to_log_dir: write the file (False: only ``save_config``, which a subclass then implements).
    """

    def __init__(
        self, config: str, config_filename: str = "config.yaml", overwrite: bool = False, save_to_log_dir: bool = True
    ) -> None:
        if not save_to_log_dir and type(self).save_config is SaveConfigCallback.save_config:
            raise ValueError(
                "save_to_log_dir=False saves nothing: subclass SaveConfigCallback and implement save_config, or "
                "pass save_config_callback=None to the CLI."
            )
        self.config = config
        self.config_filename = config_filename
        self.overwrite = overwrite
        self.save_to_log_dir = save_to_log_dir
        self.already_saved = False

    def save_config(self, trainer: Trainer, module: TrainingModule, stage: str) -> None:
        """Override to save ``self.config`` (YAML text) elsewhere too; runs on global rank 0 only, so it must
        not call collectives."""

    def setup(self, trainer: Trainer, module: TrainingModule, stage: str) -> None:
        if self.already_saved or trainer.fast_dev_run:
            return
        if not self.save_to_log_dir:
            if trainer.is_global_zero:
                self.save_config(trainer, module, stage)
            self.already_saved = True
            return
        path = os.path.join(trainer.log_dir, self.config_filename)  # every rank agrees on the log folder
        problem = config_conflict(path, self.config, self.overwrite) if trainer.is_global_zero else None
        problem = trainer.strategy.broadcast(problem)  # rank 0 decides; every rank raises together
        if problem is not None:
            raise CLIError(problem)
        if trainer.is_global_zero:  # the folder is made by the write (at a URL log_dir too)
            atomic_write_text(path, saved_text(self.config))
            self.save_config(trainer, module, stage)
        self.already_saved = True


def input_conflict(path: str, inputs: list[str]) -> str | None:
    """Why the run's config must not be written to ``path``: it is a config file the run reads, or None. With
    ``trainer.logger: false`` the run's folder is ``trainer.default_root_dir`` (the working directory by
    default), where the user's own ``config.yaml`` often is; it is never replaced, ``--overwrite`` or not."""
    target = os.path.realpath(path)
    if not any(os.path.realpath(p) == target for p in inputs):
        return None
    return (
        f"{path} is a config file this run reads, and the run's resolved config would be saved over it (the run's "
        "folder is trainer.default_root_dir when trainer.logger is false). Not replacing it, even with "
        "--overwrite: give the run another folder (--trainer.default_root_dir DIR, or a logger), or save the "
        "config under another name (save_config_kwargs={'config_filename': ...})."
    )


def config_conflict(path: str, config: str, overwrite: bool) -> str | None:
    """Why ``config`` must not be written to ``path`` (a different file is there), or None."""
    existing = None if overwrite else read_text(path)
    if existing is None or existing in (saved_text(config), config):
        return None
    if not existing.startswith(SAVED_MARK):
        return (
            f"{path} is already there, and it is not a config tandem saved (tandem's start with the line "
            f"{SAVED_MARK!r}): probably a file of yours. Not replacing it. Give the run its own folder "
            "(--trainer.default_root_dir DIR, or a logger, whose version folders are new for each run), or save the "
            "config under another name (save_config_kwargs={'config_filename': 'run_config.yaml'}; "
            "save_config_callback=None saves none)."
        )
    return (
        f"{path} already holds a different config, saved by another run logging to the same folder. Not "
        "overwriting it: give this run its own folder (another trainer.default_root_dir, or a logger version), "
        "remove the file, or pass --overwrite to replace it."
    )
