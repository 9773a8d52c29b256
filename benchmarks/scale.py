"""What tandem's coordination costs as the world grows: counts per rank at 1, 2, 4, 8 and 16 CPU processes (gloo).

tandem's ranks agree through the process group's ``TCPStore`` (the side channel: the collective check before each
of tandem's own collectives, the watcher's beats once a second, the pre-emption vote) and through a few collectives
of their own (the reduction of logged values, the epoch end's stop / NaN reduction, the replica check). A
store on rank 0 answers every rank, so what is free at 2 ranks can be the bottleneck at 1024. This counts, per rank,
what each of those costs, in one ``ddp`` fit of a tiny MLP (16 -> 32 -> 4, batch 8 per rank, ``--epochs`` epochs of
``--steps`` steps, the loss logged with ``sync_dist=True`` and published every ``--log-every`` steps), then one
``trainer.save_checkpoint``:

    store      requests and bytes (keys, values and answers) through the store, by the main thread, per plain
               step, per publishing step, per epoch end and per save; and by the watcher thread, per second
    coll       collectives tandem issues beyond DDP's gradient all-reduce (``torch.distributed`` calls: the
               reducer's bucket all-reduce is not one) and their payload bytes, sent and received by one rank
    ms         rank 0's seconds in that coordination (the collective check, those collectives, the replica
               checksums), per step and per epoch end; on 2 cores shared by up to 16 processes that is mostly
               waiting for the others, so read the counts, not the times

The same world size runs a hand-written DDP loop (``DistributedDataParallel``, ``DistributedSampler``, the same model
and data) for the loop time a step, rank 0, against tandem's. Every process is one thread; at 8 and 16 processes the 2
cores are oversubscribed, which makes wall times a poor guide and the counts the result. Each run is fresh processes
(this script with ``--worker tandem|raw``); ``--capacity`` measures what one ``TCPStore`` answers on this machine (a
server and N client processes, each setting a 200-byte beat and checking a key in a loop), for the projection in
benchmarks/README.md.

The harness asserts what the design promises: the store requests, store bytes and collective bytes per rank per
step, publishing step, epoch end and save are flat in the world size (from 4 processes up, within ``FLAT_SLACK``);
it exits 1 if not, or if any of those phases gathers (an ``all_gather`` or ``all_gather_object``, whose result grows
with N: the logged values are reduced as packed sums when every rank logs the same names, and the replica check is a
max all-reduce). ``tests/strategies/test_world_size.py`` asserts the same at 4 and 8 ranks with :func:`counted_fit`.
``make bench`` runs the whole script (``run_all.py`` runs every script here).

    python benchmarks/scale.py                 # worlds 1 2 4 8 16, then the store's capacity (about 6 minutes)
    python benchmarks/scale.py --quick         # worlds 1 2 4, tandem's counts only, capacity at 1 and 4 clients
    python benchmarks/scale.py --worlds 4 8 --json out.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pickle
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

WORLDS, QUICK_WORLDS = (1, 2, 4, 8, 16), (1, 2, 4)
CAPACITY_CLIENTS, QUICK_CAPACITY_CLIENTS = (1, 4, 16, 64), (1, 4)
EPOCHS, STEPS, LOG_EVERY, BATCH = 2, 24, 8, 8
WATCH_S = 4.0  # seconds the watcher's beats are counted, after the fit (the main thread waits in a barrier)
QUICK_WATCH_S, QUICK_CAPACITY_S = 2.0, 1.0  # --quick: shorter, and no hand-written loop (the counts only)
#: how much a count per rank may grow from the smallest world of 4 or more to the largest before it is "not flat"
#: (the collective check's polls depend on how long a rank waits for the others, which grows with oversubscription)
FLAT_SLACK = 1.5
#: the counts that must stay flat (per rank, per step or per epoch end)
FLAT = ("store_requests", "store_bytes", "coll_bytes")
#: collectives whose result grows with the world: none may run in a phase while the ranks agree
GATHERS = ("all_gather", "all_gather_object")
PHASES = ("step", "publish", "epoch_end", "save")
_WATCHER = "tandem-side-channel"


# ---------------------------------------------------------------------------- counting, inside each rank
class Tally:
    """Counts by phase ("setup", "step", "publish", "epoch_end", "save", "teardown"), the watcher thread's apart."""

    def __init__(self) -> None:
        self.phase = "setup"
        self.opened = 0.0  # when the side channel opened (its watcher started)
        self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def add(self, kind: str, amount: float = 1) -> None:
        watcher = threading.current_thread().name == _WATCHER
        self.counts["watcher" if watcher else self.phase][kind] += amount


