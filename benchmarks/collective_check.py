"""The cost of checked collectives (``DDPStrategy(collective_check_timeout=...)``) on 2 CPU processes.

Before each of tandem's own collectives the ranks agree, through the process group's store, that they
enter the same one (the side channel's collective check, ``tandem.strategies.side_channel``). This prices that agreement two ways, in
one 2-process ``ddp`` job (this script re-runs itself for rank 1), checks on and off alternating:

    per collective   500 ``strategy.all_gather_object`` calls: microseconds per call, and the difference
    per fit          a fit of 1000 steps (MLP 32 -> 256 -> 10, batch 32 per rank) that logs a synced loss
                     every step and reduces it every 50 steps, plus its epoch ends: seconds, and the ratio

    python benchmarks/collective_check.py            # 3 alternating pairs
    python benchmarks/collective_check.py --repeats 5
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem
from tandem.strategies import DDPStrategy

STEPS, BATCH = 1000, 32
CHECKED = datetime.timedelta(seconds=60)


class MLP(tandem.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class FitClock(tandem.Callback):
    def on_train_start(self, trainer, module):
        self.started = time.perf_counter()

    def on_train_end(self, trainer, module):
        self.seconds = time.perf_counter() - self.started


def fit(check: datetime.timedelta | None) -> tuple[float, DDPStrategy]:
    g = torch.Generator().manual_seed(0)
    n = STEPS * BATCH * 2
    data = TensorDataset(torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g))
    clock = FitClock()
    strategy = DDPStrategy(collective_check_timeout=check)
    trainer = tandem.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=2,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[clock],
    )
    torch.manual_seed(0)
    trainer.fit(MLP(), DataLoader(data, batch_size=BATCH))
    return clock.seconds, strategy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    fits: dict[bool, list[float]] = {True: [], False: []}
    calls: dict[bool, list[float]] = {True: [], False: []}
    strategy = None
    for i in range(args.repeats):
        for checked in (True, False) if i % 2 == 0 else (False, True):
            seconds, strategy = fit(CHECKED if checked else None)
            fits[checked].append(seconds)
    for i in range(args.repeats):
        for checked in (True, False) if i % 2 == 0 else (False, True):
            strategy.collective_check_timeout = CHECKED if checked else None  # None: the check is skipped
            strategy.barrier()
            started = time.perf_counter()
            for _ in range(500):
                strategy.all_gather_object(0)
            calls[checked].append((time.perf_counter() - started) / 500 * 1e6)
    if strategy.is_global_zero:
        on, off = statistics.median(calls[True]), statistics.median(calls[False])
        print(f"all_gather_object: {off:.0f} us unchecked, {on:.0f} us checked (+{on - off:.0f} us per collective)")
        on, off = statistics.median(fits[True]), statistics.median(fits[False])
        print(
            f"fit of {STEPS} steps, synced loss reduced every 50 steps: {off:.2f} s unchecked, {on:.2f} s checked "
            f"= {on / off:.3f}x ({(on - off) / STEPS * 1e6:+.1f} us per step)"
        )


if __name__ == "__main__":
    main()
