"""Two ranks exercise the side channel's collective check directly (no Trainer). Run with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set; rank r saves what it saw to ``<out>/rank<r>.pt``.

    agree      both ranks check the same tags 200 times: no error; the time per check
    different  rank 0 checks "barrier", rank 1 "broadcast": both raise, naming both sides
    blocked    rank 1 sits in dist.all_reduce while rank 0 checks: rank 0 raises after the stall timeout
    exited     rank 1's side channel reports that its script ended: rank 0's check raises at once
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tandem.strategies.side_channel.channel import SideChannel
from tandem.strategies.side_channel.group import new_secret
from tandem.strategies.side_channel.places import CallSite
from tandem.utilities.exceptions import CollectiveMismatchError


def guard(name: str) -> SideChannel:
    return SideChannel(dist.distributed_c10d._get_default_store(), rank, 2, run_id=name, secret=SECRET)


def attempt(g: SideChannel, tag: str, user: str = "", stall: float = 60.0) -> tuple[str | None, float]:
    started = time.perf_counter()
    try:
        g.collective_check.check(CallSite(tag, user), stall)
    except CollectiveMismatchError as err:
        return str(err), time.perf_counter() - started
    return None, time.perf_counter() - started


if __name__ == "__main__":
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    box = [new_secret()]
    dist.broadcast_object_list(box, 0)  # as the strategy shares it: over the group's backend, not the store
    SECRET = box[0]
    result: dict = {}

    g = guard("agree")
    dist.barrier()
    started = time.perf_counter()
    errors = [attempt(g, f"barrier@Trainer.step{i % 3}")[0] for i in range(200)]
    result["agree_errors"] = [e for e in errors if e]
    result["agree_us_per_check"] = (time.perf_counter() - started) / 200 * 1e6

    g = guard("different")
    tag = "barrier@Strategy.save_checkpoint" if rank == 0 else "broadcast@Trainer._setup"
    result["different"] = attempt(g, tag, f"train.py:{10 + rank} in main")

    g = guard("blocked")
    if rank == 0:
        result["blocked"] = attempt(g, "barrier@Strategy.save_checkpoint", "train.py:42 in main", stall=2.0)
        dist.all_reduce(torch.zeros(1))  # release rank 1
    else:
        dist.all_reduce(torch.zeros(1))  # waits here until rank 0 has given up on its check
    dist.barrier()

    g = guard("exited")
    if rank == 1:
        g.close("exited (its script ended)")
        dist.barrier()
    else:
        dist.barrier()
        result["exited"] = attempt(g, "broadcast@Trainer._setup", "train.py:50 in main")
    torch.save(result, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