TALLY = Tally()


def _size(value: Any) -> int:
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value)
    if isinstance(value, int):
        return 8
    return 0


class CountingStore:
    """A ``torch.distributed`` store that counts each request, and the bytes of its keys, values and answer."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def clone(self) -> CountingStore:
        return CountingStore(self._store.clone())

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)
        if not callable(method):
            return method

        def counted(*args: Any) -> Any:
            result = method(*args)
            TALLY.add("store_requests")
            TALLY.add("store_bytes", _size(args) + _size(result))
            if name == "set" and "/beat/" in str(args[0]):
                TALLY.add("beats")
            return result

        return counted


def _tensor_bytes(value: Any) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _counted_collective(name: str, original: Any) -> Any:
    def collective(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = original(*args, **kwargs)
        TALLY.add("coll_seconds", time.perf_counter() - started)
        TALLY.add("collectives")
        TALLY.add("gathers", name in GATHERS)
        if name == "all_gather_object":  # (output list, object): every rank's object comes back
            TALLY.add("coll_bytes", len(pickle.dumps(args[1])) + sum(len(pickle.dumps(o)) for o in args[0]))
        elif name == "broadcast_object_list":
            TALLY.add("coll_bytes", len(pickle.dumps(args[0])))
        elif name == "all_gather":  # (output list, input)
            TALLY.add("coll_bytes", _tensor_bytes(args[1]) + _tensor_bytes(args[0]))
        else:  # all_reduce, broadcast: the tensor goes out and comes back
            TALLY.add("coll_bytes", 2 * _tensor_bytes(args[0]) if args else 0)
        return result

    return collective


def _timed(owner: Any, name: str, kind: str) -> None:
    original = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            TALLY.add(kind, time.perf_counter() - started)

    setattr(owner, name, timed)


def install_counters() -> None:
    """Count what tandem's coordination does in this process: its store (wrapped as the side channel opens),
    ``torch.distributed``'s collectives as tandem calls them, and the time in the check and the checksums."""
    import torch.distributed as dist

    from tandem.strategies import parallel
    from tandem.strategies.side_channel import collective_check
    from tandem.trainer import replicas

    opened = parallel.open_channel

    def open_channel(store: Any, *args: Any) -> Any:
        TALLY.opened = time.perf_counter()
        return opened(CountingStore(store), *args)

    parallel.open_channel = open_channel
    for name in ("all_reduce", "all_gather", "all_gather_object", "broadcast", "broadcast_object_list", "barrier"):
        setattr(dist, name, _counted_collective(name, getattr(dist, name)))
    _timed(collective_check.CollectiveCheck, "check", "check_seconds")
    _timed(replicas, "module_checksums", "checksum_seconds")
    _timed(replicas, "batch_fingerprint", "checksum_seconds")


# ---------------------------------------------------------------------------- the workload, shared by both sides
def _dataset(world: int, steps: int):
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(1234)
    n = steps * BATCH * world
    return TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g))


def _mlp():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _tandem_worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    install_counters()
    out = counted_fit(args.world, args.epochs, args.steps, args.log_every, args.result, args.watch)
    Path(args.result, f"tandem{out['rank']}.json").write_text(json.dumps(out))


