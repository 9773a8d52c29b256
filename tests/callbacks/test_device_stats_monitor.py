import csv

import pytest
import torch

from callbacks._fake import RecordingLogger, fake_trainer
from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import DeviceStatsMonitor, device_stats_monitor
from tandem.loggers import CSVLogger
from tandem.utilities.exceptions import TandemConfigError

pytestmark = pytest.mark.timeout(60)

CPU_STATS = {"cpu_percent", "cpu_vm_percent", "cpu_swap_percent"}


def _trainer(tmp_path, **attrs):
    trainer = fake_trainer(tmp_path, **{"loggers": [RecordingLogger()], **attrs})
    trainer.strategy.root_device = torch.device("cpu")
    return trainer


def test_on_cpu_the_cpu_stats_are_logged_on_log_steps_with_lightnings_names(tmp_path):
    trainer = _trainer(tmp_path, is_log_step=True, global_step=4)
    monitor = DeviceStatsMonitor()
    monitor.setup(trainer, None, "fit")
    monitor.on_train_batch_start(trainer, None, None, 0)
    monitor.on_train_batch_end(trainer, None, None, None, 0)
    (start, step), (end, _) = trainer.loggers[0].calls
    assert set(start) == {f"DeviceStatsMonitor.on_train_batch_start/{k}" for k in CPU_STATS} and step == 4
    assert set(end) == {f"DeviceStatsMonitor.on_train_batch_end/{k}" for k in CPU_STATS}
    assert all(0 <= v <= 100 for v in start.values())
    trainer.is_log_step = False  # between log steps: nothing
    monitor.on_train_batch_end(trainer, None, None, None, 1)
    assert len(trainer.loggers[0].calls) == 2


def test_cpu_stats_false_logs_nothing_on_cpu_and_filter_keys_keeps_the_named(tmp_path):
    trainer = _trainer(tmp_path, is_log_step=True)
    off = DeviceStatsMonitor(cpu_stats=False)
    off.setup(trainer, None, "fit")
    off.on_train_batch_end(trainer, None, None, None, 0)
    assert trainer.loggers[0].calls == []
    chosen = DeviceStatsMonitor(filter_keys={"cpu_percent", "gpu_util"})
    with pytest.warns(UserWarning, match=r"filter_keys \['gpu_util'\] are not among the statistics of cpu"):
        chosen.setup(trainer, None, "fit")
    chosen.on_validation_batch_end(trainer, None, None, None, 0)
    assert list(trainer.loggers[0].calls[0][0]) == ["DeviceStatsMonitor.on_validation_batch_end/cpu_percent"]


def test_a_trainer_without_logger_or_without_psutil_is_refused(tmp_path, monkeypatch):
    with pytest.raises(TandemConfigError, match="the Trainer has none"):
        DeviceStatsMonitor().setup(_trainer(tmp_path, loggers=[]), None, "fit")
    monkeypatch.setattr(device_stats_monitor, "psutil_available", lambda: False)
    with pytest.raises(ModuleNotFoundError, match="pip install psutil"):
        DeviceStatsMonitor().setup(_trainer(tmp_path), None, "fit")
    DeviceStatsMonitor(cpu_stats=False).setup(_trainer(tmp_path), None, "fit")  # no CPU stats: no psutil needed
    DeviceStatsMonitor().setup(_trainer(tmp_path, loggers=[]), None, "test")  # only fit is checked, as Lightning


def test_a_fit_writes_the_stats_to_the_logger_every_log_every_n_steps(tmp_path):
    logger = CSVLogger(tmp_path)
    trainer = quiet_trainer(max_epochs=1, logger=logger, log_every_n_steps=2, callbacks=[DeviceStatsMonitor()])
    trainer.fit(TinyModule(), loader(64, 16))  # 4 steps: steps 2 and 4 log
    with open(f"{logger.log_dir}/metrics.csv") as f:
        rows = list(csv.DictReader(f))

    def steps(key):
        return [int(r["step"]) for r in rows if r.get(key)]

    # each log step's batch: the stats before it (at the step count before) and after it (with its train_loss)
    assert steps("DeviceStatsMonitor.on_train_batch_start/cpu_vm_percent") == [1, 3]
    assert steps("DeviceStatsMonitor.on_train_batch_end/cpu_vm_percent") == steps("train_loss") == [1, 3]
