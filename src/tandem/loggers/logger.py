"""The Logger base: a versioned run folder ``<save_dir>/<name>/version_<n>``, and the shared hparams.yaml.

Loggers write on global rank 0 only and create nothing on disk before their first write. The Trainer
makes every rank agree on the version with ``logger.version = strategy.broadcast(logger.version)``: a
logger whose version is a run id from a tracking service (MLflow, W&B) makes the run on rank 0 only, and
the other ranks learn its id from that broadcast.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tandem.utilities.checkpoint import atomic_write, is_url
from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.rank_zero import rank_zero_only

if TYPE_CHECKING:
    from torch import nn

HPARAMS_FILE = "hparams.yaml"
_VERSION_DIR = re.compile(r"^version_(\d+)$")


class Logger(ABC):
    """Base class of loggers that write into a versioned folder.

    Args:
        save_dir: the folder that holds every run of every experiment.
        name: the experiment's folder under ``save_dir``; ``""`` puts versions directly in ``save_dir``.
        version: an int gives ``version_<n>``, a str is used as the folder name; ``None`` picks the next
            free ``version_<n>`` the first time the version is read.

    Subclasses implement :meth:`log_metrics` and :meth:`log_hyperparams` (decorated ``@rank_zero_only``)
    and may override :meth:`save`, :meth:`finalize`, :meth:`log_graph` and :meth:`after_save_checkpoint`.

    Example::

        class PrintLogger(Logger):
            @rank_zero_only
            def log_metrics(self, metrics, step):
                print(step, dict(metrics))

            @rank_zero_only
            def log_hyperparams(self, params):
                self._save_hparams_yaml(params)

        logger = PrintLogger("runs")  # log_dir: runs/tandem_logs/version_0
    """

    def __init__(
        self, save_dir: str | os.PathLike, name: str = "tandem_logs", version: int | str | None = None
    ) -> None:
        self._save_dir = os.fspath(save_dir)
        self._name = name or ""
        self._version = version
        self._hparams: dict[str, Any] = {}

    @property
    def name(self) -> str:
        """The experiment's folder name."""
        return self._name

    @property
    def save_dir(self) -> str:
        """The folder that holds every experiment."""
        return self._save_dir

    @save_dir.setter
    def save_dir(self, save_dir: str | os.PathLike) -> None:
        """Set by the Trainer on every rank to rank 0's, so that all ranks name one run folder."""
        self._save_dir = os.fspath(save_dir)

    @property
    def root_dir(self) -> str:
        """``<save_dir>/<name>``: the folder that holds this experiment's versions."""
        return os.path.join(self._save_dir, self._name)

    @property
    def version(self) -> int | str:
        """This run's version; when none was given, the next free ``version_<n>`` (resolved once)."""
        if self._version is None:
            self._version = self._next_version()
        return self._version

    @version.setter
    def version(self, version: int | str) -> None:
        self._version = version

    @property
    def log_dir(self) -> str:
        """``<save_dir>/<name>/version_<n>``, or ``<save_dir>/<name>/<version>`` for a str version."""
        version = self.version
        folder = version if isinstance(version, str) else f"version_{version}"
        return os.path.join(self.root_dir, folder)

    def _next_version(self) -> int:
        try:
            names = os.listdir(self.root_dir)
        except (FileNotFoundError, NotADirectoryError):
            return 0
        taken = [
            int(m.group(1))
            for n in names
            if (m := _VERSION_DIR.match(n)) and os.path.isdir(os.path.join(self.root_dir, n))
        ]
        return max(taken) + 1 if taken else 0

    @abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (name -> number) at ``step``."""

    @abstractmethod
    def log_hyperparams(self, params: Mapping[str, Any] | argparse.Namespace) -> None:
        """Record the run's hyperparameters."""

    def _save_hparams_yaml(self, params: Mapping[str, Any] | argparse.Namespace) -> dict[str, Any]:
        """Merge ``params`` into those logged before and write them all to ``<log_dir>/hparams.yaml``."""
        self._hparams.update(params_to_dict(params))
        save_hparams_yaml(os.path.join(self.log_dir, HPARAMS_FILE), self._hparams)
        return self._hparams

    def log_graph(self, model: nn.Module, input_array: Any = None) -> None:  # noqa: B027 (optional override)
        """Record the model's computational graph; the Trainer calls it once at the start of ``fit``.

        Args:
            model: the module.
            input_array: an input for ``model`` (a tensor or a tuple of ``forward``'s positional arguments);
                ``None`` uses ``model.example_input_array``.
        """

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:  # noqa: B027 (optional override)
        """Called by :class:`~tandem.callbacks.ModelCheckpoint` on global rank 0 after each checkpoint file it
        writes (its ``best_model_path``, ``last_model_path`` and ``best_k_models`` already name the new file)."""

    @rank_zero_only  # noqa: B027 (an optional override: loggers that write at once need none)
    def save(self) -> None:
        """Flush what was logged so far to disk."""

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Flush and release files at the end of a run; ``status`` is "success", "failed" or "interrupted"."""
        self.save()

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(save_dir={self._save_dir!r}, name={self._name!r}, version={self._version!r})"


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
    """Write ``text`` (UTF-8) through :func:`tandem.utilities.checkpoint.atomic_write`: a new file gets the
    umask's mode, a failed write names the file and the cause and leaves the previous file intact."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")), what=what)


def save_hparams_yaml(path: str | os.PathLike, params: Mapping[str, Any] | argparse.Namespace) -> None:
    """Write hyperparameters as YAML; values that are not plain YAML types are written as their ``str()``."""
    from omegaconf import OmegaConf

    text = OmegaConf.to_yaml(OmegaConf.create(_yaml_safe(params_to_dict(params))))
    atomic_write_text(path, text, what="the hyperparameters file")


def load_hparams_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a file written by :func:`save_hparams_yaml` back into a plain dict."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path))


def require_local_folder(logger: str, save_dir: str | os.PathLike) -> None:
    """``logger`` writes a local folder: a URL ``save_dir`` (``memory://``, ``s3://``) is refused, not lost."""
    if is_url(save_dir):
        raise TandemConfigError(
            f"{logger}(save_dir={os.fspath(save_dir)!r}): this logger writes a local folder, and its files would not "
            "reach that URL. Give it a local save_dir (with Trainer(default_root_dir=<URL>), pass "
            f"logger={logger}('<a local folder>') or logger=False); checkpoints can still go to the URL "
            "(default_root_dir, ModelCheckpoint(dirpath=...))."
        )
