"""GPU benchmark: a small ResNet trained by a hand-written loop and by tandem, each variant in its own process.

Variants: ``raw`` (a plain PyTorch loop), ``single`` (tandem, one GPU), ``dp`` (tandem DataParallel on all
visible GPUs, each GPU getting the raw loop's batch), ``ddp`` (tandem DDP, one process per visible GPU, the
same batch per GPU), ``raw_bf16`` and ``bf16`` (the loop and tandem under bfloat16 autocast). Printed: the
time per optimizer step, its ratio to the raw loop (bf16 also to raw_bf16), samples/s and the speed-up in
samples/s. The target: ``single`` within 2% of ``raw``.

    python benchmarks/gpu.py                       # all variants on the visible GPUs
    python benchmarks/gpu.py --variants raw,single --steps 100
    python benchmarks/gpu.py --dry-run             # a tiny model on CPU: checks the code paths, times nothing useful

Without CUDA (and without --dry-run) it prints a note and exits 0. The batch size is doubled (up to 8x)
until the raw loop takes at least 20 ms a step, so the GPU and not Python bounds the step time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

VARIANTS = ("raw", "single", "dp", "ddp", "raw_bf16", "bf16")
DRY_RUN_VARIANTS = ("raw", "single", "raw_bf16", "bf16")
MIN_STEP_MS = 20.0
RESULT = "BENCHMARK_RESULT "


# ====================================================================== the model and data
class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.skip(x))


def resnet(width: int, classes: int = 100) -> nn.Module:
    """ResNet-18's layout (four stages of two blocks) with ``width`` channels in the first stage."""
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
    cin = width
    for stage in range(4):
        cout = width * 2**stage
        layers += [Block(cin, cout, 1 if stage == 0 else 2), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def make_loader(cfg: argparse.Namespace, batch_size: int, batches: int, pin: bool) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch_size * batches, 3, cfg.image_size, cfg.image_size, generator=g)
    y = torch.randint(0, 100, (batch_size * batches,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, pin_memory=pin, drop_last=True)


def make_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def synchronize() -> None:
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)


# ====================================================================== the variants (one per process)
def run_raw(cfg: argparse.Namespace, device: torch.device, bf16: bool) -> float:
    """Seconds for ``cfg.steps`` steps of a hand-written loop, after ``cfg.warmup`` steps."""
    model = resnet(cfg.width).to(device)
    optimizer = make_optimizer(model.parameters())
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16)
    start = 0.0
    for i, (x, y) in enumerate(make_loader(cfg, cfg.batch_size, cfg.warmup + cfg.steps, device.type == "cuda")):
        if i == cfg.warmup:
            synchronize()
            start = time.perf_counter()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast:
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    synchronize()
    return time.perf_counter() - start


