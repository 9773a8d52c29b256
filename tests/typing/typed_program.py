"""A small user program, type-checked by `make test` (mypy, settings in pyproject.toml): what a user's editor sees.

It is never run by pytest (no test_ prefix); `tests/typing/` exists to be checked.
"""

from __future__ import annotations

import torch
from torch import nn

import tandem


class Regressor(tandem.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    trainer = tandem.Trainer(max_epochs=1)
    trainer.fit(Regressor())
    step: int = trainer.global_step
    print(step)
