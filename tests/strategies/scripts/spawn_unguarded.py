"""A ddp_spawn script written without ``if __name__ == "__main__":``: every spawned process imports it again.

Each process that runs this file writes its pid to ``<out>/pid-<pid>`` (the test checks none is left).
"""

import os
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem

Path(sys.argv[1], f"pid-{os.getpid()}").write_text("")


class Regression(tandem.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return ((self.layer(x) - y) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
trainer = tandem.Trainer(
    accelerator="cpu", strategy="ddp_spawn", devices=2, max_epochs=1, logger=False, enable_checkpointing=False
)
trainer.fit(Regression(), loader)
