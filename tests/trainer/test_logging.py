"""What self.log collects: defaults, naming, epoch aggregation by sums and counts, torchmetrics, routing."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers import TinyModule, loader, quiet_trainer
from tandem.loggers.logger import Logger
from tandem.trainer.logging import MetricCollector

pytestmark = pytest.mark.timeout(30)


class RecordingLogger(Logger):
    def __init__(self):
        super().__init__(".", name="recording", version=0)
        self.records: list[tuple[int, dict[str, float]]] = []
        self.hparams = None

    def log_metrics(self, metrics, step):
        self.records.append((step, dict(metrics)))

    def log_hyperparams(self, params):
        self.hparams = dict(params)

    def save(self):
        pass

    def finalize(self, status):
        self.status = status


def test_defaults_and_names_for_step_and_epoch_values():
    class Logs(TinyModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("both", float(batch_idx), on_step=True, on_epoch=True, reduce_fx="max")
            self.log("epoch_sum", 1.0, on_epoch=True, on_step=False, reduce_fx="sum")
            return loss

        def on_train_epoch_end(self):
            self.log("at_end", 7.0)  # epoch-end hooks default to on_epoch

    logger = RecordingLogger()
    trainer = quiet_trainer(max_epochs=2, logger=logger, log_every_n_steps=2)
    trainer.fit(Logs(lr=0.01), loader(64, 16), loader(32, 16))
    metrics = trainer.callback_metrics
    assert float(metrics["both_epoch"]) == 3.0 and float(metrics["both"]) == 3.0
    assert float(metrics["epoch_sum"]) == 4.0
    assert float(metrics["at_end"]) == 7.0
    steps = [(s, set(m)) for s, m in logger.records if "train_loss" in m]
    assert [s for s, _ in steps] == [2, 4, 6, 8]
    assert all(keys == {"train_loss", "both_step"} for _, keys in steps)
    epoch_records = [m for _, m in logger.records if "epoch" in m]
    assert [m["epoch"] for m in epoch_records] == [0, 1]
    assert {"both_epoch", "epoch_sum", "at_end"} <= set(epoch_records[0])
    val_records = [m for _, m in logger.records if "val_loss" in m]
    assert len(val_records) == 2  # validation epoch values, once per epoch (not during the sanity check)
    assert logger.hparams == {"lr": 0.01, "optimizer": "sgd", "dropout": 0.0, "scheduler": False}
    assert logger.status == "success"
    assert trainer.logged_metrics["epoch"] == 1
    assert "train_loss" in trainer.progress_bar_metrics


def test_epoch_mean_is_weighted_by_batch_size():
    values = torch.arange(10, dtype=torch.float32)

    class Mean(TinyModule):
        def validation_step(self, batch, batch_idx):
            self.log("mean_x", batch[0].mean())

    data = DataLoader(TensorDataset(values, values), batch_size=4)  # batches of 4, 4, 2
    (result,) = quiet_trainer().validate(Mean(), data)
    assert result["mean_x"] == pytest.approx(4.5)  # a mean of batch means would give 5.0


def test_torchmetrics_metric_is_computed_at_epoch_end():
    torchmetrics = pytest.importorskip("torchmetrics")

    class WithMetric(TinyModule):
        def __init__(self):
            super().__init__()
            self.acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.acc(self(x), y)
            self.log("acc", self.acc)
            self.log("plain_acc", (self(x).argmax(1) == y).float().mean())

    (result,) = quiet_trainer().validate(WithMetric(), loader(50, 16))
    assert result["acc"] == pytest.approx(result["plain_acc"], abs=1e-6)


def test_collector_reduces_sums_and_counts_across_processes():
    """With sync_dist, the epoch mean is (sum of weighted sums) / (sum of counts), not a mean of means."""
    other_rank = {"total": torch.tensor(30.0), "count": torch.tensor(10.0)}  # rank 1: mean 3 over 10 samples

    def fake_reduce(tensor, op):
        assert op == "sum"
        # rank 0 has total 2.0 * 2 = 4 over 2 samples; add rank 1's values
        return tensor + (other_rank["total"] if tensor.item() == 4.0 else other_rank["count"])

    collector = MetricCollector(fake_reduce)
    collector.stage, collector.hook = "validate", "validation_step"
    collector.log(
        "m",
        torch.tensor(2.0),
        on_step=None,
        on_epoch=None,
        prog_bar=False,
        logger=True,
        sync_dist=True,
        reduce_fx="mean",
        batch_size=2,
    )
    values = collector.epoch_metrics()
    assert values["m"].item() == pytest.approx(34.0 / 12.0)


def test_log_outside_a_trainer_is_ignored():
    module = TinyModule()
    x, y = next(iter(loader()))
    module.training_step((x, y), 0)  # must not raise without a trainer


def test_hparams_from_init_arguments():
    module = TinyModule(lr=0.5, optimizer="adam")
    assert module.hparams == {"lr": 0.5, "optimizer": "adam", "dropout": 0.0, "scheduler": False}
    assert module.hparams.lr == 0.5


def test_hparams_merge_base_and_subclass_init_arguments():
    class Child(TinyModule):
        def __init__(self, depth: int = 3):
            super().__init__(lr=0.5)

    assert Child().hparams == {"depth": 3, "lr": 0.5, "optimizer": "sgd", "dropout": 0.0, "scheduler": False}