def counted_fit(world: int, epochs: int, steps: int, log_every: int, folder: str, watch: float = 0.0) -> dict:
    """This rank's counts of one ``ddp`` fit of the MLP at ``world`` processes and a save (every rank calls this;
    :func:`install_counters` first, before the process group's first fit, so that its store is counted); ``watch``:
    seconds the watcher's requests are counted afterwards (0: not). ``tests/strategies/scripts/world_runs.py`` runs
    it too."""
    import torch
    import torch.nn.functional as F

    import tandem

    for phase in PHASES:  # anything counted before (another fit in the same process) is not this fit's
        TALLY.counts.pop(phase, None)

    class MLP(tandem.TrainingModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.log("loss", loss, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    class Phases(tandem.Callback):
        """Moves the tally's phase: a batch is "publish" when it publishes its logged values, else "step"."""

        def on_train_start(self, trainer, module):
            self.started = time.perf_counter()

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            TALLY.phase = "publish" if trainer.is_log_step else "step"
            TALLY.counts[TALLY.phase]["batches"] += 1

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            # the loader's next batch belongs to the steps; after the epoch's last batch: the epoch's values, its
            # stop / NaN reduction and the replica check, until the next epoch's first batch
            last = batch_idx + 1 == trainer.num_training_batches
            TALLY.phase = "epoch_end" if last else "step"
            TALLY.counts["epoch_end"]["batches"] += last

        def on_train_end(self, trainer, module):
            TALLY.phase = "teardown"
            self.seconds = time.perf_counter() - self.started

    phases = Phases()
    trainer = tandem.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=world,
        max_epochs=epochs,
        log_every_n_steps=log_every,
        callbacks=[phases],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=folder,
    )
    data = _dataset(world, steps)
    trainer.fit(MLP(), torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True))
    TALLY.phase = "save"
    TALLY.counts["save"]["batches"] += 1
    trainer.save_checkpoint(os.path.join(folder, "scale.ckpt"))
    TALLY.phase = "teardown"
    if watch > 0:  # the watcher alone, while the main thread waits in a barrier (a fit is too short for its rate)
        trainer.strategy.barrier()
        before, started = dict(TALLY.counts["watcher"]), time.perf_counter()
        time.sleep(watch)
        trainer.strategy.barrier()
        seconds = time.perf_counter() - started
        watcher = {k: (v - before.get(k, 0)) / seconds for k, v in TALLY.counts["watcher"].items()}
    else:
        watcher = {}
    return {
        "rank": trainer.global_rank,
        "fit_seconds": phases.seconds,
        "steps": trainer.global_step,
        "counts": {phase: dict(c) for phase, c in TALLY.counts.items() if phase != "watcher"},
        "watcher_per_s": watcher,
    }


def _raw_worker(args: argparse.Namespace) -> None:
    """One rank of the hand-written DDP loop (started by the driver with RANK, WORLD_SIZE, MASTER_* set)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = _mlp()
    ddp = DistributedDataParallel(model)
    data = _dataset(args.world, args.steps)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    started = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(ddp(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    seconds = time.perf_counter() - started
    rank = dist.get_rank()
    Path(args.result, f"raw{rank}.json").write_text(json.dumps({"rank": rank, "fit_seconds": seconds}))
    del ddp
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------- the driver
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _clean_env() -> dict[str, str]:
    launch = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
    env = {k: v for k, v in os.environ.items() if k not in launch and not k.startswith(("TANDEM_", "TORCHELASTIC_"))}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _command(worker: str, world: int, args: argparse.Namespace, result: str) -> list[str]:
    return [
        sys.executable,
        os.path.abspath(__file__),
        *("--worker", worker, "--world", str(world), "--result", result),
        *("--epochs", str(args.epochs), "--steps", str(args.steps), "--log-every", str(args.log_every)),
        *("--watch", str(args.watch)),
    ]


def run_world(world: int, args: argparse.Namespace, raw: bool = True) -> dict[str, Any]:
    """One tandem fit and, with ``raw``, one run of the hand-written loop at ``world`` processes: every rank's counts
    and the loop times."""
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(_command("tandem", world, args, folder), check=True, env=_clean_env(), timeout=600)
        tandem = [json.loads(Path(folder, f"tandem{r}.json").read_text()) for r in range(world)]
        if not raw:
            return summarize(world, tandem, None)
        port = str(_free_port())
        ranks = [
            subprocess.Popen(
                _command("raw", world, args, folder),
                env={**_clean_env(), "RANK": str(r), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1"}
                | {"MASTER_PORT": port},
            )
            for r in range(world)
        ]
        if any(p.wait(timeout=600) for p in ranks):
            raise RuntimeError(f"the raw DDP loop failed at world size {world}")
        raw = [json.loads(Path(folder, f"raw{r}.json").read_text()) for r in range(world)]
    return summarize(world, tandem, raw)


def summarize(world: int, tandem: list[dict], raw: list[dict] | None) -> dict[str, Any]:
    """Per phase: the mean over ranks of each count per occurrence (per step, per epoch end, per save), and the
    largest rank's; rank 0's seconds; the watcher's rate per rank; the loop times a step."""
    out: dict[str, Any] = {"world": world, "phases": {}}
    for phase in PHASES:
        per_rank = []
        for result in tandem:
            counts = result["counts"].get(phase, {})
            occurrences = max(1, counts.get("batches", 0))
            per_rank.append({k: v / occurrences for k, v in counts.items() if k != "batches"})
        kinds = sorted({k for r in per_rank for k in r})
        out["phases"][phase] = {
            "mean": {k: statistics.fmean(r.get(k, 0) for r in per_rank) for k in kinds},
            "max": {k: max(r.get(k, 0) for r in per_rank) for k in kinds},
            "rank0": per_rank[0],
        }
    watcher = [r["watcher_per_s"] for r in tandem]
    out["watcher"] = {
        "beats_per_s": statistics.fmean(w.get("beats", 0) for w in watcher),
        "requests_per_s": statistics.fmean(w.get("store_requests", 0) for w in watcher),
        "bytes_per_s": statistics.fmean(w.get("store_bytes", 0) for w in watcher),
        "rank0_bytes_per_s": watcher[0].get("store_bytes", 0),
        "max_requests_per_s": max(w.get("store_requests", 0) for w in watcher),
    }
    steps = tandem[0]["steps"]
    raw_ms = 1e3 * raw[0]["fit_seconds"] / steps if raw else float("nan")
    out["ms_per_step"] = {"tandem": 1e3 * tandem[0]["fit_seconds"] / steps, "raw": raw_ms}
    return out


