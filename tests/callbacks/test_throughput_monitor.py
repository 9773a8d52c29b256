from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks.throughput_monitor import ThroughputMonitor
from tandem.strategies import DataParallelStrategy
from tandem.utilities.exceptions import TandemConfigError

NAMES = (
    "throughput/samples_per_sec",
    "throughput/batches_per_sec",
    "throughput/samples_per_sec_per_device",
    "throughput/batches_per_sec_per_device",
)


def ticking(monitor: ThroughputMonitor, seconds: float = 1.0) -> ThroughputMonitor:
    """Each clock read advances time by ``seconds``: one read per batch, one per logged value."""
    clock = itertools.count(0.0, seconds)
    monitor._clock = lambda: next(clock)
    return monitor


def test_rates_are_logged_every_log_every_n_steps_and_shown_in_the_bar():
    monitor = ticking(ThroughputMonitor())
    trainer = quiet_trainer(max_steps=4, log_every_n_steps=2, callbacks=[monitor])
    trainer.fit(TinyModule(), loader(64, batch_size=16))
    # Batches start at t = 0, 1 | 3, 4 (reads at t = 2 and 5 log): the window holds 4 batches over 5 s.
    assert monitor.last["throughput/batches_per_sec"] == pytest.approx(4 / 5)
    assert monitor.last["throughput/samples_per_sec"] == pytest.approx(64 / 5)
    assert monitor.last["throughput/samples_per_sec_per_device"] == pytest.approx(64 / 5)
    for name in NAMES:
        assert trainer.logged_metrics[name] == pytest.approx(monitor.last[name])
    assert set(trainer.progress_bar_metrics) >= {"throughput/samples_per_sec", "throughput/batches_per_sec"}
    assert "throughput/samples_per_sec_per_device" not in trainer.progress_bar_metrics


def test_window_and_batch_size_fn():
    monitor = ticking(ThroughputMonitor(batch_size_fn=lambda batch: 2 * len(batch[0]), window=2))
    trainer = quiet_trainer(max_steps=3, log_every_n_steps=3, callbacks=[monitor])
    trainer.fit(TinyModule(), loader(64, batch_size=16))
    # Batches start at t = 0, 1, 2; the log reads t = 3; the window keeps the last 2 batches (t = 1, 2).
    assert monitor.last["throughput/batches_per_sec"] == pytest.approx(2 / 2)
    assert monitor.last["throughput/samples_per_sec"] == pytest.approx(2 * 32 / 2)


def test_validation_time_is_not_counted():
    monitor = ticking(ThroughputMonitor())
    trainer = quiet_trainer(max_steps=4, log_every_n_steps=4, val_check_interval=2, callbacks=[monitor])
    trainer.fit(TinyModule(), loader(64, batch_size=16), loader(16, batch_size=16))
    # Validation after batch 2 restarts the window: batches start at t = 2, 3; the log reads t = 4.
    assert monitor.last["throughput/batches_per_sec"] == pytest.approx(2 / 2)


@pytest.mark.filterwarnings("ignore:DataParallelStrategy on CPU devices")
def test_per_device_rates_count_the_devices_of_a_dp_process():
    monitor = ticking(ThroughputMonitor())
    trainer = quiet_trainer(
        strategy=DataParallelStrategy(devices=["cpu"] * 4), max_steps=2, log_every_n_steps=2, callbacks=[monitor]
    )
    trainer.fit(TinyModule(), loader(64, batch_size=16))
    total = monitor.last["throughput/samples_per_sec"]
    assert total == pytest.approx(32 / 2)
    assert monitor.last["throughput/samples_per_sec_per_device"] == pytest.approx(total / 4)


def test_totals_scale_with_world_size():
    logged = {}
    module = SimpleNamespace(log=lambda name, value, **kw: None)
    strategy = SimpleNamespace(root_device=torch.device("cpu"), devices_per_process=1)  # as in ddp
    trainer = SimpleNamespace(
        world_size=4, strategy=strategy, global_step=0, log_every_n_steps=1, log_metrics=logged.update, is_log_step=True
    )
    monitor = ticking(ThroughputMonitor())
    monitor.on_train_batch_start(trainer, module, torch.zeros(8, 3), 0)
    trainer.global_step = 1
    monitor.on_train_batch_end(trainer, module, None, torch.zeros(8, 3), 0)
    assert logged["throughput/samples_per_sec"] == pytest.approx(8 * 4)
    assert logged["throughput/samples_per_sec_per_device"] == pytest.approx(8)
    assert logged["throughput/batches_per_sec"] == pytest.approx(4)


def test_manual_optimization_is_measured_too():
    class Manual(TinyModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self(x), y)
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()

    monitor = ticking(ThroughputMonitor())
    trainer = quiet_trainer(max_steps=4, log_every_n_steps=2, callbacks=[monitor])
    trainer.fit(Manual(), loader(64, batch_size=16))
    assert monitor.last["throughput/batches_per_sec"] == pytest.approx(4 / 5)
    assert trainer.logged_metrics["throughput/samples_per_sec"] == pytest.approx(64 / 5)


def test_bad_window():
    with pytest.raises(TandemConfigError, match="window"):
        ThroughputMonitor(window=0)