def run_tandem(cfg: argparse.Namespace, variant: str, device_type: str) -> tuple[float, bool]:
    """Seconds for the timed steps, and whether this process is global rank zero."""
    import tandem

    class Module(tandem.TrainingModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = resnet(cfg.width)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return make_optimizer(self.parameters())

    class Timer(tandem.Callback):
        def __init__(self) -> None:
            self.start = self.seconds = 0.0

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if batch_idx == cfg.warmup:
                synchronize()
                self.start = time.perf_counter()

        def on_train_end(self, trainer, module):
            synchronize()
            self.seconds = time.perf_counter() - self.start

    gpus = torch.cuda.device_count() if device_type == "cuda" else 1
    strategy, devices, batch_size, precision = "single_device", 1, cfg.batch_size, "32-true"
    if variant == "dp":
        strategy, devices, batch_size = "dp", gpus, cfg.batch_size * gpus  # each GPU gets the raw batch
    elif variant == "ddp":
        strategy, devices = "ddp", gpus  # each rank loads the raw batch
    elif variant == "bf16":
        precision = "bf16-mixed"
    world = gpus if variant == "ddp" else 1
    timer = Timer()
    trainer = tandem.Trainer(
        accelerator=device_type,
        devices=devices,
        strategy=strategy,
        precision=precision,
        max_steps=cfg.warmup + cfg.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[timer],
    )
    loader = make_loader(cfg, batch_size, (cfg.warmup + cfg.steps) * world, device_type == "cuda")
    trainer.fit(Module(), loader)
    return timer.seconds, trainer.is_global_zero


def calibrate(cfg: argparse.Namespace) -> int:
    """The smallest batch size (cfg.batch_size times 1, 2, 4 or 8) whose raw step takes >= 20 ms."""
    device = torch.device("cuda", 0)
    model = resnet(cfg.width).to(device)
    optimizer = make_optimizer(model.parameters())
    batch = cfg.batch_size
    for _ in range(4):
        x = torch.randn(batch, 3, cfg.image_size, cfg.image_size, device=device)
        y = torch.randint(0, 100, (batch,), device=device)
        for i in range(8):
            if i == 3:
                synchronize()
                start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        synchronize()
        if (time.perf_counter() - start) / 5 * 1000 >= MIN_STEP_MS:
            break
        batch *= 2
    return batch


def worker(cfg: argparse.Namespace) -> None:
    warnings.filterwarnings("ignore")  # dp warns (once) that BatchNorm statistics see the first chunk only
    torch.manual_seed(0)
    device_type = "cpu" if cfg.dry_run else "cuda"
    torch.backends.cudnn.benchmark = True
    if cfg.worker == "calibrate":
        print(RESULT + json.dumps({"batch_size": calibrate(cfg)}), flush=True)
        return
    if cfg.worker in ("raw", "raw_bf16"):
        seconds, report = run_raw(cfg, torch.device(device_type, 0), bf16=cfg.worker == "raw_bf16"), True
    else:
        seconds, report = run_tandem(cfg, cfg.worker, device_type)
    if report:
        gpus = torch.cuda.device_count() if device_type == "cuda" else 1
        devices = gpus if cfg.worker in ("dp", "ddp") else 1
        samples = cfg.batch_size * devices * cfg.steps
        result = {
            "variant": cfg.worker,
            "devices": devices,
            "step_ms": seconds / cfg.steps * 1000,
            "samples_per_s": samples / seconds,
        }
        print(RESULT + json.dumps(result), flush=True)


# ====================================================================== the driver
def run_worker(cfg: argparse.Namespace, variant: str, batch_size: int) -> dict | None:
    args = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        variant,
        "--batch-size",
        str(batch_size),
        "--image-size",
        str(cfg.image_size),
        "--width",
        str(cfg.width),
        "--steps",
        str(cfg.steps),
        "--warmup",
        str(cfg.warmup),
    ] + (["--dry-run"] if cfg.dry_run else [])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=cfg.timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        print(f"{variant}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1][len(RESULT) :])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {VARIANTS}")
    parser.add_argument("--batch-size", type=int, default=256, help="per GPU (raised until a raw step >= 20 ms)")
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--steps", type=int, default=50, help="timed steps")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per variant")
    parser.add_argument("--dry-run", action="store_true", help="tiny config on CPU, single-device and bf16 paths only")
    parser.add_argument("--worker", choices=(*VARIANTS, "calibrate"), help=argparse.SUPPRESS)
    cfg = parser.parse_args(argv)
    if cfg.worker:
        worker(cfg)
        return 0
    if cfg.dry_run:
        cfg.batch_size, cfg.image_size, cfg.width, cfg.steps, cfg.warmup = 8, 16, 8, 3, 1
        variants = [v for v in cfg.variants.split(",") if v in DRY_RUN_VARIANTS]
        batch_size = cfg.batch_size
        device = "CPU (dry run: code paths only, the times mean nothing)"
    else:
        if not torch.cuda.is_available():
            print(
                "benchmarks/gpu.py needs CUDA; none is available here, so nothing was measured. "
                "Run it on a GPU machine (or --dry-run to check the code paths on CPU)."
            )
            return 0
        variants = cfg.variants.split(",")
        unknown = sorted(set(variants) - set(VARIANTS))
        if unknown:
            parser.error(f"unknown variants {unknown}; choose from {VARIANTS}")
        calibrated = run_worker(cfg, "calibrate", cfg.batch_size)
        batch_size = calibrated["batch_size"] if calibrated else cfg.batch_size
        device = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    print(f"device: {device}; torch {torch.__version__}")
    print(
        f"model: ResNet-18 layout, width {cfg.width}, {cfg.image_size}x{cfg.image_size} images, "
        f"batch {batch_size} per device, {cfg.steps} timed steps after {cfg.warmup}"
    )
    results = {v: r for v in variants if (r := run_worker(cfg, v, batch_size)) is not None}
    raw = results.get("raw")
    print(f"\n{'variant':<10} {'devices':>7} {'ms/step':>9} {'vs raw':>8} {'samples/s':>11} {'speed-up':>9}")
    for name, r in results.items():
        ratio = f"{r['step_ms'] / raw['step_ms']:.3f}" if raw else "-"
        speedup = f"{r['samples_per_s'] / raw['samples_per_s']:.2f}x" if raw else "-"
        print(f"{name:<10} {r['devices']:>7} {r['step_ms']:>9.2f} {ratio:>8} {r['samples_per_s']:>11.1f} {speedup:>9}")
    if "bf16" in results and "raw_bf16" in results:
        print(f"\nbf16 vs raw_bf16: {results['bf16']['step_ms'] / results['raw_bf16']['step_ms']:.3f}")
    if raw and not cfg.dry_run and raw["step_ms"] < MIN_STEP_MS:
        print(
            f"note: the raw step took {raw['step_ms']:.1f} ms < {MIN_STEP_MS:.0f} ms; raise --image-size or "
            "--width so the comparison measures GPU-bound steps."
        )
    return 0 if len(results) == len(variants) else 1


if __name__ == "__main__":
    sys.exit(main())
