"""The module and data shared by ``ddp_trainer_runs.py`` (the DDP ranks) and the test process (the
single-device references and ``ddp_spawn``), so both sides train exactly the same thing."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchmetrics
from torch import nn
from torch.utils.data import IterableDataset, TensorDataset

import tandem

FEATURES, CLASSES = 8, 3
TRAIN_SAMPLES, BATCH = 192, 4  # per rank: 24 batches of 4 samples an epoch on 2 ranks
EVAL_SAMPLES, EVAL_BATCH = 101, 10  # uneven: rank 0 gets 51 samples (6 batches), rank 1 gets 50 (5)


def dataset(n: int, seed: int = 1) -> TensorDataset:
    """``n`` samples; ``x[:, 0]`` is unique per sample, so a batch tells which samples it holds."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    x[:, 0] = torch.arange(n, dtype=torch.float32) / n
    y = ((x[:, 1] > 0).long() + (x[:, 2] > 0.5).long()) % CLASSES
    return TensorDataset(x, y)


class RankSamples(IterableDataset):
    """Data of unknown length that each rank reads its own share of (the user shards by hand): rank r yields
    ``per_rank[r]`` samples of ``dataset(sum(per_rank), seed)``, rank 0 the first ones."""

    def __init__(self, per_rank: tuple[int, ...], seed: int) -> None:
        self.per_rank, self.seed = per_rank, seed

    def __iter__(self):
        data = dataset(sum(self.per_rank), self.seed)
        rank = dist.get_rank() if dist.is_initialized() else 0
        start = sum(self.per_rank[:rank])
        return (data[i] for i in range(start, start + self.per_rank[rank]))


class Net(tandem.TrainingModule):
    """A small classifier. Validation and test log a sync_dist mean loss, a torchmetrics accuracy and a
    step-level sync_dist value (ranks run different numbers of evaluation batches: this must not hang)."""

    def __init__(self, optimizer: str = "sgd", lr: float = 0.05, dropout: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Dropout(dropout), nn.ReLU(), nn.Linear(16, CLASSES))
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(CLASSES, average="micro")
        self.test_acc = torchmetrics.classification.MulticlassAccuracy(CLASSES, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], stage: str, accuracy: torchmetrics.Metric) -> None:
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        accuracy(logits, y)
        self.log(f"{stage}_loss", loss, sync_dist=True)
        self.log(f"{stage}_acc", accuracy)
        self.log(f"{stage}_loss_sum", F.cross_entropy(logits, y, reduction="sum"), sync_dist=True, reduce_fx="sum")
        self.log(f"{stage}_step_synced", loss, on_step=True, on_epoch=False, sync_dist=True)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_acc)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_acc)

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        x, _ = batch
        return {"x0": x[:, 0], "logits": self(x)}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.hparams.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


#: elastic resume: both runs save in the middle of epoch 1 (24 global batches of 8 an epoch), after batch 10
ELASTIC_STEP = 34


class SaveAtStep(tandem.Callback):
    """``trainer.save_checkpoint(path)`` at the end of the batch whose optimizer step makes ``global_step`` equal
    ``step``; the run goes on, so it is also the uninterrupted run."""

    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.is_stepping_batch:
            trainer.save_checkpoint(self.path)


def elastic_trainer(**kwargs) -> tandem.Trainer:
    """The elastic runs' Trainer: 2 epochs, a CSV row every step (so the resumed rows can be matched)."""
    from tandem.loggers import CSVLogger

    folder = kwargs.pop("csv")
    options = dict(accelerator="cpu", enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    return tandem.Trainer(max_epochs=2, log_every_n_steps=1, logger=CSVLogger(folder, name=""), **options, **kwargs)
