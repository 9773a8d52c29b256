"""The Logger base: a versioned run folder ``<save_dir>/<name>/version_<n>``, and the shared hparams.yaml.

Loggers write on global rank 0 only and create nothing on disk before their first write. The Trainer
makes every rank agree on the version with ``logger.version = strategy.broadcast(logger.version)``: a
logger whose version is a run id from a tracking service (MLflow, W&B) makes the run on rank 0 only, and
the other ranks learn its id from that broadcast.

A ``save_dir`` may be an fsspec URL (``s3://bucket/runs``, ``gs://...``, ``memory://...``): the logger then
writes into a local staging folder (``StagingFolder``) and copies the files that changed to the URL at
each [`Logger.save`][tandem.loggers.Logger.save] and at [`Logger.finalize`][tandem.loggers.Logger.finalize]; versions
are numbered from the folders at the URL.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import shutil
import tempfile
import weakref
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any, cast

from tandem.utilities.atomic import atomic_write
from tandem.utilities.cloud_io import is_url, url_filesystem
from tandem.utilities.exceptions import TandemConfigError, write_failed
from tandem.utilities.rank_zero import rank_zero_only

if TYPE_CHECKING:
    from torch import nn

HPARAMS_FILE = "hparams.yaml"
#: the folder name of a numbered version, ``version_<n>``
VERSION_DIR = re.compile(r"^version_(\d+)$")


class Logger(ABC):
    """Base class of loggers that write into a versioned folder.

    Args:
        save_dir: the folder that holds every run of every experiment; a local path or an fsspec URL (the
            files are then staged locally and uploaded at each [`save`][tandem.loggers.Logger.save] and at
            [`finalize`][tandem.loggers.Logger.finalize]).
        name: the experiment's folder under ``save_dir``; ``""`` puts versions directly in ``save_dir``.
        version: an int gives ``version_<n>``, a str is used as the folder name; ``None`` picks the next
            free ``version_<n>`` the first time the version is read.

    Subclasses implement [`log_metrics`][tandem.loggers.Logger.log_metrics] and
    [`log_hyperparams`][tandem.loggers.Logger.log_hyperparams] (decorated ``@rank_zero_only``) and may override
    [`save`][tandem.loggers.Logger.save], [`finalize`][tandem.loggers.Logger.finalize],
    [`log_graph`][tandem.loggers.Logger.log_graph] and
    [`after_save_checkpoint`][tandem.loggers.Logger.after_save_checkpoint].

    Example:
        ```python
        class PrintLogger(Logger):
            @rank_zero_only
            def log_metrics(self, metrics, step):
                print(step, dict(metrics))

            @rank_zero_only
            def log_hyperparams(self, params):
                self._save_hparams_yaml(params)

        logger = PrintLogger("runs")  # log_dir: runs/tandem_logs/version_0
        ```
    """

    def __init__(
        self, save_dir: str | os.PathLike, name: str = "tandem_logs", version: int | str | None = None
    ) -> None:
        self._save_dir = os.fspath(save_dir)
        self._name = name or ""
        self._version = version
        self._hparams: dict[str, Any] = {}
        self._staging: StagingFolder | None = None  # made at the first write when save_dir is a URL

    # The folders and names are Optional, as Lightning types them: a logger of a tracking service (MLflow, W&B) or
    # the DummyLogger may have none. This base's own are always there.
    @property
    def name(self) -> str | None:
        """The experiment's folder name."""
        return self._name

    @property
    def save_dir(self) -> str | None:
        """The folder that holds every experiment."""
        return self._save_dir

    @save_dir.setter
    def save_dir(self, save_dir: str | os.PathLike) -> None:
        """Set by the Trainer on every rank to rank 0's, so that all ranks name one run folder."""
        self._save_dir = os.fspath(save_dir)

    @property
    def root_dir(self) -> str | None:
        """``<save_dir>/<name>``: the folder that holds this experiment's versions."""
        return os.path.join(self._save_dir, self._name)

    @property
    def version(self) -> int | str | None:
        """This run's version; when none was given, the next free ``version_<n>`` (resolved once)."""
        if self._version is None:
            self._version = self._next_version()
        return self._version

    @version.setter
    def version(self, version: int | str | None) -> None:
        self._version = version

    @property
    def log_dir(self) -> str | None:
        """``<save_dir>/<name>/version_<n>``, or ``<save_dir>/<name>/<version>`` for a str version (None where a
        subclass has no ``root_dir``)."""
        root, version = self.root_dir, self.version
        folder = version if isinstance(version, str) else f"version_{version}"
        return None if root is None else os.path.join(root, folder)

    def _next_version(self) -> int:
        root = self.root_dir  # None: a subclass without a folder
        names = _folders_in(root) if root is not None else []
        taken = [int(m.group(1)) for name in names if (m := VERSION_DIR.match(name))]
        return max(taken) + 1 if taken else 0

    @property
    def _local_log_dir(self) -> str:
        """Where this logger's writers put its files: [`log_dir`][tandem.loggers.Logger.log_dir], or for a URL
        ``save_dir`` the same place in the local staging folder (uploaded by ``_upload``)."""
        log_dir = self.log_dir
        assert log_dir is not None  # a logger that writes files has its folder
        if not is_url(self._save_dir):
            return log_dir
        return self._staging_folder().local_path(log_dir)

    def _staging_folder(self) -> StagingFolder:
        """The local staging folder of a URL ``save_dir`` (made on first use)."""
        if self._staging is None or self._staging.url != self._save_dir:  # the Trainer may give rank 0's
            self._staging = StagingFolder(self._save_dir)
        return self._staging

    def _fetch(self, name: str) -> None:
        """Copy ``<log_dir>/<name>`` from a URL ``save_dir`` into the staging folder, if it is there and not
        staged yet: a file the logger reads back before writing (a resumed run's ``metrics.csv``)."""
        if is_url(self._save_dir):
            local = os.path.join(self._local_log_dir, name)
            self._staging_folder().fetch(local)

    def _upload(self) -> None:
        """Copy the staged files that changed since the last upload to a URL ``save_dir``; nothing for a local one."""
        if self._staging is not None:
            self._staging.upload()

    @abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (name -> number) at ``step``."""

    @abstractmethod
    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        """Record the run's hyperparameters."""

    def _save_hparams_yaml(self, params: Mapping[str, Any] | argparse.Namespace) -> dict[str, Any]:
        """Merge ``params`` into those logged before and write them all to ``<log_dir>/hparams.yaml``."""
        self._hparams.update(params_to_dict(params))
        save_hparams_yaml(os.path.join(self._local_log_dir, HPARAMS_FILE), self._hparams)
        self._upload()  # once per fit: the file is at a URL save_dir from the start
        return self._hparams

    def log_graph(self, model: nn.Module, input_array: Any = None) -> None:  # noqa: B027 (optional override)
        """Record the model's computational graph; the Trainer calls it once at the start of ``fit``.

        Args:
            model: the module.
            input_array: an input for ``model`` (a tensor or a tuple of ``forward``'s positional arguments);
                ``None`` uses ``model.example_input_array``.
        """

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:  # noqa: B027 (optional override)
        """Called by [`ModelCheckpoint`][tandem.callbacks.ModelCheckpoint] on global rank 0 after each checkpoint file
        it writes (its ``best_model_path``, ``last_model_path`` and ``best_k_models`` already name the new file)."""

    @rank_zero_only
    def save(self) -> None:
        """Flush what was logged so far to disk (and to a URL ``save_dir``)."""
        self._upload()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Flush and release files at the end of a run; ``status`` is "success", "failed" or "interrupted"."""
        self.save()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_staging"] = None  # a spawned process stages in a folder of its own
        return state

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(save_dir={self._save_dir!r}, name={self._name!r}, version={self._version!r})"


class DummyLogger(Logger):
    """The logger under ``Trainer(fast_dev_run=...)`` (Lightning's): code written for a logger runs
    (``self.logger.experiment.add_image(...)``, ``self.logger.log_metrics(...)``) and nothing is written.
    ``save_dir`` is None, ``name`` and ``version`` are ``""``; any other method is accepted and does nothing."""

    def __init__(self) -> None:
        super().__init__("", name="", version="")
        self._experiment = NoOpExperiment()

    @property
    def experiment(self) -> NoOpExperiment:
        """Takes any call, attribute or item, and does nothing."""
        return self._experiment

    @property
    def save_dir(self) -> None:
        return None

    @save_dir.setter
    def save_dir(self, save_dir: Any) -> None:
        pass

    @property
    def root_dir(self) -> None:
        return None

    @property
    def version(self) -> str:
        return ""

    @version.setter
    def version(self, version: Any) -> None:
        pass

    @property
    def log_dir(self) -> None:
        return None

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        pass

    def __getitem__(self, idx: int) -> DummyLogger:  # self.logger[0].experiment.add_image(...)
        return self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None

    def __repr__(self) -> str:
        return "DummyLogger()"


# ---------------------------------------------------------------------- helpers shared by the loggers
class NoOpExperiment:
    """What a logger's ``experiment`` is on ranks other than 0: every attribute, call and item is this object
    again and does nothing (``experiment.add_scalar(...)``, ``experiment.config["lr"] = 0.1``)."""

    def __getattr__(self, name: str) -> NoOpExperiment:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> NoOpExperiment:
        return self

    def __getitem__(self, key: Any) -> NoOpExperiment:
        return self

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def require_package(module: str, owner: str, install: str) -> None:
    """Raise a clear error naming the install command when ``module`` is absent (without importing it)."""
    if importlib.util.find_spec(module) is None:
        raise TandemConfigError(f"{owner} needs the {module} package, which is not installed: pip install {install}")


def add_prefix(metrics: Mapping[str, Any], prefix: str, separator: str) -> Mapping[str, Any]:
    """``{"loss": 1}`` -> ``{"<prefix><separator>loss": 1}``; unchanged without a prefix (Lightning's rule)."""
    return {f"{prefix}{separator}{k}": v for k, v in metrics.items()} if prefix else metrics


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 0.1}}`` -> ``{"optim/lr": 0.1}``, for services whose hyperparameters are flat."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, argparse.Namespace):
            value = vars(value)
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, f"{name}/"))
        else:
            out[name] = value
    return out