# ---------------------------------------------------------------------------- one store's capacity
def _store_client(port: int, rank: int, seconds: float) -> None:
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    store.add("ready", 1)
    store.wait(["go"])
    beat, key, done = b"x" * 200, f"beat/{rank}", 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        store.set(key, beat)
        store.check(["signal"])
        done += 2
    store.add("done", done)


def store_capacity(clients: int, seconds: float = 2.0) -> float:
    """Requests a second one ``TCPStore`` answers to ``clients`` processes setting a beat and checking a key."""
    import datetime
    import multiprocessing

    import torch.distributed as dist

    port = _free_port()
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=_store_client, args=(port, r, seconds)) for r in range(clients)]
    for p in procs:
        p.start()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    server.set_timeout(datetime.timedelta(seconds=120))
    while int(server.add("ready", 0)) < clients:
        time.sleep(0.01)
    started = time.perf_counter()
    server.set("go", "1")
    for p in procs:
        p.join(timeout=120)
    elapsed = time.perf_counter() - started
    return int(server.add("done", 0)) / max(elapsed, seconds)


# ---------------------------------------------------------------------------- the report
def _per_rank(world_result: dict, phase: str, kind: str, which: str = "mean") -> float:
    return world_result["phases"][phase][which].get(kind, 0.0)


