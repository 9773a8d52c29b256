"""Launchers with real processes (CPU, gloo, free ports): tandem's script launcher, ddp_spawn, torchrun.

Every process test runs ``scripts/ddp_steps.py`` in a fresh interpreter, so nothing here joins a
process group. Each rank uses one torch thread (OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from helpers import launch_free_env
from tandem.strategies import launchers
from tandem.strategies.environments import find_free_port
from tandem.utilities.exceptions import TandemConfigError

SCRIPT = Path(__file__).parent / "scripts" / "ddp_steps.py"


def _env() -> dict[str, str]:
    return launch_free_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _run(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=_env())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"  # a zombie has ended
    except (ProcessLookupError, FileNotFoundError):
        return False


def _all_ended(pids: list[int], within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(_alive(p) for p in pids)


def _reference_weights(steps: int = 5, world: int = 2) -> dict[str, torch.Tensor]:
    """Hand-written: one process averages the ranks' gradients (what DDP does), starting from rank 0's init."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from ddp_steps import Regression
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    model = Regression()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generators = [torch.Generator().manual_seed(100 + r) for r in range(world)]
    for step in range(steps):
        batches = [(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)) for g in generators]
        loss = sum(model.training_step(b, step) for b in batches) / world
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.state_dict()


def _check_train_results(out: Path, launched_by: str) -> dict[str, torch.Tensor]:
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    reference = _reference_weights()
    for r, result in enumerate(ranks):
        assert result["rank"] == r and result["world_size"] == 2 and result["launched_by"] == launched_by
        assert result["threads"] == 1
        for name, value in reference.items():  # equal on both ranks, and equal to the hand-written loop
            torch.testing.assert_close(result["weights"][name], value, atol=1e-6, rtol=0)
        # the training sampler interleaves (11 samples: rank 1 gets the padding sample 0)
        assert result["train_indices"] == ([0, 2, 4, 6, 8, 10] if r == 0 else [1, 3, 5, 7, 9, 0])
        # unequal hand-sharded data (3 vs 5 batches) is evened to 3, with a warning on rank 0 only
        assert result["evened_batches"] == 3 and result["evened_warned"] == (r == 0)
        # 11 predictions in dataset order, batched by 3 as one process would, on every rank
        assert result["predict_indices"] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10]]
        torch.testing.assert_close(result["predict_double"][:, 0], torch.arange(11.0) * 2)
        message = result["unused_message"]
        assert "extra.weight, extra.bias" in message and "find_unused_parameters=True" in message
    return ranks[0]["weights"]


@pytest.mark.timeout(90)
def test_script_launcher_and_torchrun_train_alike(tmp_path):
    out_script, out_torchrun = tmp_path / "script", tmp_path / "torchrun"
    out_script.mkdir()
    out_torchrun.mkdir()
    done = _run([str(SCRIPT), "train", "--out", str(out_script)])
    assert done.returncode == 0, done.stderr
    by_script = _check_train_results(out_script, "LocalEnvironment")

    endpoint = f"127.0.0.1:{find_free_port()}"
    done = _run(
        [
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            endpoint,
            str(SCRIPT),
            "train",
            "--out",
            str(out_torchrun),
            "--expect-torchrun",
        ]
    )
    assert done.returncode == 0, done.stderr  # the script asserts that tandem launched nothing itself
    by_torchrun = _check_train_results(out_torchrun, "TorchElasticEnvironment")
    for name in by_script:
        torch.testing.assert_close(by_script[name], by_torchrun[name], atol=0, rtol=0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rank0_sleeps", [False, True], ids=["rank0-in-collective", "rank0-busy"])
def test_crash_in_rank_1_ends_the_job(tmp_path, rank0_sleeps):
    start = time.monotonic()
    args = [str(SCRIPT), "crash", "--out", str(tmp_path)] + (["--rank0-sleeps"] if rank0_sleeps else [])
    done = _run(args, timeout=30)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert elapsed < 30
    assert "RuntimeError: boom at step 3 on rank 1" in done.stderr  # the failing rank's traceback is shown
    # one line names the rank (its exit code is 1, or 134 when torch aborts while exiting with a live group)
    assert re.search(
        r"\[tandem\] rank 1 (exited with code 1|was killed by SIGABRT); stopping the other ranks", done.stderr
    ), done.stderr
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in (0, 1)]
    assert _all_ended(pids)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_signal_to_rank_0_ends_every_rank(tmp_path, sig):
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "wait", "--out", str(tmp_path)],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 40
        while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
            time.sleep(0.1)
        pids = [int((tmp_path / f"ready{r}").read_text()) for r in (0, 1)]
        os.kill(proc.pid, sig)
        assert proc.wait(timeout=15) != 0
        assert _all_ended(pids)  # Ctrl-C: rank 0 stops rank 1; kill -9: rank 1 dies with its parent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stderr.close()


@pytest.mark.timeout(60)
def test_spawn_returns_rank_0_results(tmp_path):
    done = _run([str(SCRIPT), "spawn", "--out", str(tmp_path)])
    assert done.returncode == 0, done.stderr
    received = torch.load(tmp_path / "spawn.pt", weights_only=False)
    result = received["result"]
    assert result["rank"] == 0 and result["sum"] == 2.0
    for name, value in result["weights"].items():  # the trained weights are loaded into the caller's module
        assert torch.equal(received["after"][name], value)
        assert not torch.equal(received["before"][name], value)
    assert received["callback_metrics"] == {"stale": 1.0, "seen_by": torch.tensor(0.0)}  # rank 0's dict
    assert received["best_model_path"] == "best-from-rank0.ckpt"


@pytest.mark.timeout(60)
def test_spawn_failure_names_the_rank(tmp_path):
    done = _run([str(SCRIPT), "spawn_crash", "--out", str(tmp_path)])
    assert done.returncode != 0
    message = (tmp_path / "error.txt").read_text()
    assert message.startswith("ddp_spawn: rank 1 failed")
    assert "ValueError: spawned rank 1 fails" in message


# ---------------------------------------------------------------------------------------------- no processes


def test_script_command_forms(monkeypatch):
    main = sys.modules["__main__"]
    monkeypatch.setattr(sys, "argv", ["train.py", "--lr", "0.1"])
    monkeypatch.setattr(main, "__spec__", None, raising=False)
    monkeypatch.setattr(main, "__file__", "train.py", raising=False)
    assert launchers.script_command() == [sys.executable, os.path.abspath("train.py"), "--lr", "0.1"]

    monkeypatch.setattr(main, "__spec__", types.SimpleNamespace(name="project.train"))
    assert launchers.script_command() == [sys.executable, "-m", "project.train", "--lr", "0.1"]
    monkeypatch.setattr(main, "__spec__", types.SimpleNamespace(name="project.__main__"))
    assert launchers.script_command() == [sys.executable, "-m", "project", "--lr", "0.1"]

    monkeypatch.setattr(main, "__spec__", None)
    monkeypatch.setattr(sys, "argv", ["-c"])
    with pytest.raises(TandemConfigError, match="ddp_spawn"):
        launchers.script_command()


def test_launchers_declare_interactive_compatibility():
    assert launchers.SpawnLauncher.is_interactive_compatible
    assert not launchers.ScriptLauncher.is_interactive_compatible
    assert not launchers.processes_started()
