"""What ``LearningRateMonitor`` leaves in ``trainer.callback_metrics``, batch by batch, on one program that runs
unchanged under Lightning and under tandem; ``tests/callbacks/test_lr_monitor.py`` compares tandem's with the
numbers this script printed under Lightning 2.6.6 (issue 29, item 5).

The program: manual optimization of four optimizers (an AdamW with two parameter groups, an SGD with momentum and a
per-step StepLR, an Adam whose per-epoch scheduler is named ``"head_rate"``, a second SGD without scheduler, its
one group named ``"bias"``), 2 epochs of 4 batches, a CSVLogger, ``log_every_n_steps=2``, the schedulers stepped
by ``training_step`` (per-step ones every batch, the named one at each epoch end).

Run it (from the repository root):

    /tmp/lvenv/bin/python tests/callbacks/scripts/lr_monitor_parity.py --lightning   # Lightning's, as JSON
    .venv/bin/python tests/callbacks/scripts/lr_monitor_parity.py                    # tandem's

This file imports Lightning only under ``--lightning``; the tests load it without.
"""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: the monitor's settings tried: name -> keyword arguments of ``LearningRateMonitor``
MONITORS: dict[str, dict[str, Any]] = {
    "none": dict(),
    "step": dict(logging_interval="step", log_momentum=True),
    "epoch": dict(logging_interval="epoch", log_weight_decay=True),
}


def data() -> DataLoader:
    g = torch.Generator().manual_seed(3)
    return DataLoader(TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)), batch_size=4)


def classes(framework: Any, base: type) -> tuple[type, type]:
    """The module (on ``base``) and the snapshot callback, on ``framework``'s classes."""

    class FourOptimizers(base):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.a, self.b, self.c, self.d = (nn.Linear(4, 1) for _ in range(4))

        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            loss = sum(nn.functional.mse_loss(layer(x), y) for layer in (self.a, self.b, self.c, self.d))
            optimizers = self.optimizers()
            for optimizer in optimizers:
                optimizer.zero_grad()
            self.manual_backward(loss)
            for optimizer in optimizers:
                optimizer.step()
            step_sched, epoch_sched = self.lr_schedulers()
            step_sched.step()
            if batch_idx == 3:
                epoch_sched.step()

        def configure_optimizers(self) -> Any:
            adamw = torch.optim.AdamW(
                [{"params": self.a.weight}, {"params": self.a.bias, "lr": 0.002}], lr=0.001, weight_decay=0.05
            )
            sgd = torch.optim.SGD(self.b.parameters(), lr=0.1, momentum=0.9)
            adam = torch.optim.Adam(self.c.parameters(), lr=0.01)
            plain = torch.optim.SGD([{"params": self.d.parameters(), "name": "bias"}], lr=0.3)
            schedulers = [
                {"scheduler": torch.optim.lr_scheduler.StepLR(sgd, step_size=1, gamma=0.5), "interval": "step"},
                {"scheduler": torch.optim.lr_scheduler.StepLR(adam, step_size=1, gamma=0.1), "name": "head_rate"},
            ]
            return [adamw, sgd, adam, plain], schedulers

    class Snapshots(framework.Callback):
        """``callback_metrics`` after each training batch (the program logs nothing itself): [name, value, dtype]."""

        def __init__(self) -> None:
            self.seen: list[list[list[Any]]] = []

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            metrics = trainer.callback_metrics
            self.seen.append([[k, float(v), str(v.dtype)] for k, v in sorted(metrics.items())])

    return FourOptimizers, Snapshots


def run(lightning: bool = False) -> dict[str, Any]:
    """For each of :data:`MONITORS`: the snapshots after every batch."""
    if lightning:
        import lightning.pytorch as framework
        from lightning.pytorch.callbacks import LearningRateMonitor
        from lightning.pytorch.loggers import CSVLogger

        base = framework.LightningModule
    else:
        import tandem as framework
        from tandem.callbacks import LearningRateMonitor
        from tandem.loggers import CSVLogger

        base = framework.TrainingModule
    module_class, snapshot_class = classes(framework, base)
    out: dict[str, Any] = {}
    for name, kwargs in MONITORS.items():
        torch.manual_seed(0)
        snapshots = snapshot_class()
        with tempfile.TemporaryDirectory() as folder:
            trainer = framework.Trainer(
                accelerator="cpu",
                devices=1,
                max_epochs=2,
                logger=CSVLogger(folder),
                log_every_n_steps=2,
                callbacks=[LearningRateMonitor(**kwargs), snapshots],
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                default_root_dir=folder,
            )
            trainer.fit(module_class(), data())
        out[name] = snapshots.seen
    return out


if __name__ == "__main__":
    print(json.dumps(run(lightning="--lightning" in sys.argv)))