def print_table(results: list[dict]) -> None:
    print(
        f"scale: tandem ddp, MLP 16-32-4, batch {BATCH} per rank, {EPOCHS} epochs; per rank (mean over ranks; "
        "max: the busiest rank); coll = tandem's collectives beyond DDP's gradient all-reduce"
    )
    head = f"{'N':>3} {'phase':>9} {'store req':>9} {'max':>5} {'store B':>8} {'max':>7} {'coll':>5} {'coll B':>8}"
    print(head + f" {'max':>8} {'rank0 ms':>8}")
    for r in results:
        for phase in PHASES:

            def g(kind: str, which: str = "mean", r: dict = r, phase: str = phase) -> float:
                return _per_rank(r, phase, kind, which)

            ms = 1e3 * sum(r["phases"][phase]["rank0"].get(k, 0) for k in ("check_seconds", "coll_seconds"))
            ms += 1e3 * r["phases"][phase]["rank0"].get("checksum_seconds", 0)
            print(
                f"{r['world']:>3} {phase:>9} {g('store_requests'):9.1f} {g('store_requests', 'max'):5.0f} "
                f"{g('store_bytes'):8.0f} {g('store_bytes', 'max'):7.0f} {g('collectives'):5.1f} "
                f"{g('coll_bytes'):8.0f} {g('coll_bytes', 'max'):8.0f} {ms:8.2f}"
            )
    print(
        "\nwatcher (over --watch seconds after the fit), per rank: beats/s, store requests/s, bytes/s; rank 0's bytes/s"
    )
    print("loop time a step, rank 0: tandem and the hand-written DDP loop (oversubscribed from 4 processes)")
    print(f"{'N':>3} {'beats/s':>8} {'req/s':>6} {'max':>5} {'B/s':>7} {'rank0 B/s':>9} {'tandem ms':>9} {'raw ms':>7}")
    for r in results:
        w, t = r["watcher"], r["ms_per_step"]
        print(
            f"{r['world']:>3} {w['beats_per_s']:8.2f} {w['requests_per_s']:6.2f} {w['max_requests_per_s']:5.2f} "
            f"{w['bytes_per_s']:7.0f} {w['rank0_bytes_per_s']:9.0f} {t['tandem']:9.2f} {t['raw']:7.2f}"
        )


def not_flat(results: list[dict]) -> list[str]:
    """The per-rank counts that grow from the smallest world of 4 or more to the largest (beyond FLAT_SLACK), of
    those that must stay flat, and every gather (``GATHERS``) a phase ran at any world size."""
    problems = [
        f"{phase}: {_per_rank(r, phase, 'gathers', 'max'):.0f} gathers a rank at {r['world']}"
        for r in results
        for phase in PHASES
        if _per_rank(r, phase, "gathers", "max") > 0
    ]
    big = [r for r in results if r["world"] >= 4]
    if len(big) < 2:
        return problems
    small, large = big[0], big[-1]
    for phase in PHASES:
        for kind in FLAT:
            for which in ("mean", "max"):
                a, b = _per_rank(small, phase, kind, which), _per_rank(large, phase, kind, which)
                if b > FLAT_SLACK * a + 2:  # + 2: a request or two of jitter on tiny counts
                    problems.append(
                        f"{phase} {kind} ({which} per rank): {a:.1f} at {small['world']} -> {b:.1f} at {large['world']}"
                    )
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="worlds 1 2 4, no hand-written loop, shorter watcher and capacity runs"
    )
    parser.add_argument("--worlds", type=int, nargs="+", help="world sizes (default 1 2 4 8 16)")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--steps", type=int, default=STEPS, help="steps per epoch per rank")
    parser.add_argument("--log-every", type=int, default=LOG_EVERY)
    parser.add_argument(
        "--watch", type=float, help=f"seconds the watcher's rate is measured over (default {WATCH_S:g})"
    )
    parser.add_argument("--capacity", type=int, nargs="*", help="store clients to measure (none: skip)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--no-raw", action="store_true", help="tandem's counts only (no hand-written loop)")
    parser.add_argument("--worker", choices=["tandem", "raw"], help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "tandem":
        return _tandem_worker(args)
    if args.worker == "raw":
        return _raw_worker(args)
    worlds = args.worlds or (QUICK_WORLDS if args.quick else WORLDS)
    if args.watch is None:
        args.watch = QUICK_WATCH_S if args.quick else WATCH_S
    results = []
    for world in worlds:
        started = time.perf_counter()
        results.append(run_world(world, args, raw=not (args.no_raw or args.quick)))
        print(f"  world {world}: {time.perf_counter() - started:.1f} s", flush=True)
    print_table(results)
    clients = (
        args.capacity if args.capacity is not None else (QUICK_CAPACITY_CLIENTS if args.quick else CAPACITY_CLIENTS)
    )
    capacity = {n: store_capacity(n, QUICK_CAPACITY_S if args.quick else 2.0) for n in clients}
    if capacity:
        print(
            "one TCPStore's capacity on this machine (clients: requests/s): "
            + ", ".join(f"{n}: {rate:,.0f}" for n, rate in capacity.items())
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"worlds": results, "capacity": capacity}, indent=1))
    problems = not_flat(results)
    for problem in problems:
        print(f"NOT FLAT: {problem}")
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
