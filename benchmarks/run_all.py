"""Run every benchmark in this folder, one after another (``make bench``).

overhead.py and import_time.py run first, then any other ``*.py`` here (ddp.py, fsdp_memory.py, gpu.py, ...)
in name order, then the extra runs in ``EXTRA`` (logging_cost.py's 2-process mode); gpu.py and fsdp_gpu.py are
skipped with a note when CUDA is not available. Extra arguments are not forwarded: run a script by itself to
change its settings. Exits 1 if any benchmark failed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIRST = ("overhead.py", "import_time.py")
NOT_BENCHMARKS = ("gpu_check.py",)  # the GPU session's whole check (suite included): `make gpu-check`
NEEDS_CUDA = ("gpu.py", "fsdp_gpu.py")
EXTRA = (("logging_cost.py", "--ddp"),)  # a script again, with these arguments


def benchmark_scripts() -> list[tuple[Path, ...]]:
    """Each run: the script and its arguments."""
    others = sorted(
        p.name
        for p in HERE.glob("*.py")
        if p.name not in (*FIRST, *NOT_BENCHMARKS, Path(__file__).name) and not p.name.startswith("_")
    )
    runs = [(HERE / name,) for name in (*FIRST, *others) if (HERE / name).exists()]
    return runs + [(HERE / name, *args) for name, *args in EXTRA if (HERE / name).exists()]


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def main() -> None:
    summary = []
    for script, *args in benchmark_scripts():
        label = " ".join([script.name, *map(str, args)])
        if script.name in NEEDS_CUDA and not cuda_available():
            print(f"\n=== {label}: skipped, CUDA is not available on this machine", flush=True)
            summary.append((label, "skipped (no CUDA)", 0.0))
            continue
        print(f"\n=== {label}", flush=True)
        start = time.perf_counter()
        returncode = subprocess.run([sys.executable, str(script), *map(str, args)], check=False).returncode
        elapsed = time.perf_counter() - start
        summary.append((label, "ok" if returncode == 0 else f"FAILED (exit {returncode})", elapsed))

    print("\n=== summary")
    for name, status, elapsed in summary:
        print(f"  {name:<26} {status:<20} {elapsed:6.1f} s")
    if any(status.startswith("FAILED") for _, status, _ in summary):
        sys.exit(1)


if __name__ == "__main__":
    main()
