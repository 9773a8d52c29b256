"""One training run for the exact-resume tests; the test starts it in fresh processes.

usage: resume_run.py ROOT OUT MAX_EPOCHS [--every-n-steps N] [--die-at-step S] [--resume] [--iterable]
Writes OUT.pt (weights), OUT.json (batch fingerprints, metrics, dataset reads).
"""

import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

import tandem
from tandem.callbacks import ModelCheckpoint

parser = argparse.ArgumentParser()
parser.add_argument("root")
parser.add_argument("out")
parser.add_argument("max_epochs", type=int)
parser.add_argument("--every-n-steps", type=int, default=None)
parser.add_argument("--die-at-step", type=int, default=None)
parser.add_argument("--resume", action="store_true")
parser.add_argument("--iterable", action="store_true")
args = parser.parse_args()

reads = [0]
g = torch.Generator().manual_seed(1)
X = torch.randn(100, 8, generator=g)
Y = ((X[:, 0] > 0).long() + (X[:, 1] > 0).long()) % 3


class Counting(Dataset):
    def __len__(self):
        return len(X)

    def __getitem__(self, i):
        reads[0] += 1
        return X[i], Y[i]


class Stream(IterableDataset):
    def __iter__(self):
        for i in range(len(X)):
            reads[0] += 1
            yield X[i], Y[i]


class Net(tandem.TrainingModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.3), nn.ReLU(), nn.Linear(32, 3))
        self.fingerprints = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.fingerprints.append([self.global_step, round(float(x.sum()), 5)])
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=0.01)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)}


class Die(tandem.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == args.die_at_step:
            os._exit(3)  # a crash: no clean-up, no final checkpoint


tandem.seed_everything(0)
model = Net()
callbacks = [ModelCheckpoint(save_last=True, save_top_k=0, every_n_train_steps=args.every_n_steps)]
if args.die_at_step:
    callbacks.append(Die())
data = DataLoader(Stream() if args.iterable else Counting(), batch_size=16, shuffle=not args.iterable)
trainer = tandem.Trainer(
    accelerator="cpu",
    max_epochs=args.max_epochs,
    default_root_dir=args.root,
    logger=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    callbacks=callbacks,
)
trainer.fit(model, data, ckpt_path="last" if args.resume else None)
torch.save(model.state_dict(), args.out + ".pt")
with open(args.out + ".json", "w") as f:
    json.dump(
        {
            "fingerprints": model.fingerprints,
            "reads": reads[0],
            "global_step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
        },
        f,
    )
