"""Three programs written the way Lightning 2.x users write them, ported by renaming only:
``lightning.pytorch`` -> ``tandem``, ``LightningModule`` -> ``TrainingModule``.

- :class:`GAN`: Lightning's basic GAN example, shrunk: manual optimization, two optimizers,
  ``toggle_optimizer``, ``training_step(self, batch)`` without ``batch_idx``, a sample logged each
  validation epoch.
- :class:`TwoValSets`: a classifier validated on two loaders: ``validation_step(..., dataloader_idx=0)``,
  metrics named ``val_loss/dataloader_idx_N``, a ModelCheckpoint and a ReduceLROnPlateau on the first one
  (``configure_optimizers`` returns a dict with a top-level ``"monitor"``).
- :class:`OwnData`: a module that owns its data (``prepare_data`` writes a file once, ``setup`` reads it,
  ``train/val/test_dataloader``), fitted with ``trainer.fit(model)`` and restored with
  ``OwnData.load_from_checkpoint(best)``.

Shared by ``test_lightning_ports.py`` (one process) and ``scripts/core_ddp_runs.py`` (two processes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

import tandem as L  # was: import lightning.pytorch as L
from tandem.callbacks import ModelCheckpoint  # was: from lightning.pytorch.callbacks import ModelCheckpoint

IMG_SHAPE = (1, 4, 4)


def images(n: int = 64, seed: int = 0) -> TensorDataset:
    """Small "images" with structure a generator can learn, and a label each."""
    g = torch.Generator().manual_seed(seed)
    base = torch.linspace(-1, 1, 16).reshape(IMG_SHAPE)
    x = torch.tanh(base * torch.rand(n, 1, 1, 1, generator=g) * 3 + 0.1 * torch.randn(n, *IMG_SHAPE, generator=g))
    return TensorDataset(x, torch.zeros(n, dtype=torch.long))


def points(n: int, seed: int, shift: float = 0.0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g) + shift
    y = ((x[:, 0] > shift).long() + (x[:, 1] > shift).long()) % 3
    return TensorDataset(x, y)


# ---------------------------------------------------------------------------------------------- the GAN
class Generator(nn.Module):
    def __init__(self, latent_dim: int, img_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.img_shape = img_shape
        self.model = nn.Sequential(
            nn.Linear(latent_dim, 32), nn.LeakyReLU(0.2), nn.Linear(32, int(torch.tensor(img_shape).prod())), nn.Tanh()
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.model(z).view(z.size(0), *self.img_shape)


class Discriminator(nn.Module):
    def __init__(self, img_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(int(torch.tensor(img_shape).prod()), 32), nn.LeakyReLU(0.2), nn.Linear(32, 1), nn.Sigmoid()
        )

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return self.model(img.view(img.size(0), -1))


class GAN(L.TrainingModule):
    def __init__(self, latent_dim: int = 8, lr: float = 0.0002, b1: float = 0.5, b2: float = 0.999) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = Generator(latent_dim=self.hparams.latent_dim, img_shape=IMG_SHAPE)
        self.discriminator = Discriminator(img_shape=IMG_SHAPE)
        self.validation_z = torch.randn(8, self.hparams.latent_dim)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.generator(z)

    def adversarial_loss(self, y_hat: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy(y_hat, y)

    def training_step(self, batch: Any) -> None:
        imgs, _ = batch
        optimizer_g, optimizer_d = self.optimizers()
        z = torch.randn(imgs.shape[0], self.hparams.latent_dim).type_as(imgs)

        # train generator
        self.toggle_optimizer(optimizer_g)
        self.generated_imgs = self(z)
        valid = torch.ones(imgs.size(0), 1).type_as(imgs)
        g_loss = self.adversarial_loss(self.discriminator(self(z)), valid)
        self.log("g_loss", g_loss, prog_bar=True)
        self.manual_backward(g_loss)
        optimizer_g.step()
        optimizer_g.zero_grad()
        self.untoggle_optimizer(optimizer_g)

        # train discriminator
        self.toggle_optimizer(optimizer_d)
        valid = torch.ones(imgs.size(0), 1).type_as(imgs)
        real_loss = self.adversarial_loss(self.discriminator(imgs), valid)
        fake = torch.zeros(imgs.size(0), 1).type_as(imgs)
        fake_loss = self.adversarial_loss(self.discriminator(self(z).detach()), fake)
        d_loss = (real_loss + fake_loss) / 2
        self.log("d_loss", d_loss, prog_bar=True)
        self.manual_backward(d_loss)
        optimizer_d.step()
        optimizer_d.zero_grad()
        self.untoggle_optimizer(optimizer_d)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        pass

    def configure_optimizers(self) -> Any:
        lr, b1, b2 = self.hparams.lr, self.hparams.b1, self.hparams.b2
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(b1, b2))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(b1, b2))
        return [opt_g, opt_d], []

    def on_validation_epoch_end(self) -> None:
        z = self.validation_z.type_as(self.generator.model[0].weight)
        sample_imgs = self(z)
        self.log("sample_mean", sample_imgs.mean())


def run_gan(root: str | os.PathLike, **trainer_kwargs: Any) -> tuple[GAN, L.Trainer]:
    L.seed_everything(0)
    model = GAN()
    loader = DataLoader(images(64), batch_size=16, shuffle=True)
    trainer = L.Trainer(max_epochs=2, default_root_dir=root, enable_progress_bar=False, **trainer_kwargs)
    trainer.fit(model, loader, DataLoader(images(8, seed=1), batch_size=8))
    return model, trainer


# ---------------------------------------------------------------------------------------------- two validation sets
class TwoValSets(L.TrainingModule):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
        return {"optimizer": optimizer, "lr_scheduler": scheduler, "monitor": "val_loss/dataloader_idx_0"}


def val_sets() -> list[DataLoader]:
    """An in-distribution set and a shifted one, of uneven sizes (DDP: no padding either)."""
    return [DataLoader(points(37, seed=2), batch_size=8), DataLoader(points(21, seed=3, shift=0.5), batch_size=8)]


def run_two_val_sets(root: str | os.PathLike, **trainer_kwargs: Any) -> tuple[TwoValSets, L.Trainer, list]:
    L.seed_everything(0)
    model = TwoValSets()
    checkpoint = ModelCheckpoint(monitor="val_loss/dataloader_idx_0", mode="min", save_top_k=1)
    trainer = L.Trainer(
        max_epochs=3, default_root_dir=root, callbacks=[checkpoint], enable_progress_bar=False, **trainer_kwargs
    )
    trainer.fit(model, DataLoader(points(96, seed=1), batch_size=8, shuffle=True), val_sets())
    return model, trainer, trainer.validate(model, val_sets(), verbose=False)


# ---------------------------------------------------------------------------------------------- a module with its own data
class OwnData(L.TrainingModule):
    def __init__(self, data_dir: str, hidden: int = 16, lr: float = 0.01, batch_size: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 3))
        self.prepared = 0

    @property
    def data_file(self) -> Path:
        return Path(self.hparams.data_dir) / "points.pt"

    def prepare_data(self) -> None:  # "download" once per node
        if not self.data_file.exists():
            self.data_file.parent.mkdir(parents=True, exist_ok=True)
            data = points(120, seed=4)
            torch.save({"x": data.tensors[0], "y": data.tensors[1]}, self.data_file)
        self.prepared += 1

    def setup(self, stage: str) -> None:
        saved = torch.load(self.data_file)
        full = TensorDataset(saved["x"], saved["y"])
        self.train_set, self.val_set, self.test_set = random_split(
            full, [80, 20, 20], generator=torch.Generator().manual_seed(42)
        )

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=self.hparams.batch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("test_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("test_acc", (logits.argmax(dim=1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def run_own_data(root: str | os.PathLike, **trainer_kwargs: Any) -> dict[str, Any]:
    L.seed_everything(0)
    model = OwnData(data_dir=str(root))
    checkpoint = ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=1)
    trainer = L.Trainer(
        max_epochs=3, default_root_dir=root, callbacks=[checkpoint], enable_progress_bar=False, **trainer_kwargs
    )
    trainer.fit(model)
    best = checkpoint.best_model_path
    restored = OwnData.load_from_checkpoint(best)
    return {
        "model": model,
        "trainer": trainer,
        "best": best,
        "restored": restored,
        "test_restored": trainer.test(restored, verbose=False),
        "test_best": trainer.test(ckpt_path="best", verbose=False),  # no model: the fitted one, best weights
    }
