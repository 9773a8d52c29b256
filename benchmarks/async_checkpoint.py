"""How long a checkpoint save blocks training: synchronous saves against ``plugins=[AsyncCheckpointIO()]``.

A model of about 100M float32 parameters (``--layers`` × Linear(3200, 3200), Adam: a checkpoint of about
1.2 GB with the optimizer state) trains on the CPU for ``--steps`` steps, and ModelCheckpoint saves every
``--every`` steps (every file kept). Each run is a fresh process (``--worker sync|async``); runs alternate,
pair by pair, and the medians are compared. Per run:

- blocked: seconds per save that ``trainer.save_checkpoint`` held the step (synchronous: checksum, write,
  fsync, rename; asynchronous: waiting for the previous write, then the copy to host memory);
- tail: seconds from the end of training to ``fit`` returning (asynchronous: the wait for the last write);
- fit: the whole ``fit`` (the background write shares the CPU with the training).

Target: a save blocks the step for at most half as long as a synchronous save (``--check`` exits 1 if not).

    python benchmarks/async_checkpoint.py                       # 3 pairs, 12 steps, a save every 4
    python benchmarks/async_checkpoint.py --pairs 1 --steps 6 --every 3 --dir /mnt/shared
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

WIDTH = 3200
TARGET = 0.5


def _worker(kind: str, args: argparse.Namespace) -> dict:
    import tandem
    from tandem.callbacks import ModelCheckpoint
    from tandem.strategies import AsyncCheckpointIO

    class Model(tandem.TrainingModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(args.layers)])

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return self.net(x).square().mean()

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-5)

    class Clock(tandem.Callback):
        def on_train_end(self, trainer, module):
            self.train_end = time.perf_counter()

    torch.manual_seed(0)
    model = Model()
    data = DataLoader(TensorDataset(torch.randn(args.steps * 8, WIDTH)), batch_size=8)
    clock = Clock()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        trainer = tandem.Trainer(
            accelerator="cpu",
            max_steps=args.steps,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[ModelCheckpoint(folder, every_n_train_steps=args.every, save_top_k=-1), clock],
            plugins=[AsyncCheckpointIO()] if kind == "async" else None,
        )
        blocked: list[float] = []
        save = trainer.save_checkpoint

        def timed_save(*a, **k):
            start = time.perf_counter()
            result = save(*a, **k)
            blocked.append(time.perf_counter() - start)
            return result

        trainer.save_checkpoint = timed_save
        start = time.perf_counter()
        trainer.fit(model, data)
        end = time.perf_counter()
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "blocked": blocked, "tail": end - clock.train_end, "fit": end - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--layers", type=int, default=10, help="Linear(3200, 3200) layers: 10 is 102M parameters")
    parser.add_argument("--dir", default=None, help="folder to write in (default: the system's temporary folder)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the target is missed")
    parser.add_argument("--worker", choices=["sync", "async"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args)))
        return
    passed = [a for a in sys.argv[1:] if a != "--check"]
    runs: dict[str, list[dict]] = {"sync": [], "async": []}
    for pair in range(args.pairs):
        order = ("sync", "async") if pair % 2 == 0 else ("async", "sync")  # alternate which goes first
        for kind in order:
            out = subprocess.run(
                [sys.executable, __file__, *passed, "--worker", kind], capture_output=True, text=True, check=True
            )
            runs[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    params = runs["sync"][0]["params"]
    print(
        f"{params / 1e6:.0f}M parameters (Adam), {args.steps} steps, a save every {args.every}; "
        f"torch {torch.__version__}; {args.pairs} pair(s), fresh processes, alternating"
    )
    print(f"{'run':>6} {'blocked s/save':>15} {'tail s':>8} {'fit s':>8}")
    medians = {}
    for kind in ("sync", "async"):
        for i, run in enumerate(runs[kind]):
            print(f"{kind}{i:>2} {statistics.median(run['blocked']):>15.3f} {run['tail']:>8.3f} {run['fit']:>8.2f}")
        medians[kind] = [
            statistics.median(statistics.median(r["blocked"]) for r in runs[kind]),
            statistics.median(r["tail"] for r in runs[kind]),
            statistics.median(r["fit"] for r in runs[kind]),
        ]
    for kind, (blocked, tail, fit) in medians.items():
        print(f"median {kind:<5} blocked {blocked:.3f} s/save, tail {tail:.3f} s, fit {fit:.2f} s")
    ratio = medians["async"][0] / medians["sync"][0]
    print(f"async / sync blocked per save: {ratio:.2f} (target <= {TARGET})")
    if args.check and ratio > TARGET:
        sys.exit(1)


if __name__ == "__main__":
    main()
