"""A tiny ``Trainer(strategy="ddp", devices=2)`` fit, started by ``mpiexec -n 2 python mpi_run.py <out>``: every
process that runs the fit writes ``<out>/process-<pid>.json`` with its rank, world size, environment and weights."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

import tandem


class Line(tandem.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8, shuffle=True)
    trainer = tandem.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = Line()
    trainer.fit(module, data)
    result = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "environment": type(trainer.strategy.environment).__name__,
        "weights": [round(v, 6) for v in module.net.weight.flatten().tolist()],
    }
    (Path(sys.argv[1]) / f"process-{os.getpid()}.json").write_text(json.dumps(result))
