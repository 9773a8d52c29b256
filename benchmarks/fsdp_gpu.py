"""FSDP in bfloat16 on the GPUs: tandem's ``strategy="fsdp"`` against a hand-written FSDP2 loop.

The workload: a stack of ``--layers`` transformer-style MLP blocks (LayerNorm, Linear d -> 4d, GELU,
Linear 4d -> d, residual) on random ``(batch, tokens, d)`` inputs with an MSE loss, Adam, one process per
visible GPU over nccl. Both sides shard each block with ``fully_shard`` (bfloat16 parameters in compute,
float32 gradient reduction: ``MixedPrecisionPolicy``) and run the forward under bfloat16 autocast; the raw
side is torch's recipe (``mp.spawn``, ``init_process_group``, ``fully_shard``, a DistributedSampler),
tandem's is ``Trainer(strategy=FSDPStrategy(auto_wrap_policy={Block}), precision="bf16-mixed")``. Each runs
as a whole process (this script with ``--worker raw|tandem``); the runs alternate and repeat. Printed, per
pair and as medians: the time per optimizer step after ``--warmup`` steps (CUDA synchronised), the ratio
tandem/raw, rank 0's ``torch.cuda.max_memory_allocated`` and the final loss (which must agree closely).

    python benchmarks/fsdp_gpu.py                  # all visible GPUs
    python benchmarks/fsdp_gpu.py --layers 24 --dim 2048 --repeats 3
    python benchmarks/fsdp_gpu.py --dry-run        # a tiny model on 2 CPU processes: checks the code paths only

Without CUDA (and without --dry-run) it prints a note and exits 0. Target: tandem within 5% of raw.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 1.05
LR = 1e-4


def _block_class():
    from torch import nn

    class Block(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.up = nn.Linear(dim, 4 * dim)
            self.down = nn.Linear(4 * dim, dim)

        def forward(self, x):
            return x + self.down(nn.functional.gelu(self.up(self.norm(x))))

    return Block


def _model(args: argparse.Namespace):
    import torch
    from torch import nn

    torch.manual_seed(0)
    block = _block_class()
    return nn.Sequential(*[block(args.dim) for _ in range(args.layers)])


def _data(args: argparse.Namespace, world: int):
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(1)
    n = (args.warmup + args.steps) * args.batch_size * world
    return TensorDataset(
        torch.randn(n, args.tokens, args.dim, generator=g), torch.randn(n, args.tokens, args.dim, generator=g)
    )


def _device_type(args: argparse.Namespace) -> str:
    return "cpu" if args.dry_run else "cuda"


# ====================================================================== the hand-written FSDP2 loop
def _raw_rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.utils.data import DataLoader, DistributedSampler

    device_type = _device_type(args)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", rank=rank, world_size=world)
    mesh = init_device_mesh(device_type, (world,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = _model(args)
    for block in model:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    data = _data(args, world)
    sampler = DistributedSampler(data, shuffle=True, seed=0)  # a training loader, as tandem shuffles it
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    start = None
    for step, (x, y) in enumerate(loader):
        if step == args.warmup:
            _synchronize(device_type)
            start = time.perf_counter()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device_type, dtype=torch.bfloat16):
            loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    _synchronize(device_type)
    elapsed = time.perf_counter() - start
    if rank == 0:
        memory = torch.cuda.max_memory_allocated(device) if device_type == "cuda" else 0
        result = {"step_ms": 1000 * elapsed / args.steps, "loss": float(loss), "memory": memory}
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def run_raw(args: argparse.Namespace, out: str) -> None:
    import torch.multiprocessing as mp

    from tandem.strategies.environments.machine import find_free_port

    world = _world(args)
    mp.spawn(_raw_rank, args=(world, find_free_port(), args, out), nprocs=world)


# ====================================================================== tandem
def run_tandem(args: argparse.Namespace, out: str) -> None:
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    import tandem
    from tandem.strategies import FSDPStrategy

    device_type = _device_type(args)

    class Stack(tandem.TrainingModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _model(args)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.mse_loss(self.model(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=LR)

    class Clock(tandem.Callback):
        def __init__(self) -> None:
            self.start = 0.0
            self.elapsed = 0.0
            self.loss = 0.0

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if batch_idx == args.warmup:
                _synchronize(device_type)
                self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == args.warmup + args.steps - 1:
                _synchronize(device_type)
                self.elapsed = time.perf_counter() - self.start
                self.loss = float(outputs["loss"])

    clock = Clock()
    module = Stack()
    strategy = FSDPStrategy(auto_wrap_policy={type(module.model[0])})
    trainer = tandem.Trainer(
        accelerator=device_type,
        strategy=strategy,
        devices=_world(args),
        precision="bf16-mixed",
        max_steps=args.warmup + args.steps,
        callbacks=[clock],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(_data(args, _world(args)), batch_size=args.batch_size))
    if trainer.is_global_zero:
        device = trainer.strategy.root_device
        memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
        result = {"step_ms": 1000 * clock.elapsed / args.steps, "loss": clock.loss, "memory": memory}
        Path(out).write_text(json.dumps(result))


def _synchronize(device_type: str) -> None:
    if device_type == "cuda":
        import torch

        torch.cuda.synchronize()


def _world(args: argparse.Namespace) -> int:
    if args.dry_run:
        return 2
    import torch

    return torch.cuda.device_count()


# ====================================================================== driver
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8, help="per GPU")
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2, help="alternating pairs")
    parser.add_argument("--dry-run", action="store_true", help="tiny model, 2 CPU processes: code paths only")
    parser.add_argument("--worker", choices=("raw", "tandem"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dry_run:
        args.layers, args.dim, args.tokens, args.batch_size = 2, 16, 4, 2
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
    if args.worker:
        (run_raw if args.worker == "raw" else run_tandem)(args, args.out)
        return 0
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("fsdp_gpu.py: CUDA is not available; nothing to measure (use --dry-run to check the code paths).")
        return 0

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for pair in range(args.repeats):
            row = {}
            for worker in ("raw", "tandem") if pair % 2 == 0 else ("tandem", "raw"):
                out = os.path.join(folder, f"{worker}{pair}.json")
                command = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--worker", worker, "--out", out]
                env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
                if subprocess.run(command, env=env, check=False).returncode != 0 or not os.path.exists(out):
                    print(f"{worker} failed", file=sys.stderr)
                    return 1
                row[worker] = json.loads(Path(out).read_text())
            rows.append(row)

    device = "2 CPU processes (dry run)" if args.dry_run else f"{_world(args)} x {torch.cuda.get_device_name(0)}"
    print(f"\n{args.layers} blocks of d={args.dim}, {args.tokens} tokens x {args.batch_size} per rank, bf16, {device}")
    print("\n| pair | raw ms/step | tandem ms/step | ratio | raw max MiB | tandem max MiB | raw loss | tandem loss |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for i, row in enumerate(rows):
        raw, tan = row["raw"], row["tandem"]
        print(
            f"| {i} | {raw['step_ms']:.2f} | {tan['step_ms']:.2f} | {tan['step_ms'] / raw['step_ms']:.3f} | "
            f"{raw['memory'] / 2**20:.0f} | {tan['memory'] / 2**20:.0f} | {raw['loss']:.5f} | {tan['loss']:.5f} |"
        )
    ratio = statistics.median(r["tandem"]["step_ms"] / r["raw"]["step_ms"] for r in rows)
    print(f"\nmedian tandem/raw: {ratio:.3f} (target <= {TARGET})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
