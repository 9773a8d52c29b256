"""One command for a GPU session: the test suite with CUDA visible, the host syncs of every precision, and the GPU
benchmarks against their raw loops, within 8 minutes on one H100/H200; every result in one folder.

    python benchmarks/gpu_check.py                     # results in gpu-check-results/
    python benchmarks/gpu_check.py --out /tmp/results --only syncs,gpu
    python benchmarks/gpu_check.py --dry-run           # the same plan on the CPU at tiny sizes (under a minute)
    make gpu-check                                     # the same; GPU_CHECK_OUT=... GPU_CHECK_ARGS=--dry-run

The steps, one process each, in this order, each stopped at its limit (the others still run):

| step | what | limit |
| --- | --- | ---: |
| ``syncs`` | the pairs of ``tests/sync_counting.py`` (tandem and the hand-written loop for 32-true, 16-mixed and bf16-mixed; automatic and manual optimization; accumulation, clipping, a per-step scheduler, rollback) on CUDA over 8 steady-state batches: ``cudaStreamSynchronize`` and the other waits, ``aten::item`` and ``aten::_local_scalar_dense`` from ``torch.profiler``, and ``HostReads``'s counts with the lines that read | 50 s |
| ``suite`` | ``pytest`` over ``tests/`` with CUDA visible, in parallel (``-n auto`` when pytest-xdist is installed), ``--junitxml`` and a line per test in ``suite.jsonl`` as each one finishes (so a suite stopped at its limit still says what ran) | 230 s |
| ``gpu`` | ``benchmarks/gpu.py --variants raw,single,raw_bf16,bf16 --steps 30``: a ResNet by the raw loop and by tandem, fp32 and bf16 | 100 s |
| ``fsdp_gpu`` | ``benchmarks/fsdp_gpu.py --repeats 2 --steps 20``: bf16 FSDP, tandem against the hand-written FSDP2 loop | 90 s |

The folder gets ``environment.json`` (versions, devices, modules missing), ``<step>.log`` for each step,
``syncs.json`` / ``syncs.md``, ``suite.xml`` / ``suite.jsonl``, and ``summary.md`` (every step's status and time,
the suite's counts and failures, the sync table, the benchmarks' tables). It exits 1 when a step failed.

``--dry-run`` runs the same plan on the CPU: the sync pairs with the profiler's CPU events only, two test files
(a GPU test among them, skipped), ``gpu.py --dry-run`` on two variants and ``fsdp_gpu.py --dry-run`` once; it says
which parts need CUDA. Without CUDA and without ``--dry-run`` it prints a note and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS = ("syncs", "suite", "gpu", "fsdp_gpu")
#: modules the suite imports somewhere beyond torch (missing ones fail or skip their tests: listed, not fatal)
OPTIONAL = ("omegaconf", "tqdm", "yaml", "pytest_timeout", "xdist", "sklearn", "rich", "psutil", "matplotlib")
GRACE_S = 15  # a step past its limit minus this gets SIGINT (pytest still writes its report), SIGKILL at the limit
PROFILED = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "aten::item",
    "aten::_local_scalar_dense",
    "aten::nonzero",
)


@dataclass
class Step:
    name: str
    command: list[str]
    limit_s: float
    note: str = ""
    env: dict[str, str] = field(default_factory=dict)


# ====================================================================== the plan
#: seconds per step on one H100/H200: 470 in all, within the session's 8 minutes (``--suite-limit`` changes the suite's)
LIMITS = {"syncs": 50, "suite": 230, "gpu": 100, "fsdp_gpu": 90}


def plan(args: argparse.Namespace, out: Path) -> list[Step]:
    py, dry = sys.executable, args.dry_run
    xdist = _has("xdist")
    syncs = [py, str(Path(__file__).resolve()), "--worker", "syncs", "--out", str(out)]
    suite = [py, "-m", "pytest", "-p", "gpu_check", "-p", "no:cacheprovider", "-q", "-rfE"]
    suite += ["--junitxml", str(out / "suite.xml")]
    if (
        _has("pytest_timeout") and args.suite_limit > 3 * GRACE_S
    ):  # stops in time to write the report (the step's limit is the backstop)
        suite += ["--session-timeout", str(int(args.suite_limit - 2 * GRACE_S))]
    if xdist:
        suite += ["-n", "2" if dry else "auto"]
    gpu = [py, str(REPO / "benchmarks" / "gpu.py")]
    fsdp = [py, str(REPO / "benchmarks" / "fsdp_gpu.py")]
    if dry:
        syncs += ["--dry-run"]
        suite += DRY_TESTS
        gpu += ["--dry-run", "--variants", "raw,single"]
        fsdp += ["--dry-run", "--repeats", "1", "--steps", "1", "--warmup", "1"]
    else:
        gpu += ["--variants", "raw,single,raw_bf16,bf16", "--steps", "30", "--timeout", "45"]
        fsdp += ["--repeats", "2", "--steps", "20"]
    steps = [
        Step("syncs", syncs, LIMITS["syncs"]),
        Step("suite", suite, args.suite_limit, env={"GPU_CHECK_JSONL": str(out / "suite.jsonl")}),
        Step("gpu", gpu, LIMITS["gpu"]),
        Step("fsdp_gpu", fsdp, LIMITS["fsdp_gpu"]),
    ]
    for step in steps:
        notes = ["" if xdist or step.name != "suite" else "pytest-xdist is not installed: one process"]
        step.note = "; ".join(filter(None, [*notes, _DRY_NOTES[step.name] if dry else ""]))
    return [s for s in steps if s.name in args.only]


#: the dry run's "suite": a GPU test among them (skipped on the CPU), the sync counter's own test
DRY_TESTS = [
    "tests/trainer/test_cuda_memory.py",
    "tests/trainer/test_host_syncs.py::test_the_counter_sees_each_kind_of_read",
]
_DRY_NOTES = {
    "syncs": "dry run: on the CPU (no cudaStreamSynchronize to count: the profiler's CPU events and HostReads only)",
    "suite": "dry run: two test files, not the suite (the GPU tests skip without CUDA)",
    "gpu": "dry run: gpu.py --dry-run on the CPU, raw and single only (the times mean nothing; dp, ddp and bf16 need CUDA)",
    "fsdp_gpu": "dry run: fsdp_gpu.py --dry-run, 2 CPU processes over gloo (the times mean nothing)",
}


# ====================================================================== running the steps
def run_step(step: Step, out: Path) -> dict:
    """Run one step with its output in ``<name>.log``, within its limit: SIGINT ``GRACE_S`` before it (pytest still
    writes its report), SIGKILL at it."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    paths = [str(REPO / "src"), str(REPO / "benchmarks"), env.get("PYTHONPATH", "")]
    env.update(PYTHONPATH=os.pathsep.join(p for p in paths if p), PYTHONUNBUFFERED="1", **step.env)
    log = out / f"{step.name}.log"
    start = time.perf_counter()
    with open(log, "w") as stream:
        stream.write("$ " + " ".join(step.command) + "\n\n")
        stream.flush()
        proc = subprocess.Popen(
            step.command, cwd=REPO, env=env, stdout=stream, stderr=subprocess.STDOUT, start_new_session=True
        )
        stopped = False
        try:
            proc.wait(timeout=step.limit_s - GRACE_S)
        except subprocess.TimeoutExpired:
            stopped = True
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    seconds = time.perf_counter() - start
    status = (
        f"stopped at its limit ({step.limit_s:.0f} s)"
        if stopped
        else ("ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})")
    )
    print(f"{step.name:<9} {status:<32} {seconds:6.1f} s   {log}", flush=True)
    return {
        "step": step.name,
        "status": status,
        "seconds": round(seconds, 1),
        "limit_s": step.limit_s,
        "note": step.note,
    }


