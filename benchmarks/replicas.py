"""The cost of the DDP replica checks (``tandem.trainer.replicas``) on 2 CPU processes (gloo).

At each training epoch's end every rank checksums its parameters and buffers (one pass over each tensor) and
the ranks all-gather those numbers once; before each checkpoint save the same happens again. When no
DistributedSampler splits the training data, the first batch of each epoch is checksummed too and travels with
the epoch end's all-gather. This prices them in one 2-process ``ddp`` job (the script re-runs itself for rank 1),
for two models of about 1M parameters: ``wide`` (4 x Linear(512, 512) and a classifier: 10 tensors) and
``deep`` (50 linear layers of width 140 and a BatchNorm1d: 102 parameters and a compared buffer). Printed, medians over ``--repeats`` rounds
of ``--calls`` calls each:

    checksums     the local pass alone (every rank's share of the work)
    all_gather    the collective alone: ``strategy.all_gather`` of as many numbers (with tandem's collective check)
    epoch end     ``ReplicaCheck.check_epoch_end``: checksums, the all-gather, the comparison
    before save   ``check_replicas``: the same, without the batch slot
    first batch   the checksum of one batch of 64 x 512 float32 inputs and 64 labels
    one process   ``check_epoch_end`` under one process: nothing is computed

Each is shown as the median and the fastest of the rounds (on a shared machine the fastest is the steadier
figure). A fit's epoch pays "epoch end" once (plus "first batch" when no DistributedSampler splits its data),
and each checkpoint "before save" once. Target: about 1 ms or less per epoch for these models, on the CPU.

    python benchmarks/replicas.py
    python benchmarks/replicas.py --repeats 7 --calls 200
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem
from tandem.strategies import SingleDeviceStrategy
from tandem.trainer.replicas import (
    ReplicaCheck,
    batch_fingerprint,
    check_replicas,
    module_checksums,
    replicated_tensors,
)

FEATURES, BATCH, STEPS = 512, 32, 10


def wide() -> nn.Module:
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(512, 512), nn.ReLU())], nn.Linear(512, 10))


def deep() -> nn.Module:
    layers = [nn.Linear(512, 140), nn.BatchNorm1d(140)]
    layers += [m for _ in range(48) for m in (nn.Linear(140, 140), nn.ReLU())]
    return nn.Sequential(*layers, nn.Linear(140, 10))


class Model(tandem.TrainingModule):
    def __init__(self, build: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.net = build()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(epochs: int) -> tandem.Trainer:
    return tandem.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    n = STEPS * BATCH * 2
    return DataLoader(
        TensorDataset(torch.randn(n, FEATURES, generator=g), torch.randint(0, 10, (n,), generator=g)), batch_size=BATCH
    )


def per_call_ms(strategy, call: Callable[[], object], calls: int, repeats: int) -> tuple[float, float]:
    """Milliseconds per call: the median and the fastest of ``repeats`` rounds of ``calls`` calls."""
    rounds = []
    for _ in range(repeats):
        strategy.barrier()
        started = time.perf_counter()
        for _ in range(calls):
            call()
        rounds.append((time.perf_counter() - started) / calls * 1e3)
    return statistics.median(rounds), min(rounds)


def measure(
    build: Callable[[], nn.Module], calls: int, repeats: int
) -> tuple[int, int, dict[str, tuple[float, float]]]:
    """Fit ``build()`` for one epoch, then time each check: (tensors, numbers, timings by name)."""
    torch.manual_seed(0)
    fitted, model = trainer(1), Model(build)
    fitted.fit(model, loader())
    strategy, check = fitted.strategy, ReplicaCheck()
    tensors = [t for _, _, t in replicated_tensors(model)]
    single = SingleDeviceStrategy("cpu")
    single.setup(model)
    batch = (torch.randn(64, FEATURES), torch.randint(0, 10, (64,)))
    calls_by_name = {
        "checksums": lambda: module_checksums(tensors),
        "all_gather": lambda: strategy.all_gather(torch.zeros(len(tensors) + 3, dtype=torch.int64)),
        "epoch end": lambda: check.check_epoch_end(strategy, 0),
        "before save": lambda: check_replicas(strategy, "now"),
        "first batch": lambda: batch_fingerprint(batch),
        "one process": lambda: check.check_epoch_end(single, 0),
    }
    timings = {name: per_call_ms(strategy, call, calls, repeats) for name, call in calls_by_name.items()}
    return len(tensors), sum(t.numel() for t in tensors), timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    rows = [(name, *measure(build, args.calls, args.repeats)) for name, build in (("wide", wide), ("deep", deep))]
    if torch.distributed.get_rank() != 0:
        return
    print(f"2 processes (gloo), torch {torch.__version__}, {torch.get_num_threads()} thread(s) per process")
    for name, count, numbers, timings in rows:
        print(f"\n{name}: {numbers:,} numbers in {count} tensors        median    fastest")
        for what, (median, fastest) in timings.items():
            print(f"  {what:<12} {median:26.3f} ms {fastest:7.3f} ms")


if __name__ == "__main__":
    main()
