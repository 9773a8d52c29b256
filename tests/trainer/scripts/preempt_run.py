"""Pre-emption runs for tests/trainer/test_preemption.py; the test starts them in fresh processes.

usage: preempt_run.py MODE FOLDER DEVICES
  stop     fit; the signals named by PREEMPT_AT ("epoch:batch:rank:SIGNAL[,...]", one entry per fit) are sent by
           each named rank to itself during that batch's training_step. With two entries the first fit's
           Preempted is caught and the second fit resumes from "last" (and is pre-empted again, uncaught).
  resume   fit(ckpt_path="last") to the end, then an uninterrupted fit in FOLDER/ref; rank 0 writes whether the
           weights are equal to FOLDER/result.json.
  workers  fit with num_workers=2 whose workers write their pids to FOLDER; training_step then sleeps.
Each fit's callback writes FOLDER/record-<fit>-<rank>.json at teardown (on_exception, where it stopped).
"""

import json
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem
from tandem.utilities.exceptions import Preempted

MODE, FOLDER, DEVICES = sys.argv[1], sys.argv[2], int(sys.argv[3])
g = torch.Generator().manual_seed(1)
X = torch.randn(64, 8, generator=g)
Y = ((X[:, 0] > 0).long() + (X[:, 1] > 0).long()) % 3


class Net(tandem.TrainingModule):
    def __init__(self, signal_at=None):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.ReLU(), nn.Linear(16, 3))
        self.signal_at = signal_at

    def training_step(self, batch, batch_idx):
        if MODE == "workers":
            time.sleep(60)
        at = self.signal_at
        if at is not None and (self.current_epoch, batch_idx, self.global_rank) == at[:3]:
            with open(os.path.join(FOLDER, f"signal-{self.global_rank}.txt"), "w") as fh:
                fh.write(repr(time.time()))
            os.kill(os.getpid(), at[3])
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class Record(tandem.Callback):
    def __init__(self, name):
        self.name, self.exception = name, None

    def on_exception(self, trainer, module, exception):
        self.exception = type(exception).__name__

    def teardown(self, trainer, module, stage):
        loop = trainer.fit_loop.state
        record = {"exception": self.exception, "epoch": loop.epoch, "batches_done": loop.batches_done}
        record.update(global_step=trainer.global_step, pid=os.getpid())
        with open(os.path.join(FOLDER, f"record-{self.name}-{trainer.global_rank}.json"), "w") as fh:
            json.dump(record, fh)


def record_worker(worker_id):
    with open(os.path.join(FOLDER, f"worker-{worker_id}.pid"), "w") as fh:
        fh.write(str(os.getpid()))


def fit(name, root, signal_at=None, ckpt_path=None):
    tandem.seed_everything(7)
    model = Net(signal_at)
    workers = {"num_workers": 2, "worker_init_fn": record_worker} if MODE == "workers" else {}
    loader = DataLoader(TensorDataset(X, Y), batch_size=4, shuffle=True, **workers)
    trainer = tandem.Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=DEVICES,
        strategy="ddp" if DEVICES > 1 else "auto",
        accumulate_grad_batches=2,
        default_root_dir=root,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Record(name)],
    )
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    return trainer, model


def plan():
    entries = []
    for entry in os.environ.get("PREEMPT_AT", "").split(","):
        if entry:
            epoch, batch, rank, name = entry.split(":")
            entries.append((int(epoch), int(batch), int(rank), getattr(signal, name)))
    return entries


if __name__ == "__main__":
    run = os.path.join(FOLDER, "run")
    if MODE == "stop":
        entries = plan()
        if len(entries) > 1:
            try:
                fit("first", run, entries[0])
            except Preempted:
                pass  # caught on every rank: the second fit resumes in the same processes
        fit("stop", run, entries[-1], ckpt_path="last" if len(entries) > 1 else None)
    elif MODE == "resume":
        trainer, resumed = fit("resume", run, ckpt_path="last")
        _, reference = fit("reference", os.path.join(FOLDER, "ref"))
        if trainer.is_global_zero:
            a, b = resumed.state_dict(), reference.state_dict()
            equal = all(torch.equal(a[k], b[k]) for k in a)
            with open(os.path.join(FOLDER, "result.json"), "w") as fh:
                json.dump({"equal": equal, "global_step": trainer.global_step}, fh)
    else:
        fit("workers", run)