def environment(out: Path, dry_run: bool) -> dict:
    import torch

    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "cpus": os.cpu_count(),
        "dry_run": dry_run,
        "missing": [m for m in OPTIONAL if not _has(m)],
    }
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, check=False)
        (out / "nvidia-smi.txt").write_text(smi.stdout + smi.stderr)
    (out / "environment.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ====================================================================== the summary
def summary(out: Path, info: dict, results: list[dict], seconds: float) -> str:
    lines = [
        f"# gpu_check {'(dry run, CPU) ' if info['dry_run'] else ''}{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        f"{', '.join(info['devices']) or 'no CUDA device'}; torch {info['torch']} (CUDA {info['cuda']}), Python "
        f"{info['python']}, {info['cpus']} CPUs; modules missing: {', '.join(info['missing']) or 'none'}. "
        f"All steps: {seconds:.0f} s.",
        "",
        "| step | status | seconds | limit | note |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    lines += [f"| {r['step']} | {r['status']} | {r['seconds']} | {r['limit_s']:.0f} | {r['note']} |" for r in results]
    done = {r["step"] for r in results}
    if "syncs" in done and (out / "syncs.md").exists():
        lines += ["", "## Host syncs between logging steps", "", (out / "syncs.md").read_text().strip()]
    if "suite" in done:
        lines += ["", "## Test suite", "", _suite_summary(out)]
    for name in ("gpu", "fsdp_gpu"):
        if name in done:
            lines += ["", f"## {name}.py", "", "```", _table_tail(out / f"{name}.log"), "```"]
    return "\n".join(lines) + "\n"


def _suite_summary(out: Path) -> str:
    xml, jsonl = out / "suite.xml", out / "suite.jsonl"
    records = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()] if jsonl.exists() else []
    failed = [r for r in records if r["outcome"] == "failed"]
    text = ""
    if xml.exists():
        root = ET.parse(xml).getroot()
        suite = root if root.tag == "testsuite" else root.find("testsuite")
        a = suite.attrib
        text = (
            f"JUnit: {a.get('tests')} tests, {a.get('failures')} failed, {a.get('errors')} errors, "
            f"{a.get('skipped')} skipped in {float(a.get('time', 0)):.0f} s."
        )
    else:
        text = "No suite.xml (the run was killed before pytest wrote it)."
    outcomes = {o: sum(r["outcome"] == o for r in records) for o in ("passed", "failed", "skipped")}
    text += f" suite.jsonl: {len(records)} results ({', '.join(f'{n} {o}' for o, n in outcomes.items())})."
    if failed:
        text += "\n\nFailed:\n\n" + "\n".join(f"- `{r['nodeid']}` ({r['when']}): {r['message']}" for r in failed[:40])
    return text


def _table_tail(log: Path) -> str:
    """The benchmark's printed result: its output from the device line on (else its last lines)."""
    text = log.read_text() if log.exists() else ""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("device:") or re.match(r"^\d+ blocks of d=", line):
            return "\n".join(lines[i:])[-6000:]
    return "\n".join(lines[-30:])


# ====================================================================== the syncs worker
def sync_worker(out: Path, dry_run: bool) -> None:
    """tandem and the hand-written loop of each pair in ``tests/sync_counting.py``, on CUDA (the CPU in a dry run),
    counted by torch's profiler and by ``HostReads`` over the same steady-state batches."""
    import warnings

    import torch

    sys.path.insert(0, str(REPO / "tests"))
    from sync_counting import AUTOCAST, FIRST, LAST, SETUPS, HostReads, run_hand, run_tandem

    warnings.filterwarnings("ignore")
    device = "cpu" if dry_run else "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    class Window:
        def __init__(self) -> None:
            self.profile = torch.profiler.profile(activities=activities)
            self.reads = HostReads(device)

        def start(self) -> None:
            if device == "cuda":
                torch.cuda.synchronize()
            self.profile.start()
            self.reads.start()

        def stop(self) -> None:
            self.reads.stop()
            self.profile.stop()

        def counts(self) -> dict:
            found = {name: 0 for name in PROFILED}
            for event in self.profile.key_averages():
                if event.key in found:
                    found[event.key] += event.count
            return {"profiler": found, "host_reads": dict(self.reads.counts), "where": self.reads.report()}

    rows = []
    run_hand("32-true", SETUPS["automatic"], Window(), device)  # warm-up: CUDA context, cuBLAS, kernels
    pairs = [(name, precision) for name in SETUPS for precision in AUTOCAST]
    if dry_run:  # the plumbing only: every precision once, and manual optimization under float16
        pairs = [("automatic", precision) for precision in AUTOCAST] + [("manual", "16-mixed")]
    for name, precision in pairs:
        setup = SETUPS[name]
        ours, hand = Window(), Window()
        run_tandem(precision, setup, ours, device)
        run_hand(precision, setup, hand, device)
        rows.append(
            {
                "setup": name,
                "precision": precision,
                "steps": setup.steps(),
                "tandem": ours.counts(),
                "hand": hand.counts(),
            }
        )
        print(name, precision, rows[-1]["tandem"]["profiler"], rows[-1]["hand"]["profiler"], flush=True)
    (out / "syncs.json").write_text(
        json.dumps({"device": device, "batches": [FIRST, LAST], "rows": rows}, indent=2) + "\n"
    )
    table = [
        f"Batches {FIRST}..{LAST} of a one-epoch fit, no logging step among them; tandem / hand-written loop. "
        f"{'On CUDA.' if device == 'cuda' else 'On the CPU (dry run): no stream to synchronize.'}",
        "",
        "| setup | precision | steps | cudaStreamSynchronize | aten::item | HostReads scalar/copy/nonzero | more than the hand loop |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        t, h = row["tandem"], row["hand"]

        def reads(counts: dict) -> str:
            return "/".join(str(counts.get(k, 0)) for k in ("scalar", "copy", "nonzero"))

        sync = "cudaStreamSynchronize"
        streams = f"{t['profiler'][sync]} / {h['profiler'][sync]}" if device == "cuda" else "n/a"
        more = [k for k in PROFILED if t["profiler"][k] > h["profiler"][k]]
        more += [k for k in ("scalar", "copy", "nonzero") if t["host_reads"].get(k, 0) > h["host_reads"].get(k, 0)]
        table.append(
            f"| {row['setup']} | {row['precision']} | {row['steps']} | {streams} | "
            f"{t['profiler']['aten::item']} / {h['profiler']['aten::item']} | {reads(t['host_reads'])} / "
            f"{reads(h['host_reads'])} | {', '.join(more) + ': ' + t['where'] if more else 'no'} |"
        )
    (out / "syncs.md").write_text("\n".join(table) + "\n")


# ====================================================================== pytest plugin (-p gpu_check)
_RESULTS = None


def pytest_configure(config) -> None:
    """A line of JSON per test result in ``$GPU_CHECK_JSONL`` as it arrives (on xdist's controller only)."""
    global _RESULTS
    path = os.environ.get("GPU_CHECK_JSONL")
    if path and not hasattr(config, "workerinput"):
        _RESULTS = open(path, "a", buffering=1)  # noqa: SIM115 - open for the whole session


def pytest_runtest_logreport(report) -> None:
    if _RESULTS is None or (report.when != "call" and report.outcome == "passed"):
        return
    message = ""
    if report.failed:
        message = report.longreprtext.strip().splitlines()[-1][:300] if report.longreprtext else ""
    elif report.skipped and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2])[:300]
    record = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "seconds": round(report.duration, 3),
        "message": message,
    }
    _RESULTS.write(json.dumps(record) + "\n")