def plain_value(value: Any) -> bool | int | float | str | None:
    """A hyperparameter as a tracking service stores it: numbers, bools, str and None stay; callables are named
    by their ``__name__``; anything else is written as its ``str()``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if callable(value) and hasattr(value, "__name__"):
        return value.__name__
    return str(value)


def new_checkpoints(checkpoint_callback: Any, logged: dict[str, float]) -> list[tuple[float, str, Any, str]]:
    """The files ``checkpoint_callback`` keeps that are not yet in ``logged`` (path -> modification time) or
    changed since (``last.ckpt`` is rewritten under one name): ``(mtime, path, score, tag)`` sorted oldest
    first, ``tag`` being "latest", "best" or "best_k" (Lightning's ``_scan_checkpoints``)."""
    found: dict[str, tuple[Any, str]] = {}
    if getattr(checkpoint_callback, "last_model_path", ""):
        found[checkpoint_callback.last_model_path] = (getattr(checkpoint_callback, "current_score", None), "latest")
    if getattr(checkpoint_callback, "best_model_path", ""):
        found[checkpoint_callback.best_model_path] = (checkpoint_callback.best_model_score, "best")
    for path, score in getattr(checkpoint_callback, "best_k_models", {}).items():
        found[path] = (score, "best_k")
    files = sorted(
        (os.path.getmtime(path), path, score, tag) for path, (score, tag) in found.items() if os.path.isfile(path)
    )
    return [f for f in files if f[1] not in logged or logged[f[1]] < f[0]]


def checkpoint_metadata(checkpoint_callback: Any, path: str, score: Any) -> dict[str, Any]:
    """What MLflow and W&B store with a logged checkpoint: its score, file name and the callback's settings."""
    settings = ("monitor", "mode", "save_last", "save_top_k", "save_weights_only", "every_n_train_steps")
    return {
        "score": score.item() if hasattr(score, "item") else score,
        "original_filename": os.path.basename(path),
        type(checkpoint_callback).__name__: {
            k: getattr(checkpoint_callback, k) for k in settings if hasattr(checkpoint_callback, k)
        },
    }


def params_to_dict(params: Mapping[str, Any] | argparse.Namespace) -> dict[str, Any]:
    """A plain dict of hyperparameters from a mapping or an ``argparse.Namespace``."""
    return dict(vars(params) if isinstance(params, argparse.Namespace) else params)


def _yaml_safe(value: Any) -> Any:
    """Plain YAML values stay; containers are converted item by item; anything else becomes ``str(value)``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, Mapping):
        return {str(k): _yaml_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_yaml_safe(v) for v in value]
    return str(value)


def atomic_write_text(path: str | os.PathLike, text: str, what: str = "") -> None:
    """Write ``text`` (UTF-8) through ``tandem.utilities.atomic.atomic_write``: a new file gets the
    umask's mode, a failed write names the file and the cause and leaves the previous file intact."""

    def write(file: IO[bytes]) -> None:
        file.write(text.encode("utf-8"))

    atomic_write(path, write, what=what)


def save_hparams_yaml(path: str | os.PathLike, params: Mapping[str, Any] | argparse.Namespace) -> None:
    """Write hyperparameters as YAML; values that are not plain YAML types are written as their ``str()``."""
    from omegaconf import OmegaConf

    text = OmegaConf.to_yaml(OmegaConf.create(_yaml_safe(params_to_dict(params))))
    atomic_write_text(path, text, what="the hyperparameters file")


def load_hparams_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a file written by ``save_hparams_yaml`` back into a plain dict."""
    from omegaconf import OmegaConf

    return cast("dict[str, Any]", OmegaConf.to_container(OmegaConf.load(os.fspath(path))))  # the file holds a mapping


def require_url_filesystem(logger: str, save_dir: str | os.PathLike) -> None:
    """Raise now, naming the package to install, if ``save_dir`` is a URL whose filesystem fsspec cannot open
    (``s3://`` without s3fs, ``gs://`` without gcsfs, a protocol fsspec does not know)."""
    if not is_url(save_dir):
        return
    url = os.fspath(save_dir)
    protocol = url.split("://", 1)[0]
    try:
        url_filesystem(url)
    except ImportError as err:  # fsspec knows the protocol; its package is missing
        from fsspec.registry import known_implementations

        package = known_implementations.get(protocol, {}).get("class", "fsspec").split(".")[0]
        raise TandemConfigError(
            f"{logger}(save_dir={url!r}): {err}. Install it (pip install {package}) or give a local save_dir."
        ) from None
    except ValueError as err:  # "Protocol not known"
        raise TandemConfigError(
            f"{logger}(save_dir={url!r}): fsspec has no filesystem for {protocol!r} URLs ({err}). Use a URL fsspec "
            "knows (s3:// with s3fs, gs:// with gcsfs, az:// with adlfs, ...) or a local save_dir."
        ) from None
    except Exception as err:  # fsspec itself missing (CheckpointError), or a filesystem that failed to start
        raise TandemConfigError(f"{logger}(save_dir={url!r}): {err}") from None


def _folders_in(folder: str) -> list[str]:
    """The names of the sub-folders of ``folder`` (local, or at an fsspec URL); none if it does not exist."""
    if is_url(folder):
        fs, inner = url_filesystem(folder)
        try:
            entries = fs.ls(inner, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [entry["name"].rstrip("/").rsplit("/", 1)[-1] for entry in entries if entry["type"] == "directory"]
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [name for name in names if os.path.isdir(os.path.join(folder, name))]


class StagingFolder:
    """A local temporary folder that stands for the fsspec URL ``url``: writers that need local files (torch's
    SummaryWriter, the csv module) write into it, and ``upload`` copies the files that changed since the last
    upload to the same place under ``url``.

    Each changed file is uploaded whole (object stores have no append), so a file that grows is sent again at
    every upload. An upload is not atomic on object stores: a reader may briefly see the older file. The folder
    is removed when the object is collected or the process ends, never while a later run with the same logger
    may still append to its files.

    Args:
        url: the URL the folder mirrors (a logger's ``save_dir``).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self._local: str | None = None
        self._sent: dict[str, tuple[int, int, int]] = {}  # relative path -> (inode, size, mtime) at its upload

    @property
    def local(self) -> str:
        """The staging folder, made on first use."""
        if self._local is None:
            self._local = tempfile.mkdtemp(prefix="tandem-logs-")
            weakref.finalize(self, shutil.rmtree, self._local, True)
        return self._local

    def local_path(self, url: str) -> str:
        """Where ``url`` (under ``self.url``) is staged."""
        relative = url[len(self.url) :].strip("/")
        return os.path.join(self.local, *relative.split("/")) if relative else self.local

    def _remote(self, local: str) -> str:
        relative = os.path.relpath(local, self.local).replace(os.sep, "/")
        return f"{self.url.rstrip('/')}/{relative}"

    def fetch(self, local: str) -> None:
        """Download the remote copy of the staged file ``local`` if it exists there and not here."""
        if os.path.exists(local):
            return
        url = self._remote(local)
        fs, inner = url_filesystem(url)
        if not fs.isfile(inner):
            return
        os.makedirs(os.path.dirname(local), exist_ok=True)
        fs.get_file(inner, local)
        self._sent[os.path.relpath(local, self.local)] = _signature(local)

    def upload(self) -> None:
        """Copy every staged file that is new or changed since its last upload to the URL."""
        if self._local is None:
            return
        for folder, _, names in os.walk(self._local):
            for name in names:
                if name.startswith(".") and name.endswith(".tmp"):  # an atomic write in progress
                    continue
                local = os.path.join(folder, name)
                relative = os.path.relpath(local, self._local)
                with contextlib.suppress(FileNotFoundError):
                    signature = _signature(local)
                    if self._sent.get(relative) != signature:
                        self._put(local)
                        self._sent[relative] = signature

    def _put(self, local: str) -> None:
        url = self._remote(local)
        fs, inner = url_filesystem(url)
        try:
            parent = inner.rsplit("/", 1)[0]
            if parent and parent != inner:
                fs.makedirs(parent, exist_ok=True)
            fs.put_file(local, inner)
        except OSError as err:
            raise write_failed(url, err, "the log file", kept=False) from None


def _signature(path: str) -> tuple[int, int, int]:
    """What changes when a file is rewritten (a new inode, from os.replace) or appended to (its size)."""
    stat = os.stat(path)
    return stat.st_ino, stat.st_size, stat.st_mtime_ns
