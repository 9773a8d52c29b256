"""What DDP that follows the module costs a step (issue 30), under 2-process DDP on the CPU (gloo).

Hand-written DDP loops, all in one 2-process job, each configuration run in blocks that alternate (so a slow spell of
the host hits all of them), µs a step: each configuration's median block, and the median (with quartiles) of its
difference from the same round's plain block:

    plain        DDP over an MLP, the torch loop
    checked      the same, plus tandem's check after each backward (``reducer._check_reducer_finalized()``):
                 what every default ``ddp`` step now pays when nothing changes
    find_unused  a target network outside the loss, DDP with ``find_unused_parameters=True`` (what a manual GAN is
                 switched to: a search of the autograd graph each step)
    left_out     the same target network left out of DDP with tandem's averaging hook (never called: no backward
                 reaches it), what an automatic-optimization step is switched to

Run: ``python benchmarks/ddp_follow.py [--blocks 12] [--steps 100]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

CONFIGS = ("plain", "checked", "find_unused", "left_out")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.online = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        self.target = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.online(x)


def _average(param: nn.Parameter) -> None:
    dist.all_reduce(param.grad)
    param.grad.div_(dist.get_world_size())


def build(config: str) -> tuple[nn.Module, DistributedDataParallel]:
    torch.manual_seed(0)
    net = Net()
    if config in ("plain", "checked"):
        net.target.requires_grad_(False)  # no unused parameter: the ordinary case
    if config == "left_out":
        names = [f"target.{n}" for n, _ in net.target.named_parameters()]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(net, names)
        for param in net.target.parameters():
            param.register_post_accumulate_grad_hook(_average)
    return net, DistributedDataParallel(net, find_unused_parameters=config == "find_unused")


def block(config: str, model: DistributedDataParallel, optimizer: torch.optim.Optimizer, steps: int) -> float:
    g = torch.Generator().manual_seed(dist.get_rank())
    batches = [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(steps)]
    dist.barrier()
    start = time.perf_counter()
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if config == "checked":
            model.reducer._check_reducer_finalized()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / steps * 1e6


def worker(rank: int, port: int, blocks: int, steps: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    built = {c: build(c) for c in CONFIGS}
    optimizers = {c: torch.optim.SGD(built[c][0].online.parameters(), lr=0.01) for c in CONFIGS}
    times: dict[str, list[float]] = {c: [] for c in CONFIGS}
    for c in CONFIGS:  # warm-up
        block(c, built[c][1], optimizers[c], 10)
    for b in range(blocks):
        order = CONFIGS[b % len(CONFIGS) :] + CONFIGS[: b % len(CONFIGS)]
        for c in order:
            times[c].append(block(c, built[c][1], optimizers[c], steps))
    if rank == 0:
        print(f"2-process DDP (gloo), {steps} steps x {blocks} rounds; µs a step")
        print(f"  {'config':<12} {'median':>8}  paired difference from plain: median (quartiles)")
        for c in CONFIGS:
            paired = sorted(t - p for t, p in zip(times[c], times["plain"]))
            q1, mid, q3 = statistics.quantiles(paired, n=4) if len(paired) > 1 else (paired[0],) * 3
            print(f"  {c:<12} {statistics.median(times[c]):8.1f}  {mid:+8.1f} ({q1:+.1f} / {q3:+.1f})")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, args.blocks, args.steps), nprocs=2, join=True)


if __name__ == "__main__":
    main()
