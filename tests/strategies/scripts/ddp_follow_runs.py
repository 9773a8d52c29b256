"""DDP that follows the module (issue 30): five patterns of public Lightning programs, each trained under
``Trainer(strategy="ddp", devices=2)`` by the ``follow`` scenario of ``ddp_trainer_runs.py`` (the shared launch:
``tests/conftest.py``) and, by the tests, on one process with twice the batch. :func:`fit` is one pattern's fit; each rank returns
what it ended with.

    unfreeze   BaseFinetuning freezes the backbone before training and unfreezes it at epoch 1 (Lightning's own
               finetuning example); a checkpoint saved mid-epoch 2 is resumed to the same end
    head       a callback adds a head in on_fit_start (rank 1's starts otherwise: rank 0's must win) and trains it
               with its own optimizer in on_train_batch_end (the Barlow Twins tutorial's online fine-tuner)
    plateau    ReduceLROnPlateau on a monitor logged without sync_dist (each rank's own value)
    gan        two optimizers toggled with manual_backward under plain "ddp" (Lightning's GAN example)
    target     a target network that takes no part in the loss, copied from the online one each epoch (DQN)
    fsdp_unfreeze  the unfreeze under strategy="fsdp" (FSDP2 follows a frozen-then-unfrozen block by itself)
    midway     the backbone unfrozen in on_train_batch_start at the third batch of epoch 0 (picked up that step)
    diverge    each rank changes a bias by its own amount outside the optimizer (what no trainer can make
               correct), with Trainer(on_replica_divergence="warn"): the fit ends, rank 0 warns
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "trainer", "scripts"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # tests/: helpers

import manual_modules  # noqa: E402

import tandem  # noqa: E402
from helpers import quiet_trainer  # noqa: E402
from tandem.callbacks import BaseFinetuning  # noqa: E402

SAMPLES, BATCH, EPOCHS = 32, 4, 3  # two ranks x batch 4 = one process x batch 8
ORDER = dict(data_order="global")  # one process draws the same order: the comparison with it


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(SAMPLES, 8, generator=g)
    return TensorDataset(x, ((x[:, 0] > 0).long() + (x[:, 1] > 0).long()) % 3)


def loader(batch_size: int) -> DataLoader:
    return DataLoader(dataset(), batch_size=batch_size, shuffle=False)


def weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class Backboned(tandem.TrainingModule):
    """A backbone and a head; the optimizer takes what is trainable when it is built (the finetuning recipe)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 12))
        self.head = nn.Linear(12, 3)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.head(self.backbone(x)), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)  # no sync_dist: each rank's own value
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.2, momentum=0.9)


class UnfreezeAtEpochOne(BaseFinetuning):
    def freeze_before_training(self, module: Backboned) -> None:
        self.freeze(module.backbone)

    def finetune_function(self, module: Backboned, epoch: int, optimizer: torch.optim.Optimizer) -> None:
        if epoch == 1:
            self.unfreeze_and_add_param_group(module.backbone, optimizer, lr=0.1)


class SaveAt(tandem.Callback):
    def __init__(self, step: int, path: str) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


class OnlineHead(tandem.Callback):
    """Attaches ``module.online`` when the fit starts (seeded by ``seed``) and trains it on the detached backbone
    features with its own optimizer after each batch."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.optimizer: torch.optim.Optimizer | None = None

    def on_fit_start(self, trainer: Any, module: Backboned) -> None:
        module.online = nn.Linear(12, 3)
        g = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():
            module.online.weight.copy_(torch.randn(3, 12, generator=g) * 0.3)
            module.online.bias.zero_()
        self.optimizer = torch.optim.SGD(module.online.parameters(), lr=0.3)

    def on_train_batch_end(self, trainer: Any, module: Backboned, outputs: Any, batch: Any, batch_idx: int) -> None:
        x, y = batch
        with torch.no_grad():
            features = module.backbone(x)
        loss = F.cross_entropy(module.online(features), y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()


class UnfreezeMidway(tandem.Callback):
    def setup(self, trainer: Any, module: Backboned, stage: str) -> None:  # before the optimizer is built
        module.backbone.requires_grad_(False)

    def on_train_batch_start(self, trainer: Any, module: Backboned, batch: Any, batch_idx: int) -> None:
        if trainer.current_epoch == 0 and batch_idx == 2:
            module.backbone.requires_grad_(True)
            trainer.optimizers[0].add_param_group({"params": list(module.backbone.parameters()), "lr": 0.1})


class PerRankNudge(tandem.Callback):
    def on_train_batch_end(self, trainer: Any, module: Backboned, outputs: Any, batch: Any, batch_idx: int) -> None:
        with torch.no_grad():
            module.head.bias.add_(0.001 * trainer.global_rank)


class Plateaued(Backboned):
    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.2)
        # patience 0 and a threshold no epoch meets: the rate falls every epoch, whatever the value each rank sees
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=10.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "train_loss"}}


class WithTarget(tandem.TrainingModule):
    """The online network learns towards the target network's output; the target is copied each epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.online = nn.Linear(8, 3)
        self.target = nn.Linear(8, 3)  # requires gradients, takes no part in the loss
        self.target.load_state_dict(self.online.state_dict())

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        with torch.no_grad():
            goal = 0.5 * self.target(x) + F.one_hot(y, 3)
        return F.mse_loss(self.online(x), goal)

    def on_train_epoch_end(self) -> None:
        self.target.load_state_dict(self.online.state_dict())

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.online.parameters(), lr=0.05)