# ====================================================================== main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu-check-results", help="the results folder (created; files replaced)")
    parser.add_argument("--only", default=",".join(STEPS), help=f"comma-separated steps, from {STEPS}")
    parser.add_argument("--suite-limit", type=float, default=LIMITS["suite"], help="seconds for the test suite")
    parser.add_argument("--dry-run", action="store_true", help="the same plan on the CPU at tiny sizes")
    parser.add_argument("--worker", choices=("syncs",), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.worker == "syncs":
        sync_worker(out, args.dry_run)
        return 0
    args.only = args.only.split(",")
    unknown = sorted(set(args.only) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}; choose from {STEPS}")
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_check.py needs CUDA; none is available here, so nothing ran. Use --dry-run to check the plan on the CPU."
        )
        return 0
    for stale in ("suite.jsonl", "suite.xml", "syncs.json", "syncs.md", "summary.md"):
        (out / stale).unlink(missing_ok=True)
    start = time.perf_counter()
    info = environment(out, args.dry_run)
    print(f"gpu_check: {', '.join(info['devices']) or 'CPU (dry run)'}; results in {out}", flush=True)
    results = [run_step(step, out) for step in plan(args, out)]
    seconds = time.perf_counter() - start
    (out / "summary.md").write_text(summary(out, info, results, seconds))
    print(f"all steps: {seconds:.0f} s; summary in {out / 'summary.md'}")
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
