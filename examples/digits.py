"""Classify handwritten digits with a small CNN: tandem's end-to-end example.

The data is scikit-learn's bundled 8x8 digits (1,797 images that ship inside scikit-learn, so nothing is
downloaded). A default run (10 epochs) takes about 8 s on 2 idle CPU cores and reaches about 98% test accuracy.

    python examples/digits.py                                   # one process, CPU (or CUDA when present)
    python examples/digits.py --strategy ddp --devices 2        # two processes on the CPU (gloo)
    python examples/digits.py --precision bf16-mixed --max-epochs 5
    tensorboard --logdir runs/digits                            # watch the curves
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from tandem import DataModule, Trainer, TrainingModule, seed_everything


class DigitsData(DataModule):
    """Train / validation / test splits of the 8x8 digits: 1,257 / 180 / 360 images, the same on every run.

    Args:
        batch_size: images per training batch.
        split_seed: seed of the train / validation / test split (kept apart from the run's seed).
    """

    def __init__(self, batch_size: int = 64, split_seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.split_seed = split_seed  # fixed apart from --seed, so every run is scored on the same test set

    def setup(self, stage: str) -> None:
        # Runs on every process. The data ships with scikit-learn, so there is nothing for prepare_data to fetch.
        images, labels = load_digits(return_X_y=True)
        x = torch.tensor(images, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0  # pixels are 0..16
        y = torch.tensor(labels, dtype=torch.long)
        rest_x, test_x, rest_y, test_y = train_test_split(
            x, y, test_size=360, stratify=y, random_state=self.split_seed
        )
        train_x, val_x, train_y, val_y = train_test_split(
            rest_x, rest_y, test_size=180, stratify=rest_y, random_state=self.split_seed
        )
        self.train_set = TensorDataset(train_x, train_y)
        self.val_set = TensorDataset(val_x, val_y)
        self.test_set = TensorDataset(test_x, test_y)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=256)


class DigitsCNN(TrainingModule):
    """Two 3x3 convolutions with batch norm, a max-pool, and two linear layers: about 151k parameters.

    Args:
        lr: AdamW's learning rate (a cosine schedule lowers it over max_epochs).
        dropout: probability of zeroing an activation before each linear layer.
    """

    def __init__(self, lr: float = 1e-3, dropout: float = 0.25) -> None:
        super().__init__()
        self.save_hyperparameters()  # lr and dropout go into checkpoints, hparams.yaml and TensorBoard
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),   # 32 x 8 x 8
            nn.Conv2d(32, 64, kernel_size=3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),  # 64 x 8 x 8
            nn.MaxPool2d(2), nn.Flatten(),                                               # 64 x 4 x 4
            nn.Dropout(dropout), nn.Linear(1024, 128), nn.ReLU(),
            nn.Dropout(dropout), nn.Linear(128, 10),
        )
        # Metrics are submodules: they move to the module's device and sync across processes by themselves.
        self.val_acc = MulticlassAccuracy(num_classes=10, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=10, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)  # every step (training default)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.val_acc(logits, y)
        # Epoch means (the evaluation default); sync_dist averages them across processes under DDP.
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True, sync_dist=True)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.test_acc(self(x), y)
        self.log("test_acc", self.test_acc)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.max_epochs)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="auto", help="auto, single_device, ddp, ddp_spawn, fsdp or dp")
    parser.add_argument("--devices", default="auto", help="'auto', a number of devices/processes, or '0,1'")
    parser.add_argument("--accelerator", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--precision", default="32-true", help="32-true, bf16-mixed, 16-mixed or 64-true")
    parser.add_argument("--max-epochs", type=int, default=10)
    parser.add_argument("--root-dir", default="runs/digits", help="where logs and checkpoints go")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    if args.devices.isdigit():
        args.devices = int(args.devices)
    return args


def tensorboard_command() -> str:
    """The TensorBoard installed beside this Python: ``tensorboard`` where the PATH finds that one (an activated
    environment), else its path (``.venv/bin/tensorboard`` after ``make demo``, whose .venv is not activated)."""
    beside = Path(sys.executable).parent / "tensorboard"
    on_path = shutil.which("tensorboard")
    if not beside.is_file() or (on_path is not None and os.path.samefile(on_path, beside)):
        return "tensorboard"
    relative = os.path.relpath(beside)
    return str(beside) if relative.startswith("..") else relative


def main() -> None:
    args = parse_args()
    seed_everything(args.seed)

    data = DigitsData()
    model = DigitsCNN()
    trainer = Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=args.strategy,
        precision=args.precision,
        max_epochs=args.max_epochs,
        default_root_dir=args.root_dir,
        log_every_n_steps=10,
    )
    trainer.fit(model, datamodule=data)

    # Under DDP every process runs the lines below: all of them must call test (it is a collective),
    # and only global rank 0 prints.
    (results,) = trainer.test(model, datamodule=data)
    if trainer.is_global_zero:
        print(f"test accuracy: {results['test_acc']:.4f}")
        print(f"logs and checkpoints: {trainer.log_dir}")
        print(f"watch them with:      {tensorboard_command()} --logdir {args.root_dir}")


if __name__ == "__main__":
    main()
