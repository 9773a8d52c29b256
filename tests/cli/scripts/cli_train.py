"""A program built on tandem.cli, for the end-to-end tests: ``python cli_train.py fit --config ...``.

Under ``strategy=ddp`` tandem re-runs this command for rank 1, which parses the same argv. With
``CLI_TEST_OUT`` set, each rank writes what it ran with to ``<CLI_TEST_OUT>/rank<r>.json``.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem
from tandem.cli import CLI


class Classifier(tandem.TrainingModule):
    """A two-layer classifier with dropout, trained with SGD.

    Args:
        hidden: width of the hidden layer.
        lr: learning rate of SGD.
        dropout: probability of zeroing a hidden unit.
    """

    def __init__(self, hidden: int = 16, lr: float = 0.1, dropout: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class RandomData(tandem.DataModule):
    """The same random samples on every run; the training order is shuffled (it follows the seed).

    Args:
        samples: training samples.
        batch_size: samples per training batch.
    """

    def __init__(self, samples: int = 96, batch_size: int = 16) -> None:
        super().__init__()
        self.samples = samples
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.samples + 32, 8, generator=g)
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
        self.train_set = TensorDataset(x[: self.samples], y[: self.samples])
        self.val_set = TensorDataset(x[self.samples :], y[self.samples :])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=32)


if __name__ == "__main__":
    cli = CLI(Classifier, RandomData)
    out = os.environ.get("CLI_TEST_OUT")
    if out:
        trainer = cli.trainer
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "seed": cli.config.seed_everything,
            "config": OmegaConf.to_yaml(cli.config),
            "log_dir": trainer.log_dir,
            "global_step": trainer.global_step,
            "weights": {k: v.sum().item() for k, v in cli.model.state_dict().items()},
        }
        with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as file:
            json.dump(record, file)
