"""Cost of ``self.log`` with the TensorBoard logger against a hand-written loop that logs the same values.

The workload is overhead.py's tiny MLP (one thread) with N metrics logged per step (N = 1, 16, 64, 256 by
default). The raw loop keeps the N values as detached tensors and, every ``log_every_n_steps`` (50) steps,
stacks them, converts them once and writes them with a ``SummaryWriter``. tandem calls
``self.log(name, value)`` N times per step with ``TensorBoardLogger``, ``log_every_n_steps=50`` and the
progress bar off (one extra row with the progress bar on).

``--ddp``: the same under 2-process DDP over gloo (ddp.py's MLP 32-256-10 and data, batches of 32 per rank,
one thread per process), every value logged with ``sync_dist=True``; the raw script (``mp.spawn``,
``DistributedDataParallel``) all-reduces the stacked values once per publishing step and rank 0 writes them.
Both time rank 0's training loop only (raw: first batch to last step; tandem: ``on_train_start`` to
``on_train_end``), not process start-up.

Each measurement is a fresh process (``--worker raw|tandem``); pairs alternate who goes first; the median
of the per-pair ratios and their spread (min-max) are reported. Same data, same weights, same batch order:
the final losses (rank 0's own under ``--ddp``) must agree.

    python benchmarks/logging_cost.py                       # 5 pairs, 1500 steps, 1/16/64/256 metrics
    python benchmarks/logging_cost.py --pairs 5 --steps 3000 --metrics 1 64
    python benchmarks/logging_cost.py --ddp --metrics 1 64  # 2 processes, sync_dist=True
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ddp  # noqa: E402  (the DDP data and MLP)
from overhead import LR, WARMUP_STEPS, _data, _mlp, loop_timer  # noqa: E402  (the same data and MLP)

TARGET_RATIO = 1.05
LOG_EVERY = 50


def _metric_values(loss, logits, n: int) -> list:
    """N cheap per-step values derived from the step (the same in both workers)."""
    values = [loss]
    for i in range(1, n):
        values.append(logits[:, i % 10].mean() * (1.0 + i * 1e-3))
    return values


def run_raw(steps: int, n: int, root: str) -> float:
    import torch
    from torch.nn import functional as F
    from torch.utils.tensorboard import SummaryWriter

    names = ["loss"] + [f"m{i:03d}" for i in range(1, n)]
    writer = SummaryWriter(log_dir=root)
    loader = _data(steps)
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    model.train()
    done = 0
    while done < steps:
        for x, y in loader:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            values = [v.detach() for v in _metric_values(loss, logits, n)]
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            if (done) % LOG_EVERY == 0:  # the global step after this optimizer step
                floats = torch.stack(values).tolist()  # one conversion per publishing step
                for name, value in zip(names, floats):
                    writer.add_scalar(name, value, done - 1)
            if done == steps:
                break
    writer.close()
    return loss.item()


def run_tandem(steps: int, n: int, root: str, progress_bar: bool) -> float:
    import torch
    from torch.nn import functional as F

    from tandem import Trainer, TrainingModule
    from tandem.loggers import TensorBoardLogger

    names = ["loss"] + [f"m{i:03d}" for i in range(1, n)]

    class MLP(TrainingModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.net(x)
            loss = F.cross_entropy(logits, y)
            for name, value in zip(names, _metric_values(loss, logits, n)):
                self.log(name, value)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        max_epochs=-1,
        logger=TensorBoardLogger(root),
        log_every_n_steps=LOG_EVERY,
        enable_checkpointing=False,
        enable_progress_bar=progress_bar,
        enable_model_summary=False,
    )
    model = MLP()
    trainer.fit(model, _data(steps))
    assert trainer.global_step == steps, f"tandem took {trainer.global_step} steps, expected {steps}"
    return float(trainer.callback_metrics["loss"])


# ---------------------------------------------------------------------------- --ddp: 2 processes, sync_dist=True
def _ddp_raw_rank(rank: int, port: int, steps: int, n: int, root: str, result: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler
    from torch.utils.tensorboard import SummaryWriter

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ddp.WORLD_SIZE)
    names = ["loss"] + [f"m{i:03d}" for i in range(1, n)]
    writer = SummaryWriter(log_dir=root) if rank == 0 else None
    model = ddp._mlp()
    wrapped = DistributedDataParallel(model)
    data = ddp._dataset(steps)
    # a training loader under DDP is shuffled by a DistributedSampler seeded 0, as Lightning and tandem do
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=ddp.BATCH_SIZE, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=ddp.LR)
    sampler.set_epoch(0)
    start = time.perf_counter()
    for done, (x, y) in enumerate(loader, start=1):
        logits = wrapped(x)
        loss = F.cross_entropy(logits, y)
        values = [v.detach() for v in _metric_values(loss, logits, n)]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if done % LOG_EVERY == 0:  # one all-reduce of the stacked values, then rank 0 writes their means
            packed = torch.stack(values)
            dist.all_reduce(packed)
            if writer is not None:
                for name, value in zip(names, (packed / ddp.WORLD_SIZE).tolist()):
                    writer.add_scalar(name, value, done - 1)
    fit = time.perf_counter() - start
    if rank == 0:
        writer.close()
        Path(result).write_text(json.dumps({"loop_s": fit, "final_loss": loss.item()}))
    del wrapped  # freed now, not while the interpreter shuts down (where gloo may abort the process)
    gc.collect()
    dist.destroy_process_group()


def _ddp_raw(steps: int, n: int, root: str, result: str) -> None:
    import torch.multiprocessing as mp

    from tandem.strategies.environments.machine import find_free_port

    mp.spawn(_ddp_raw_rank, args=(find_free_port(), steps, n, root, result), nprocs=ddp.WORLD_SIZE)


def _ddp_tandem(steps: int, n: int, root: str, result: str) -> None:
    import torch
    from torch.nn import functional as F
    from torch.utils.data import DataLoader

    import tandem
    from tandem.loggers import TensorBoardLogger

    names = ["loss"] + [f"m{i:03d}" for i in range(1, n)]

    class MLP(tandem.TrainingModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = ddp._mlp()

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.net(x)
            loss = F.cross_entropy(logits, y)
            for name, value in zip(names, _metric_values(loss, logits, n)):
                self.log(name, value, sync_dist=True)
            self.last_loss = loss.detach()
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=ddp.LR)

    timer, model = loop_timer(), MLP()
    trainer = tandem.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=ddp.WORLD_SIZE,
        max_steps=steps,
        callbacks=[timer],
        logger=TensorBoardLogger(root),
        log_every_n_steps=LOG_EVERY,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(ddp._dataset(steps), batch_size=ddp.BATCH_SIZE, shuffle=False))
    if trainer.is_global_zero:
        Path(result).write_text(json.dumps({"loop_s": timer.seconds, "final_loss": model.last_loss.item()}))


def worker(mode: str, steps: int, n: int, progress_bar: bool) -> None:
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:

        def run(s: int, d: str) -> float:
            return run_raw(s, n, d) if mode == "raw" else run_tandem(s, n, d, progress_bar)

        run(WARMUP_STEPS, f"{root}/warmup")
        start = time.perf_counter()
        final_loss = run(steps, f"{root}/timed")
        loop_s = time.perf_counter() - start
    print(json.dumps({"mode": mode, "loop_s": loop_s, "final_loss": final_loss}))


def _spawn(mode: str, steps: int, n: int, progress_bar: bool, distributed: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--worker", mode, "--steps", str(steps), "--metrics", str(n)]
    if progress_bar:
        cmd.append("--progress-bar")
    with tempfile.TemporaryDirectory() as folder:
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
        if distributed:
            cmd += ["--ddp", "--result", os.path.join(folder, "result.json")]
            env["OMP_NUM_THREADS"] = "1"
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if proc.returncode != 0:
            sys.exit(f"the {mode} worker failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
        if distributed:
            return json.loads(Path(folder, "result.json").read_text())
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(
    n: int, pairs: int, steps: int, progress_bar: bool, distributed: bool = False
) -> tuple[float, float, float, float, float]:
    rows = []
    for pair in range(pairs):
        order = ("raw", "tandem") if pair % 2 == 0 else ("tandem", "raw")
        results = {mode: _spawn(mode, steps, n, progress_bar, distributed) for mode in order}
        raw, tandem = results["raw"], results["tandem"]
        if abs(raw["final_loss"] - tandem["final_loss"]) > 1e-6:
            sys.exit(f"{n} metrics: final loss raw {raw['final_loss']} != tandem {tandem['final_loss']}")
        raw_us, tandem_us = (1e6 * r["loop_s"] / steps for r in (raw, tandem))
        rows.append((raw_us, tandem_us, tandem_us / raw_us))
    ratios = [r[2] for r in rows]
    return (
        statistics.median(r[0] for r in rows),
        statistics.median(r[1] for r in rows),
        statistics.median(ratios),
        min(ratios),
        max(ratios),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="raw/tandem pairs per case (the median of 5 or more)")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--metrics", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--progress-bar", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ddp", action="store_true", help="2 processes over gloo, sync_dist=True")
    parser.add_argument("--worker", choices=("raw", "tandem"), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=f"exit 1 if a median ratio exceeds {TARGET_RATIO}")
    args = parser.parse_args()
    if args.worker and args.ddp:
        with tempfile.TemporaryDirectory() as root:
            run = _ddp_raw if args.worker == "raw" else _ddp_tandem
            run(args.steps, args.metrics[0], root, args.result)
        return
    if args.worker:
        worker(args.worker, args.steps, args.metrics[0], args.progress_bar)
        return

    shape = "2-process DDP, sync_dist=True, MLP 32-256-10" if args.ddp else "MLP 32-64-10"
    print(
        f"logging_cost: {shape}, {args.steps} steps, log_every_n_steps={LOG_EVERY}, TensorBoard, 1 thread, "
        f"{args.pairs} pairs of fresh processes per case"
    )
    print(f"{'metrics':>12}  {'raw us/step':>11}  {'tandem us/step':>14}  {'ratio':>6}  {'spread':>13}")
    cases = [(n, False) for n in args.metrics] + ([] if args.ddp else [(args.metrics[0], True)])
    worst = 0.0
    for n, bar in cases:
        raw_us, tandem_us, ratio, lo, hi = measure(n, args.pairs, args.steps, bar, args.ddp)
        label = f"{n}" + (" +bar" if bar else "")
        print(f"{label:>12}  {raw_us:>11.1f}  {tandem_us:>14.1f}  {ratio:>6.3f}  {lo:>6.3f}-{hi:<6.3f}", flush=True)
        if not bar:
            worst = max(worst, ratio)
    verdict = "met" if worst <= TARGET_RATIO else "MISSED"
    print(f"worst median ratio (progress bar off): {worst:.3f}x (target <= {TARGET_RATIO}x: {verdict})")
    if args.check and worst > TARGET_RATIO:
        sys.exit(1)


if __name__ == "__main__":
    main()
