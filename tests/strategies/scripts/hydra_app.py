"""A Hydra app that fits with ``Trainer(strategy="ddp", devices=2)``: every rank writes ``rank<r>.json`` (its rank,
the job's ``lr``) into the job's run folder. Run as ``python hydra_app.py [hydra overrides]``."""

from __future__ import annotations

import json
from pathlib import Path

import hydra
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from torch.utils.data import DataLoader, TensorDataset

import tandem

ConfigStore.instance().store(name="config", node={"lr": 0.1, "max_epochs": 1})


class Line(tandem.TrainingModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


@hydra.main(version_base=None, config_name="config")
def main(config) -> None:
    x = torch.randn(32, 4)
    trainer = tandem.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=config.max_epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Line(config.lr), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8))
    out = Path(HydraConfig.get().runtime.output_dir)
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps({"rank": trainer.global_rank, "lr": config.lr}))


if __name__ == "__main__":
    main()
