"""Three ``Tuner.lr_find`` calls on one seeded model (Lightning's ``test_multiple_lr_find_calls_gives_same_results``,
with a BoringModel written out), then a fit: run with ``--lightning`` under Lightning to print its numbers, which
tests/tuner/test_lr_finder.py compares with tandem's (``searches()``, imported there without Lightning)."""

from __future__ import annotations

import json
import sys
import tempfile

import torch
from torch.utils.data import DataLoader, Dataset


class RandomDataset(Dataset):
    """Lightning's demo dataset: ``torch.randn(length, size)`` drawn from the global RNG when it is built."""

    def __init__(self, size: int, length: int) -> None:
        self.data = torch.randn(length, size)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]


def make_model(base: type) -> torch.nn.Module:
    class Boring(base):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(32, 2)
            self.lr = 0.1

        def training_step(self, batch, batch_idx):
            out = self.layer(batch)
            return torch.nn.functional.mse_loss(out, torch.ones_like(out))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 64))

    return Boring()


def searches(lightning: bool = False) -> dict:
    if lightning:
        import lightning.pytorch as framework
        from lightning.pytorch.tuner import Tuner

        base = framework.LightningModule
    else:
        import tandem as framework
        from tandem.tuner import Tuner

        base = framework.TrainingModule
    framework.seed_everything(1)
    model = make_model(base)
    trainer = framework.Trainer(
        default_root_dir=tempfile.mkdtemp(),
        max_epochs=2,
        limit_train_batches=10,
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    tuner = Tuner(trainer)
    results = [tuner.lr_find(model).results for _ in range(3)]
    suggestion = model.lr
    trainer.fit(model)
    return {
        "results": results,
        "suggestion": suggestion,
        "weight_sum_after_fit": model.layer.weight.sum().item(),
    }


if __name__ == "__main__":
    print(json.dumps(searches(lightning="--lightning" in sys.argv)))
