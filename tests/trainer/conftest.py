"""The one shared DDP launch of the trainer tests: ``scripts/core_ddp_runs.py`` plays every scenario on two
gloo ranks (about 40 s on 2 idle cores); the tests that need a DDP result read its files. Each launch costs its
ranks' interpreters, imports and process group (about 7 CPU-seconds), so a new DDP program of these tests is one
more scenario here rather than a launch of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from helpers import launch_free_env, shared_folder
from tandem.utilities.seed import isolate_rng

SCRIPTS = Path(__file__).parent / "scripts"
SCENARIOS = (
    "manual",
    "loaders",
    "ports",
    "nonfinite",
    "rollback",
    "memory",
    "stopping",
    "gathers",
    "tuner",
    "profiling",
    "compiled",
    "evaluation",
    "combined",
    "elastic",
    "lookahead",
    "parity",
    "combined_parity",
    "unused",
)  # unused ends in an error on every rank


def _elastic_one_process(folder: Path) -> None:
    """The ``elastic`` scenario resumes checkpoints of one process: those runs, here first (their seeds and RNG
    draws kept out of the tests that follow)."""
    folder.mkdir()
    sys.path.insert(0, str(SCRIPTS))
    try:
        import elastic_loaders_run
    finally:
        sys.path.remove(str(SCRIPTS))
    with isolate_rng(), mock.patch.dict(os.environ):
        torch.save(elastic_loaders_run.one_process(folder), folder / "one.pt")


def _launch_core_ddp(out: Path) -> None:
    _elastic_one_process(out / "elastic")
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "core_ddp_runs.py"), *SCENARIOS, "--out", str(out), "--hang-after", "100"],
        capture_output=True,
        text=True,
        timeout=420,
        env={**launch_free_env(), "PYTHONUNBUFFERED": "1"},
        cwd=out,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    (out / "output.txt").write_text(done.stdout + done.stderr)


@pytest.fixture(scope="session")
def core_ddp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each scenario's per-rank results (``results[name][rank]``), and the job's captured output. One launch per
    test run, shared by pytest-xdist's workers."""
    out = shared_folder(tmp_path_factory, "core_ddp", _launch_core_ddp)
    results: dict[str, Any] = {"out": out, "output": (out / "output.txt").read_text()}
    for name in SCENARIOS:
        results[name] = [torch.load(out / f"{name}-rank{r}.pt", weights_only=False) for r in (0, 1)]
    return results


@pytest.fixture(scope="session")
def scripts_on_path() -> None:
    """Make ``scripts/`` importable (the modules both sides train)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
