"""Weights & Biases logging through a ``wandb`` run (wandb is imported when the logger is made)."""

from __future__ import annotations

import argparse
import os
import secrets
import string
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from tandem.loggers.logger import (
    Logger,
    NoOpExperiment,
    add_prefix,
    checkpoint_metadata,
    flatten_params,
    new_checkpoints,
    params_to_dict,
    plain_value,
    require_package,
)
from tandem.utilities.exceptions import bad_choice
from tandem.utilities.rank_zero import rank_zero_only, rank_zero_warn

if TYPE_CHECKING:
    from torch import nn

_ID_CHARS = string.ascii_lowercase + string.digits


class WandbLogger(Logger):
    """Logs hyperparameters (the run's config), metrics, checkpoints (with ``log_model``) and, with
    [`watch`][tandem.loggers.WandbLogger.watch], gradients to a Weights & Biases run, as Lightning's WandbLogger does.
    Needs ``pip install wandb``.

    The run starts at the first write, on global rank 0 only; the other ranks log nothing. ``name`` is the
    project, ``version`` the run's id: rank 0 picks one when the Trainer first asks (or takes the id given,
    or that of a run already started with ``wandb.init``), so every rank and the checkpoint folder
    ``<save_dir>/<project>/<id>/checkpoints`` agree before the run exists. Metrics are logged against
    ``trainer/global_step``. Offline runs (``offline=True`` or ``WANDB_MODE=offline``) keep everything,
    checkpoints included, under ``<save_dir>/wandb`` for ``wandb sync``. The run is not finished at the end of
    ``fit`` (a later ``test`` logs into it); call ``logger.experiment.finish()`` or let the process end.

    Args:
        name: the run's display name.
        save_dir: the folder that holds W&B's ``wandb/`` folder (``dir`` of ``wandb.init``).
        version: the run's id, to resume a run (the same as ``id``).
        offline: write the run locally only, to upload later with ``wandb sync``.
        dir: the same as ``save_dir``, used when ``save_dir`` is ``None``.
        id: the same as ``version``.
        anonymous: log anonymously (``wandb.init``'s ``anonymous="allow"``).
        project: the project; default: the ``WANDB_PROJECT`` environment variable, else ``"tandem_logs"``.
        log_model: log the checkpoints of [`ModelCheckpoint`][tandem.callbacks.ModelCheckpoint] as ``model`` artifacts
            with the aliases "latest" and "best": ``"all"`` as they are saved; ``True`` at the end of a
            successful ``fit`` (as they are saved when ``save_top_k=-1``); ``False`` never.
        experiment: a run to log into instead of starting one.
        prefix: put before every metric name, joined with ``"-"``.
        checkpoint_name: the artifact's name; default ``model-<run id>``.
        **kwargs: passed to ``wandb.init`` (``entity``, ``group``, ``tags``, ``mode``, ``config``, ...).

    Example:
        ```python
        logger = WandbLogger(project="mnist", log_model="all")
        logger.watch(model, log="all", log_freq=50)
        trainer = Trainer(logger=logger, max_epochs=3)
        ```
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | os.PathLike | None = ".",
        version: str | None = None,
        offline: bool = False,
        dir: str | os.PathLike | None = None,  # noqa: A002 (Lightning's and wandb.init's name)
        id: str | None = None,  # noqa: A002
        anonymous: bool | None = None,
        project: str | None = None,
        log_model: Literal[True, False, "all"] = False,
        experiment: Any = None,
        prefix: str = "",
        checkpoint_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        require_package("wandb", "WandbLogger", "wandb")
        if log_model not in (True, False, "all"):
            raise bad_choice("WandbLogger: log_model", log_model, (True, False, "all"))
        folder = save_dir if save_dir is not None else dir
        folder = os.fspath(folder) if folder is not None else None
        project = project or os.environ.get("WANDB_PROJECT", "tandem_logs")
        run_id = version or id
        super().__init__(folder or "", project, run_id)
        self._wandb_init: dict[str, Any] = {"name": name, "project": project, "dir": folder, "resume": "allow"}
        if anonymous:
            self._wandb_init["anonymous"] = "allow"
        if offline:
            self._wandb_init["mode"] = "offline"
        self._wandb_init.update(kwargs)
        self._project = project
        self._folder = folder
        self._id = run_id
        self._experiment = experiment
        self._log_model = log_model
        self._prefix = prefix
        self._checkpoint_name = checkpoint_name
        self._logged_model_time: dict[str, float] = {}
        self._checkpoint_callback: Any = None

    # ------------------------------------------------------------------ the run
    @property
    def experiment(self) -> Any:
        """The ``wandb`` run, started on first use; a no-op object on ranks other than 0."""
        if rank_zero_only.rank != 0:  # type: ignore[attr-defined]  # set by tandem.utilities.rank_zero.set_rank
            return NoOpExperiment()
        if self._experiment is None:
            import wandb

            if wandb.run is not None:
                rank_zero_warn(
                    "WandbLogger logs into the W&B run already in progress (started by wandb.init). To start a "
                    "new run instead, call wandb.finish() before the Trainer starts."
                )
                self._experiment = wandb.run
            else:
                self._experiment = wandb.init(**{**self._wandb_init, "id": self.version})
                self._experiment.define_metric("trainer/global_step")
                self._experiment.define_metric("*", step_metric="trainer/global_step", step_sync=True)
        return self._experiment

    @property
    def name(self) -> str:
        """The project, as in Lightning (the run's display name is ``experiment.name``)."""
        return self._project

    @property
    def version(self) -> str | None:
        """The run's id. Rank 0 fixes it on first use without starting the run; other ranks return the id
        they were given (the Trainer gives them rank 0's)."""
        if self._experiment is not None:
            return self._experiment.id
        if self._id is None and rank_zero_only.rank == 0:  # type: ignore[attr-defined]  # set by tandem.utilities.rank_zero.set_rank
            import wandb

            self._id = wandb.run.id if wandb.run is not None else "".join(secrets.choice(_ID_CHARS) for _ in range(8))
        return self._id

    @version.setter
    def version(self, version: int | str | None) -> None:  # rank 0's id, given to every rank by the Trainer
        self._id = None if version is None else str(version)

    @property
    def save_dir(self) -> str | None:
        """The folder that holds W&B's ``wandb/`` folder."""
        return self._folder

    @save_dir.setter
    def save_dir(self, save_dir: str | os.PathLike | None) -> None:  # the Trainer gives every rank rank 0's
        self._folder = None if save_dir is None else os.fspath(save_dir)

    @property
    def log_dir(self) -> str | None:
        """``<save_dir>/<project>/<run id>``: where the run's checkpoints go by default."""
        version = self.version
        return None if self._folder is None or version is None else os.path.join(self._folder, self._project, version)

    def watch(
        self,
        model: nn.Module,
        log: Literal["gradients", "parameters", "all"] | None = "gradients",
        log_freq: int = 100,
        log_graph: bool = True,
    ) -> None:
        """Log ``model``'s gradients (and/or parameters) as histograms every ``log_freq`` steps, and its graph
        (``wandb.watch``). Stop with ``logger.experiment.unwatch(model)``."""
        self.experiment.watch(model, log=log, log_freq=log_freq, log_graph=log_graph)

    # ------------------------------------------------------------------ logging
    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        flat = {k: plain_value(v) for k, v in flatten_params(params_to_dict(params)).items()}
        self.experiment.config.update(flat, allow_val_change=True)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        metrics = add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR)
        self.experiment.log(dict(metrics) if step is None else {**metrics, "trainer/global_step": step})

    @rank_zero_only
    def log_table(
        self,
        key: str,
        columns: list[str] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
    ) -> None:
        """Log a ``wandb.Table`` from ``columns`` and ``data`` (rows), or from a pandas ``dataframe``."""
        import wandb

        names: list[str | int] | None = None if columns is None else list(columns)  # wandb's declared type
        self.log_metrics({key: wandb.Table(columns=names, data=data, dataframe=dataframe)}, step)

    @rank_zero_only
    def log_text(
        self,
        key: str,
        columns: list[str] | None = None,
        data: list[list[str]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
    ) -> None:
        """Log text as a table (see [`log_table`][tandem.loggers.WandbLogger.log_table])."""
        self.log_table(key, columns, data, dataframe, step)

    @rank_zero_only
    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: list[Any]) -> None:
        """Log images (tensors, numpy arrays, PIL images or file paths); each keyword (``caption``, ``masks``,
        ``boxes``) is a list with one entry per image."""
        import wandb

        if not isinstance(images, list):
            raise TypeError(
                f"WandbLogger.log_image takes a list of images, got a {type(images).__name__}; wrap it: [image]."
            )
        for name, values in kwargs.items():
            if len(values) != len(images):
                raise ValueError(
                    f"WandbLogger.log_image got {len(images)} images but {len(values)} values of {name!r}; give one "
                    "value per image."
                )
        per_image = [{name: values[i] for name, values in kwargs.items()} for i in range(len(images))]
        self.log_metrics({key: [wandb.Image(image, **extra) for image, extra in zip(images, per_image)]}, step)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        # as Lightning: checkpoints are logged after a successful run only, and the run stays open
        if status == "success" and self._checkpoint_callback is not None and self._experiment is not None:
            self._log_checkpoints(self._checkpoint_callback)

    # ------------------------------------------------------------------ checkpoints as artifacts
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        if self._log_model == "all" or (self._log_model is True and checkpoint_callback.save_top_k == -1):
            self._log_checkpoints(checkpoint_callback)
        elif self._log_model is True:
            self._checkpoint_callback = checkpoint_callback  # logged by finalize

    @rank_zero_only
    def _log_checkpoints(self, checkpoint_callback: Any) -> None:
        """Each new checkpoint as a version of the ``model`` artifact (file ``model.ckpt``), aliased "latest"
        and, for the best one, "best"; its metadata: score, file name, the callback's settings."""
        import wandb

        for mtime, path, score, _ in new_checkpoints(checkpoint_callback, self._logged_model_time):
            name = self._checkpoint_name or f"model-{self.experiment.id}"
            metadata = checkpoint_metadata(checkpoint_callback, path, score)
            artifact = wandb.Artifact(name=name, type="model", metadata=metadata)
            artifact.add_file(path, name="model.ckpt")
            aliases = ["latest", "best"] if path == checkpoint_callback.best_model_path else ["latest"]
            self.experiment.log_artifact(artifact, aliases=aliases)
            self._logged_model_time[path] = mtime

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self._experiment is not None:  # a spawned process resumes the run by its id
            state["_id"] = self._experiment.id
        state["_experiment"] = None  # a run cannot be pickled
        return state

    def __repr__(self) -> str:
        return f"WandbLogger(project={self._project!r}, save_dir={self._folder!r}, id={self._id!r})"
