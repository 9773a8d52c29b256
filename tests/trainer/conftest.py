"""The one shared DDP launch of the trainer tests: ``scripts/core_ddp_runs.py`` plays every scenario on two
gloo ranks (about 15 s); the tests that need a DDP result read its files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import launch_free_env, shared_folder

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
    "unused",
)  # unused ends in an error on every rank


def _launch_core_ddp(out: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "core_ddp_runs.py"), *SCENARIOS, "--out", str(out), "--hang-after", "100"],
        capture_output=True,
        text=True,
        timeout=240,
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
