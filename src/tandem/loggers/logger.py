"""The Logger base: a versioned run folder ``<save_dir>/<name>/version_<n>``, and the shared hparams.yaml.

Loggers write on global rank 0 only and create nothing on disk before their first write. The Trainer
makes every rank agree on the version with ``logger.version = strategy.broadcast(logger.version)``.
"""

from __future__ import annotations

import argparse
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from tandem.utilities.checkpoint import atomic_write
from tandem.utilities.rank_zero import rank_zero_only

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
    and may override :meth:`save` and :meth:`finalize`.

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