def fit(pattern: str, devices: int, rank: int = 0, root: Path | None = None) -> dict[str, Any]:
    """One pattern's fit (``devices`` processes, batch ``8 // devices`` each): its final weights, and more."""
    torch.manual_seed(0)
    batch = 2 * BATCH // devices
    kwargs: dict[str, Any] = dict(max_epochs=EPOCHS, **ORDER)
    if devices > 1:
        kwargs.update(strategy="fsdp" if pattern.startswith("fsdp") else "ddp", devices=devices)
    result: dict[str, Any] = {}
    if pattern == "diverge":
        module = Backboned()
        trainer = quiet_trainer(callbacks=[PerRankNudge()], on_replica_divergence="warn", **kwargs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(module, loader(batch))
        said = [str(w.message) for w in caught if "replicas differ" in str(w.message)]
        return {"final": weights(module), "steps": trainer.global_step, "warnings": said}
    if pattern == "fsdp_unfreeze":
        module = Backboned()
        trainer = quiet_trainer(callbacks=[UnfreezeAtEpochOne()], **kwargs)
        trainer.fit(module, loader(batch))
        whole = trainer.strategy.full_module_state_dict() if devices > 1 else weights(module)  # every rank gathers
        return {"final": whole, "steps": trainer.global_step}
    if pattern == "midway":
        module = Backboned()
        trainer = quiet_trainer(callbacks=[UnfreezeMidway()], **kwargs)
        trainer.fit(module, loader(batch))
        return {"final": weights(module), "steps": trainer.global_step}
    if pattern in ("unfreeze", "head", "plateau"):
        module = Plateaued() if pattern == "plateau" else Backboned()
        callbacks: list[tandem.Callback] = []
        if pattern == "unfreeze":
            callbacks = [UnfreezeAtEpochOne()]
            if root is not None:
                callbacks.append(SaveAt(2 * (SAMPLES // 8) + 1, str(root / "unfreeze-mid-epoch-2.ckpt")))
        if pattern == "head":
            callbacks = [OnlineHead(seed=1 + 100 * rank)]
        trainer = quiet_trainer(callbacks=callbacks, **kwargs)
        trainer.fit(module, loader(batch))
        result["lrs"] = [g["lr"] for g in trainer.optimizers[0].param_groups]
        if pattern == "unfreeze" and root is not None:  # resumed from the checkpoint saved after the unfreeze
            torch.manual_seed(5)
            again = Backboned()
            resumed = quiet_trainer(callbacks=[UnfreezeAtEpochOne()], **kwargs)
            resumed.fit(again, loader(batch), ckpt_path=str(root / "unfreeze-mid-epoch-2.ckpt"))
            result["resumed"] = weights(again)
    elif pattern == "gan":
        module = manual_modules.ToyGAN()
        trainer = quiet_trainer(**kwargs)
        trainer.fit(module, manual_modules.loader(manual_modules.BATCH * 2 // devices))
    else:
        module = WithTarget()
        trainer = quiet_trainer(**kwargs)
        trainer.fit(module, loader(batch))
    result.update(final=weights(module), steps=trainer.global_step)
    return result


PATTERNS = ("unfreeze", "head", "plateau", "gan", "target", "fsdp_unfreeze", "midway", "diverge")
