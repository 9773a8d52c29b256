"""MLflow logging through ``mlflow.tracking.MlflowClient`` (mlflow is imported when the logger is made)."""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from collections.abc import Mapping
from typing import Any, Literal

from tandem.loggers.logger import (
    Logger,
    NoOpExperiment,
    add_prefix,
    checkpoint_metadata,
    flatten_params,
    new_checkpoints,
    params_to_dict,
    require_package,
    save_hparams_yaml,
)
from tandem.utilities.exceptions import TandemConfigError, bad_choice
from tandem.utilities.rank_zero import rank_zero_only, rank_zero_warn

_FILE_URI = "file:"
_METRIC_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_/. -]+")  # what MLflow refuses in a metric name
_RUN_STATUS = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}


class MLFlowLogger(Logger):
    """Logs hyperparameters, metrics and (with ``log_model``) checkpoints to an MLflow run, as Lightning's
    MLFlowLogger does. Needs ``pip install mlflow`` (or the lighter ``mlflow-skinny``).

    The experiment and the run are made on first use, on global rank 0 only (the Trainer uses them when a
    run starts); the other ranks learn the run's id from the Trainer and log nothing. ``name`` is the
    experiment's id, ``version`` the run's id; with a local store (``file:`` URI) checkpoints go to
    ``<save_dir>/<experiment id>/<run id>/checkpoints``, else to ``<default_root_dir>/checkpoints``.

    Args:
        experiment_name: the experiment the run belongs to; made if it does not exist.
        run_name: the run's name (MLflow's ``mlflow.runName`` tag).
        tracking_uri: where runs are stored, e.g. ``"http://host:5000"`` or ``"sqlite:///mlflow.db"``. Default:
            the ``MLFLOW_TRACKING_URI`` environment variable, else ``file:<save_dir>``.
        tags: tags of the run.
        save_dir: the local folder of the file store, used when no ``tracking_uri`` is given. MLflow 3.13 and
            later refuse the file store unless ``MLFLOW_ALLOW_FILE_STORE=true`` is set; a database URI
            (``tracking_uri="sqlite:///mlflow.db"``, with the full ``mlflow`` package) needs nothing more.
        log_model: log the checkpoints of [`ModelCheckpoint`][tandem.callbacks.ModelCheckpoint] as artifacts of the run:
            ``"all"`` as they are saved; ``True`` at the end of training (as they are saved when
            ``save_top_k=-1``); ``False`` never.
        checkpoint_path_prefix: a folder in the run's artifacts that holds the logged checkpoints.
        prefix: put before every metric name, joined with ``"-"``.
        artifact_location: where a new experiment stores its artifacts; default: the server's choice.
        run_id: log into this existing run instead of starting a new one.
        synchronous: whether each logging call waits until MLflow stored it; ``None``: MLflow's default.

    Example:
        ```python
        logger = MLFlowLogger(experiment_name="mnist", tracking_uri="sqlite:///mlflow.db", log_model=True)
        trainer = Trainer(logger=logger, max_epochs=3)
        logger.experiment.log_text(logger.run_id, "notes", "notes.txt")  # the MlflowClient itself
        ```
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        experiment_name: str = "tandem_logs",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict[str, Any] | None = None,
        save_dir: str | os.PathLike | None = "./mlruns",
        log_model: Literal[True, False, "all"] = False,
        checkpoint_path_prefix: str = "",
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
        synchronous: bool | None = None,
    ) -> None:
        require_package("mlflow", "MLFlowLogger", "mlflow (or mlflow-skinny)")
        if log_model not in (True, False, "all"):
            raise bad_choice("MLFlowLogger: log_model", log_model, (True, False, "all"))
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not tracking_uri:
            tracking_uri = f"{_FILE_URI}{os.fspath(save_dir if save_dir is not None else './mlruns')}"
        local = tracking_uri[len(_FILE_URI) :] if tracking_uri.startswith(_FILE_URI) else None
        super().__init__(local or "", experiment_name, run_id)
        self._experiment_name = experiment_name
        self._experiment_id: str | None = None
        self._tracking_uri = tracking_uri
        self._local_dir = local
        self._run_name = run_name
        self._run_id = run_id
        self.tags = dict(tags) if tags else None
        self._log_model = log_model
        self._checkpoint_path_prefix = checkpoint_path_prefix
        self._prefix = prefix
        self._artifact_location = artifact_location
        self._log_batch_kwargs = {} if synchronous is None else {"synchronous": synchronous}
        self._client: Any = None
        self._initialized = False
        self._logged_model_time: dict[str, float] = {}
        self._checkpoint_callback: Any = None

    # ------------------------------------------------------------------ the run
    @property
    def experiment(self) -> Any:
        """The ``MlflowClient``, with the experiment and run made (or found) on first use; a no-op object on
        ranks other than 0."""
        if rank_zero_only.rank != 0:  # type: ignore[attr-defined]  # set by tandem.utilities.rank_zero.set_rank
            return NoOpExperiment()
        if self._client is None:
            self._client = self._make_client()
        if self._initialized:
            return self._client
        import mlflow

        mlflow.set_tracking_uri(self._tracking_uri)  # as Lightning: mlflow's fluent API writes to the same place
        if self._run_id is not None:
            self._experiment_id = self._client.get_run(self._run_id).info.experiment_id
        else:
            found = self._client.get_experiment_by_name(self._experiment_name)
            if found is not None:
                self._experiment_id = found.experiment_id
            else:
                self._experiment_id = self._client.create_experiment(
                    name=self._experiment_name, artifact_location=self._artifact_location
                )
            self._run_id = self._client.create_run(experiment_id=self._experiment_id, tags=self._run_tags()).info.run_id
        self._initialized = True
        return self._client

    def _make_client(self) -> Any:
        from mlflow.tracking import MlflowClient

        try:
            return MlflowClient(self._tracking_uri)
        except Exception as err:
            if self._local_dir is None or "MLFLOW_ALLOW_FILE_STORE" not in str(err):
                raise
            raise TandemConfigError(
                f"MLFlowLogger could not open the file store {self._tracking_uri!r}: this MLflow refuses folder "
                "stores unless the environment variable MLFLOW_ALLOW_FILE_STORE=true is set. Set it, or log to a "
                "database: MLFlowLogger(tracking_uri='sqlite:///mlflow.db') (needs the full mlflow package)."
            ) from err

    def _run_tags(self) -> dict[str, str]:
        from mlflow.tracking.context.registry import resolve_tags
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

        tags = dict(self.tags or {})
        if self._run_name is not None:
            if MLFLOW_RUN_NAME in tags:
                rank_zero_warn(f"MLFlowLogger: run_name={self._run_name!r} replaces the {MLFLOW_RUN_NAME!r} tag.")
            tags[MLFLOW_RUN_NAME] = self._run_name
        return resolve_tags(tags)

    @property
    def run_id(self) -> str | None:
        """The run's id (the run is made first on rank 0; other ranks return the id they were given)."""
        _ = self.experiment
        return self._run_id

    @property
    def experiment_id(self) -> str | None:
        """The experiment's id (made first on rank 0; ``None`` on other ranks)."""
        _ = self.experiment
        return self._experiment_id

    @property
    def name(self) -> str | None:
        """The experiment's id, as in Lightning."""
        return self.experiment_id

    @property
    def version(self) -> str | None:
        """The run's id."""
        return self.run_id

    @version.setter
    def version(self, version: int | str | None) -> None:  # rank 0's run id, given to every rank by the Trainer
        version = None if version is None else str(version)
        if version is not None and self._run_id is not None and version != self._run_id:
            raise TandemConfigError(
                f"MLFlowLogger already logs to run {self._run_id!r}; it cannot switch to run {version!r}. "
                "Make a new MLFlowLogger(run_id=...) for another run."
            )
        self._run_id = version

    @property
    def save_dir(self) -> str | None:
        """The local folder of a ``file:`` store; ``None`` for other stores."""
        return self._local_dir

    @save_dir.setter
    def save_dir(self, save_dir: str | os.PathLike | None) -> None:  # the Trainer gives every rank rank 0's
        self._local_dir = None if save_dir is None else os.fspath(save_dir)

    @property
    def root_dir(self) -> str | None:
        """``<save_dir>/<experiment id>`` for a local store (known on rank 0), else ``None``."""
        if self._local_dir is None or self.experiment_id is None:
            return None
        return os.path.join(self._local_dir, self.experiment_id)

    @property
    def log_dir(self) -> str | None:
        """``<save_dir>/<experiment id>/<run id>`` for a local store (known on rank 0), else ``None``."""
        root = self.root_dir
        return None if root is None or self._run_id is None else os.path.join(root, self._run_id)

    # ------------------------------------------------------------------ logging
    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        from mlflow.entities import Param
        from mlflow.utils import validation

        limit = getattr(validation, "MAX_PARAM_VAL_LENGTH", 250)
        flat = flatten_params(params_to_dict(params))
        entries = [Param(key=k, value=str(v)[:limit]) for k, v in flat.items()]
        for start in range(0, len(entries), 100):  # MLflow takes at most 100 params a call
            self.experiment.log_batch(run_id=self.run_id, params=entries[start : start + 100], **self._log_batch_kwargs)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        timestamp_ms = int(time.time() * 1000)
        entries = []
        for key, value in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            if isinstance(value, str):
                rank_zero_warn(f"MLFlowLogger skips the metric {key!r}: its value {value!r} is a str, not a number.")
                continue
            safe = _METRIC_NAME_UNSAFE.sub("", key)
            if safe != key:
                rank_zero_warn(
                    f"MLFlowLogger logs the metric {key!r} as {safe!r}: MLflow metric names allow letters, digits "
                    "and the characters _ / . - and space.",
                    category=RuntimeWarning,
                )
            entries.append(Metric(key=safe, value=float(value), timestamp=timestamp_ms, step=step or 0))
        self.experiment.log_batch(run_id=self.run_id, metrics=entries, **self._log_batch_kwargs)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if not self._initialized:
            return
        if self._checkpoint_callback is not None:
            self._log_checkpoints(self._checkpoint_callback)
        self.experiment.set_terminated(self.run_id, _RUN_STATUS.get(status, status))

    # ------------------------------------------------------------------ checkpoints as artifacts
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        if self._log_model == "all" or (self._log_model is True and checkpoint_callback.save_top_k == -1):
            self._log_checkpoints(checkpoint_callback)
        elif self._log_model is True:
            self._checkpoint_callback = checkpoint_callback  # logged by finalize

    @rank_zero_only
    def _log_checkpoints(self, checkpoint_callback: Any) -> None:
        """Each new checkpoint under ``<checkpoint_path_prefix>/<file stem>/`` in the run's artifacts, with a
        ``metadata.yaml`` (score, file name, the callback's settings) and ``aliases.txt`` ("latest", "best")."""
        for mtime, path, score, _ in new_checkpoints(checkpoint_callback, self._logged_model_time):
            artifact_path = os.path.join(self._checkpoint_path_prefix, os.path.splitext(os.path.basename(path))[0])
            self.experiment.log_artifact(self.run_id, path, artifact_path)
            aliases = ["latest", "best"] if path == checkpoint_callback.best_model_path else ["latest"]
            with tempfile.TemporaryDirectory() as folder:
                save_hparams_yaml(
                    os.path.join(folder, "metadata.yaml"), checkpoint_metadata(checkpoint_callback, path, score)
                )
                with open(os.path.join(folder, "aliases.txt"), "w", encoding="utf-8") as f:
                    f.write(str(aliases))
                self.experiment.log_artifacts(self.run_id, folder, artifact_path)
            self._logged_model_time[path] = mtime

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None  # made again in a spawned process
        return state

    def __repr__(self) -> str:
        return (
            f"MLFlowLogger(experiment_name={self._experiment_name!r}, tracking_uri={self._tracking_uri!r}, "
            f"run_id={self._run_id!r})"
        )
