"""Memory per rank under DDP and FSDP: the bytes of parameters, gradients and optimizer state each rank holds.

The workload: an MLP of ``--layers`` blocks (Linear width -> width, ReLU), Adam, 2 processes (CPU over gloo, or
CUDA over nccl where available), ``Trainer(strategy="ddp")`` against
``Trainer(strategy=FSDPStrategy(auto_wrap_policy={nn.Linear}))``. Each strategy runs as a whole process (this
script with ``--worker ddp|fsdp``; the Trainer starts rank 1 by re-running it). A callback adds up, on every
rank, the storage of the tensors the rank holds — the local shard of a sharded tensor — at the two moments
the state is largest: before the optimizer step (gradients present) and after it (optimizer state present,
gradients not yet freed). Printed: the peak of parameters + gradients + optimizer state per rank, split in
the three, and FSDP's share of DDP's (about 1/2 on 2 ranks; a little more, since FSDP pads each tensor's
first dimension to a multiple of the number of ranks). On CUDA, ``torch.cuda.max_memory_allocated`` is
printed as well: it adds the activations and the parameters FSDP gathers for one layer at a time.

These are the training state's bytes, not the process's memory: the transient all-gathered parameters of
the layer being computed are not counted on the CPU.

    python benchmarks/fsdp_memory.py
    python benchmarks/fsdp_memory.py --layers 8 --width 1024
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

STRATEGIES = ("ddp", "fsdp")
WORLD_SIZE = 2


def _local_bytes(tensor) -> int:
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import tandem
    from tandem.strategies import FSDPStrategy

    class MLP(tandem.TrainingModule):
        def __init__(self) -> None:
            super().__init__()
            blocks = [m for _ in range(args.layers) for m in (nn.Linear(args.width, args.width), nn.ReLU())]
            self.net = nn.Sequential(*blocks, nn.Linear(args.width, 10))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    class Meter(tandem.Callback):
        def __init__(self) -> None:
            self.peak = {"parameters": 0, "gradients": 0, "optimizer": 0, "total": 0}

        def measure(self, trainer, module) -> None:
            params = list(module.parameters())
            now = {
                "parameters": sum(_local_bytes(p) for p in params),
                "gradients": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
                "optimizer": sum(
                    _local_bytes(v)
                    for state in trainer.optimizers[0].state.values()
                    for v in state.values()
                    if isinstance(v, torch.Tensor)
                ),
            }
            now["total"] = sum(now.values())
            if now["total"] > self.peak["total"]:
                self.peak = now

        def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
            self.measure(trainer, module)

        def on_before_zero_grad(self, trainer, module, optimizer) -> None:
            self.measure(trainer, module)

    torch.manual_seed(0)
    n = args.steps * args.batch_size * WORLD_SIZE
    data = TensorDataset(torch.randn(n, args.width), torch.randint(0, 10, (n,)))
    strategy = "ddp" if args.worker == "ddp" else FSDPStrategy(auto_wrap_policy={nn.Linear})
    meter = Meter()
    trainer = tandem.Trainer(
        strategy=strategy,
        devices=WORLD_SIZE,
        max_steps=args.steps,
        callbacks=[meter],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = MLP()
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    trainer.fit(model, DataLoader(data, batch_size=args.batch_size))
    result = {**meter.peak, "model_parameters": whole, "device": str(trainer.strategy.root_device)}
    if torch.cuda.is_available() and trainer.strategy.root_device.type == "cuda":
        result["cuda_max_allocated"] = torch.cuda.max_memory_allocated(trainer.strategy.root_device)
    Path(f"{args.out}.rank{trainer.global_rank}.json").write_text(json.dumps(result))


def mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--worker", choices=STRATEGIES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in STRATEGIES:
            out = os.path.join(folder, name)
            command = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--worker", name, "--out", out]
            env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
            if subprocess.run(command, env=env, check=False).returncode != 0:
                print(f"{name} failed", file=sys.stderr)
                return 1
            results[name] = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(WORLD_SIZE)]

    first = results["ddp"][0]
    print(
        f"\nMLP {args.layers} x Linear({args.width}, {args.width}) + head, Adam, {WORLD_SIZE} ranks on "
        f"{first['device'].split(':')[0]}; the whole model's parameters: {mib(first['model_parameters'])} MiB"
    )
    cuda = "cuda_max_allocated" in first
    header = "| strategy | rank | parameters MiB | gradients MiB | optimizer MiB | total MiB |"
    print("\n" + header + (" cuda max allocated MiB |" if cuda else ""))
    print("| --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if cuda else ""))
    for name, ranks in results.items():
        for rank, r in enumerate(ranks):
            row = f"| {name} | {rank} | {mib(r['parameters'])} | {mib(r['gradients'])} | {mib(r['optimizer'])} | "
            row += f"{mib(r['total'])} |" + (f" {mib(r['cuda_max_allocated'])} |" if cuda else "")
            print(row)
    ratio = max(r["total"] for r in results["fsdp"]) / max(r["total"] for r in results["ddp"])
    print(f"\nFSDP / DDP, peak total per rank: {ratio:.3f} (expected about {1 / WORLD_SIZE:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
