"""DeviceStatsMonitor: log the device's memory statistics (CUDA) or the CPU's load (psutil) during training."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

import torch

from tandem.callbacks.callback import Callback
from tandem.utilities.exceptions import incompatible
from tandem.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer

_SEPARATOR = "/"  # Lightning's logger group separator


def psutil_available() -> bool:
    return importlib.util.find_spec("psutil") is not None


def cpu_stats() -> dict[str, float]:
    """The machine's CPU use and memory use, in percent (Lightning's ``get_cpu_stats``; needs psutil)."""
    import psutil

    return {
        "cpu_vm_percent": psutil.virtual_memory().percent,
        "cpu_percent": psutil.cpu_percent(),
        "cpu_swap_percent": psutil.swap_memory().percent,
    }


def device_stats(device: torch.device) -> dict[str, float]:
    """What Lightning's accelerators report: CUDA's caching-allocator statistics (``torch.cuda.memory_stats``,
    bytes and counts), the CPU's load on CPU, nothing for other devices."""
    if device.type == "cuda":
        return dict(torch.cuda.memory_stats(device))
    if device.type == "cpu":
        return cpu_stats()
    return {}


class DeviceStatsMonitor(Callback):
    """Log device statistics at the start and end of the training, validation and test batches whose values
    go to the loggers (every ``log_every_n_steps`` steps: ``trainer.is_log_step``), as
    ``DeviceStatsMonitor.{hook}/{stat}`` (``DeviceStatsMonitor.on_train_batch_end/cpu_percent``).

    On CUDA the statistics are ``torch.cuda.memory_stats`` (``allocated_bytes.all.current``,
    ``reserved_bytes.all.peak``, ``num_ooms``, ...); on CPU ``cpu_percent``, ``cpu_vm_percent`` and
    ``cpu_swap_percent`` from ``psutil`` (``pip install psutil``). Needs a logger.

    Args:
        cpu_stats: None: the CPU's statistics only when training on the CPU; True: also beside a GPU's;
            False: never.
        filter_keys: log only these statistics (names without the prefix, e.g. ``{"cpu_percent"}``).

    Example:
        ```python
        trainer = Trainer(callbacks=[DeviceStatsMonitor(filter_keys={"allocated_bytes.all.peak"})])
        ```
    """

    def __init__(self, cpu_stats: bool | None = None, filter_keys: set[str] | None = None) -> None:
        self._cpu_stats = cpu_stats
        self._filter_keys = set(filter_keys) if filter_keys is not None else None

    def setup(self, trainer: Trainer, module: TrainingModule, stage: str) -> None:
        if stage != "fit":
            return
        if not trainer.loggers:
            raise incompatible(
                "DeviceStatsMonitor", "it logs to the loggers and the Trainer has none (logger=False)",
                "Give the Trainer a logger, or remove the callback.",
            )  # fmt: skip
        device = trainer.strategy.root_device
        wants_cpu = self._cpu_stats or (self._cpu_stats is None and device.type == "cpu")
        if wants_cpu and not psutil_available():
            raise ModuleNotFoundError(
                "DeviceStatsMonitor logs CPU statistics with psutil, which is not installed: pip install psutil "
                "(or DeviceStatsMonitor(cpu_stats=False))."
            )
        if self._filter_keys is not None:
            unknown = self._filter_keys - self._stats(device).keys()
            if unknown:
                rank_zero_warn(
                    f"DeviceStatsMonitor: filter_keys {sorted(unknown)} are not among the statistics of "
                    f"{device.type}; they are ignored."
                )

    def _stats(self, device: torch.device) -> dict[str, Any]:
        if device.type == "cpu":
            return cpu_stats() if self._cpu_stats is not False else {}
        stats = device_stats(device)
        if self._cpu_stats:
            stats.update(cpu_stats())
        return stats

    def _log(self, trainer: Trainer, hook: str) -> None:
        if not trainer.is_log_step:
            return
        stats = self._stats(trainer.strategy.root_device)
        if self._filter_keys is not None:
            stats = {k: v for k, v in stats.items() if k in self._filter_keys}
        if stats:
            prefix = f"{type(self).__qualname__}.{hook}{_SEPARATOR}"
            trainer.log_metrics({prefix + k: v for k, v in stats.items()})

    # the batch hooks' other arguments (batch, outputs, batch_idx, dataloader_idx) are not needed
    def on_train_batch_start(self, trainer: Trainer, module: TrainingModule, *_: Any) -> None:
        self._log(trainer, "on_train_batch_start")

    def on_train_batch_end(self, trainer: Trainer, module: TrainingModule, *_: Any) -> None:
        self._log(trainer, "on_train_batch_end")

    def on_validation_batch_start(self, trainer: Trainer, module: TrainingModule, *_: Any) -> None:
        self._log(trainer, "on_validation_batch_start")

    def on_validation_batch_end(self, trainer: Trainer, module: TrainingModule, *_: Any) -> None:
        self._log(trainer, "on_validation_batch_end")

    def on_test_batch_start(self, trainer: Trainer, module: TrainingModule, *_: Any) -> None:
        self._log(trainer, "on_test_batch_start")

    def on_test_batch_end(self, trainer: Trainer, module: TrainingModule, *_: Any) -> None:
        self._log(trainer, "on_test_batch_end")
