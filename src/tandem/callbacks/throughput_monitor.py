"""ThroughputMonitor: training samples/s and batches/s, in total and per device, in the bar and the logs."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from tandem.callbacks.callback import Callback
from tandem.utilities.data import extract_batch_size
from tandem.utilities.exceptions import out_of_range

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer


class ThroughputMonitor(Callback):
    """Measure training throughput and log it every ``trainer.log_every_n_steps`` optimizer steps.

    Logged (and shown in the progress bar when ``prog_bar``):

    - ``throughput/samples_per_sec`` and ``throughput/batches_per_sec``: the whole job, i.e. this
      process's rate times ``trainer.world_size`` (DDP ranks step together, so they share one rate);
    - ``throughput/samples_per_sec_per_device`` and ``throughput/batches_per_sec_per_device``: the totals
      divided by the number of devices (world size times the devices of one process, several for dp).

    Rates are averaged over the last ``window`` batches, data loading included, and restart after each
    validation. The per-batch cost is a clock read and a batch-size lookup; the device is synchronised
    only when a value is logged (CUDA only), so the clock covers the work queued on it.

    Args:
        batch_size_fn: ``fn(batch) -> int`` samples in a batch; default: dim 0 of the first tensor.
        window: batches to average over.
        prog_bar: show the totals in the progress bar.

    Example:
        ```python
        trainer = Trainer(callbacks=[ThroughputMonitor(batch_size_fn=lambda batch: batch["ids"].shape[0])])
        ```
    """

    def __init__(
        self, batch_size_fn: Callable[[Any], int] | None = None, window: int = 50, prog_bar: bool = True
    ) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise out_of_range("ThroughputMonitor: window", window, "an int >= 1 (batches)")
        self.batch_size_fn = batch_size_fn or extract_batch_size
        self.window = window
        self.prog_bar = prog_bar
        self._starts: deque[tuple[float, int]] = deque(maxlen=window)  # (time a batch started, its samples)
        self.last: dict[str, float] = {}  # the most recently logged values
        self._clock = time.perf_counter

    def on_train_epoch_start(self, trainer: Trainer, module: TrainingModule) -> None:
        self._starts.clear()  # skip the gap between epochs (loader workers starting up)

    def on_validation_end(self, trainer: Trainer, module: TrainingModule) -> None:
        self._starts.clear()  # validation time is not training time

    def on_train_batch_start(self, trainer: Trainer, module: TrainingModule, batch: Any, batch_idx: int) -> None:
        self._starts.append((self._clock(), int(self.batch_size_fn(batch))))

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # After the batch's optimizer steps (automatic or manual optimization): measure where the loop publishes.
        if not trainer.is_log_step or not self._starts:
            return
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = self._clock() - self._starts[0][0]
        if elapsed <= 0:
            return
        devices = trainer.world_size * trainer.strategy.devices_per_process
        batches = len(self._starts) / elapsed * trainer.world_size
        samples = sum(n for _, n in self._starts) / elapsed * trainer.world_size
        self.last = {
            "throughput/samples_per_sec": samples,
            "throughput/batches_per_sec": batches,
            "throughput/samples_per_sec_per_device": samples / devices,
            "throughput/batches_per_sec_per_device": batches / devices,
        }
        trainer.log_metrics(self.last)
        if self.prog_bar:
            for name in ("throughput/samples_per_sec", "throughput/batches_per_sec"):
                module.log(name, self.last[name], on_step=True, on_epoch=False, logger=False, prog_bar=True)
