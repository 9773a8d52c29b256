"""DDP on the CPU: tandem's ``strategy="ddp"`` against a hand-written torch DDP script, 2 processes over gloo.

The workload: an MLP 32 -> 256 -> 10, batches of 32 per rank, 1000 optimizer steps per rank, SGD, one torch
thread per process, a DataLoader sharded by a DistributedSampler. tandem logs the loss with ``self.log``
every step (progress bar, checkpointing, logger and model summary off); the raw script is torch's recipe
(``mp.spawn``, ``init_process_group``, ``DistributedDataParallel``, ``DistributedSampler``).

Each run is a whole process (this script with ``--worker raw|tandem``), started here; the runs alternate
(raw, tandem, then tandem, raw, ...) and repeat. Printed, as medians:

    fit      the training loop on rank 0, first batch to last step (raw: the loop; tandem: on_train_start
             to on_train_end, so both exclude process start, imports and process-group set-up)
    process  the whole command, start to exit, measured here
    start-up process - fit: imports, starting rank 1, joining the process group, tearing down

Targets: fit <= 1.10x raw; tandem's start-up at most 1 s over raw's. Both runs start from the same weights
and data order, and print the final loss, which must agree.

    python benchmarks/ddp.py                 # 3 alternating pairs
    python benchmarks/ddp.py --repeats 5 --steps 2000
    python benchmarks/ddp.py --profile       # cProfile of tandem's rank 0: tandem, DDP and DataLoader frames
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIT_TARGET = 1.10
STARTUP_TARGET_S = 1.0
BATCH_SIZE = 32
WORLD_SIZE = 2
LR = 0.05


# ---------------------------------------------------------------------------- shared by both workers
def _dataset(steps: int):
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(1234)
    n = steps * BATCH_SIZE * WORLD_SIZE
    return TensorDataset(torch.randn(n, 32, generator=g), torch.randint(0, 10, (n,), generator=g))


def _mlp():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 10))


# ---------------------------------------------------------------------------- raw torch DDP (mp.spawn)
def _raw_rank(rank: int, port: int, steps: int, result: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    model = _mlp()
    ddp = DistributedDataParallel(model)
    data = _dataset(steps)
    # a training loader under DDP is shuffled by a DistributedSampler seeded 0, as Lightning and tandem do
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH_SIZE, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    sampler.set_epoch(0)
    start = time.perf_counter()
    for x, y in loader:
        loss = F.cross_entropy(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    fit = time.perf_counter() - start
    if rank == 0:
        Path(result).write_text(json.dumps({"fit": fit, "loss": loss.item()}))
    del ddp  # freed now, not while the interpreter shuts down (where gloo may abort the process)
    gc.collect()
    dist.destroy_process_group()


def _raw_worker(steps: int, result: str) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:  # a free port, as torch's examples pick one
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_raw_rank, args=(port, steps, result), nprocs=WORLD_SIZE)


# ---------------------------------------------------------------------------- tandem strategy="ddp"
def _tandem_worker(steps: int, result: str) -> None:
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    import tandem

    class MLP(tandem.TrainingModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

    class LoopTimer(tandem.Callback):
        def on_train_start(self, trainer, module):
            self.start = time.perf_counter()

        def on_train_end(self, trainer, module):
            self.fit = time.perf_counter() - self.start
            self.loss = float(trainer.callback_metrics["loss"])

    timer = LoopTimer()
    trainer = tandem.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=WORLD_SIZE,
        max_steps=steps,
        callbacks=[timer],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(MLP(), DataLoader(_dataset(steps), batch_size=BATCH_SIZE, shuffle=False))
    if trainer.is_global_zero:
        Path(result).write_text(json.dumps({"fit": timer.fit, "loss": timer.loss}))


def _profiled_tandem_worker(steps: int, result: str) -> None:
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.runcall(_tandem_worker, steps, result)
    if os.environ.get("RANK", "0") == "0":
        pstats.Stats(profile).sort_stats("cumulative").print_stats(r"tandem|parallel/distributed|dataloader", 25)


# ---------------------------------------------------------------------------- driver
def _run(worker: str, steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        result = os.path.join(folder, "result.json")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
            env.pop(name, None)
        command = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            worker,
            "--steps",
            str(steps),
            "--result",
            result,
        ]
        start = time.perf_counter()
        subprocess.run(command, check=True, env=env)
        process = time.perf_counter() - start
        measured = json.loads(Path(result).read_text())
    return {"fit": measured["fit"], "process": process, "loss": measured["loss"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--profile", action="store_true", help="profile tandem's rank 0 once instead")
    parser.add_argument("--worker", choices=["raw", "tandem", "tandem_profiled"], help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker = {"raw": _raw_worker, "tandem": _tandem_worker, "tandem_profiled": _profiled_tandem_worker}
        worker[args.worker](args.steps, args.result)
        return
    if args.profile:
        _run("tandem_profiled", args.steps)
        return

    runs: dict[str, list[dict[str, float]]] = {"raw": [], "tandem": []}
    for repeat in range(args.repeats):
        for worker in ("raw", "tandem") if repeat % 2 == 0 else ("tandem", "raw"):
            runs[worker].append(_run(worker, args.steps))
            run = runs[worker][-1]
            print(f"  run {repeat + 1} {worker:<7} fit {run['fit']:.3f} s, process {run['process']:.3f} s", flush=True)
    losses = {run["loss"] for worker in runs.values() for run in worker}
    median = {w: {k: statistics.median(r[k] for r in rs) for k in ("fit", "process")} for w, rs in runs.items()}
    for stats in median.values():
        stats["startup"] = stats["process"] - stats["fit"]

    print(
        f"DDP on the CPU: {WORLD_SIZE} processes (gloo), MLP 32-256-10, batch {BATCH_SIZE} per rank, "
        f"{args.steps} steps, 1 thread each; medians of {args.repeats} alternating runs"
    )
    print(f"{'':8} {'fit s':>8} {'process s':>10} {'start-up s':>11}")
    for worker, stats in median.items():
        print(f"{worker:8} {stats['fit']:8.3f} {stats['process']:10.3f} {stats['startup']:11.3f}")
    fit_ratio = median["tandem"]["fit"] / median["raw"]["fit"]
    process_ratio = median["tandem"]["process"] / median["raw"]["process"]
    startup_delta = median["tandem"]["startup"] - median["raw"]["startup"]
    print(f"fit ratio tandem/raw      {fit_ratio:.3f}  (target <= {FIT_TARGET})")
    print(f"process ratio tandem/raw  {process_ratio:.3f}")
    print(f"start-up delta            {startup_delta:+.3f} s  (target <= {STARTUP_TARGET_S:+.1f} s)")
    print(f"final loss agrees: {len(losses) == 1} ({sorted(losses)})")
    if fit_ratio > FIT_TARGET or startup_delta > STARTUP_TARGET_S:
        print("tandem missed a target")


if __name__ == "__main__":
    main()
