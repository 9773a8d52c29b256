"""Modules and data that both ``core_ddp_runs.py`` (two processes) and the tests (one process) train, so the
results can be compared: manual optimization with two optimizers and with one, and a module evaluated on
several loaders."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem

FEATURES, LATENT = 6, 4
SAMPLES, BATCH = 64, 4  # two ranks: 8 batches of 4 per rank and epoch; one process: 8 batches of 8


def dataset(n: int = SAMPLES) -> TensorDataset:
    """Real samples ``x`` and the latent input ``z`` that goes with each (so no randomness in the step)."""
    g = torch.Generator().manual_seed(11)
    return TensorDataset(torch.randn(n, FEATURES, generator=g) * 0.5 + 1.0, torch.randn(n, LATENT, generator=g))


def loader(batch_size: int) -> DataLoader:
    return DataLoader(dataset(), batch_size=batch_size, shuffle=False)


class ToyGAN(tandem.TrainingModule):
    """Two optimizers, toggle_optimizer, two backward passes per step (the GAN pattern)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(LATENT, 8), nn.Tanh(), nn.Linear(8, FEATURES))
        self.discriminator = nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, z = batch
        opt_g, opt_d = self.optimizers()
        ones, zeros = torch.ones(len(x), 1), torch.zeros(len(x), 1)
        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z)), ones)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)
        self.toggle_optimizer(opt_d)
        real = F.binary_cross_entropy_with_logits(self.discriminator(x), ones)
        fake = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z).detach()), zeros)
        d_loss = (real + fake) / 2
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss})

    def configure_optimizers(self) -> Any:
        return (
            [
                torch.optim.SGD(self.generator.parameters(), lr=0.1, momentum=0.9),
                torch.optim.Adam(self.discriminator.parameters(), lr=0.01),
            ],
            [],
        )


class ManualOne(tandem.TrainingModule):
    """One optimizer stepped by hand, clipped with ``self.clip_gradients``; its scheduler stepped by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = nn.Sequential(nn.Linear(LATENT, 8), nn.Tanh(), nn.Linear(8, FEATURES))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, z = batch
        opt = self.optimizers()
        loss = F.mse_loss(self.net(z), x)
        opt.zero_grad()
        self.manual_backward(loss)
        self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
        opt.step()
        self.log("loss", loss)
        return loss

    def on_train_epoch_end(self) -> None:
        self.lr_schedulers().step()

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


MODULES = {"gan": ToyGAN, "single": ManualOne}


# ---------------------------------------------------------------------------------------------- several loaders
def labelled(n: int, seed: int) -> TensorDataset:
    """``x[:, 0]`` is unique per sample, so predictions tell which samples they are."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    x[:, 0] = torch.arange(n, dtype=torch.float32) / n
    return TensorDataset(x, (x[:, 1] > 0).long() + (x[:, 2] > 0).long())


def eval_loaders() -> list[DataLoader]:
    """Uneven sizes: 101 samples (2 ranks: 51 + 50), 37 samples (19 + 18)."""
    return [DataLoader(labelled(101, seed=5), batch_size=10), DataLoader(labelled(37, seed=6), batch_size=8)]


class Evaluated(tandem.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(FEATURES, 3)
        self.seen = {0: 0, 1: 0}  # validation samples of each loader, this process

    def _evaluate(self, batch: Any, prefix: str) -> None:
        x, y = batch
        self.log(f"{prefix}_loss", F.cross_entropy(self.net(x), y), sync_dist=True)
        self.log(f"{prefix}_count", float(len(y)), sync_dist=True, reduce_fx="sum")

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._evaluate(batch, "val")
        self.seen[dataloader_idx] += len(batch[1])

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        return {"x0": batch[0][:, 0], "logits": self.net(batch[0])}
