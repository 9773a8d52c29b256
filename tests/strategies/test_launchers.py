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
import traceback
import types
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler

from helpers import launch_free_env
from tandem.strategies.environments.machine import find_free_port
from tandem.strategies.launchers.command import script_command
from tandem.strategies.launchers.records import _write_error_record
from tandem.strategies.launchers.script import processes_started
from tandem.strategies.launchers.watchdog import _WAKE_SIGNAL, _Child, _Watchdog
from tandem.utilities.exceptions import RankFailedError, TandemConfigError

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
        # Lightning's training sampler: shuffled (seed 0: no seed_everything), padded to 6 samples a rank
        assert result["train_indices"] == list(DistributedSampler(range(11), num_replicas=2, rank=r, seed=0))
        # unequal hand-sharded data (3 vs 5 batches) is evened to 3, with a warning on rank 0 only
        assert result["evened_batches"] == 3 and result["evened_warned"] == (r == 0)
        # 11 predictions in dataset order, batched by 3 as one process would, on every rank
        assert result["predict_indices"] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10]]
        torch.testing.assert_close(result["predict_double"][:, 0], torch.arange(11.0) * 2)
        message = result["unused_message"]
        assert "extra.weight, extra.bias" in message and "find_unused_parameters=True" in message
    return ranks[0]["weights"]


@pytest.mark.timeout(150)
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


@pytest.mark.timeout(150)
@pytest.mark.parametrize("rank0_sleeps", [False, True], ids=["rank0-in-collective", "rank0-busy"])
def test_crash_in_rank_1_ends_the_job(tmp_path, rank0_sleeps):
    """Rank 0 stops rank 1's peers and raises RankFailedError in its main thread, wherever it is: in the
    collective that rank 1's exit broke, or asleep (a signal wakes it)."""
    start = time.monotonic()
    args = [str(SCRIPT), "crash", "--out", str(tmp_path)] + (["--rank0-sleeps"] if rank0_sleeps else [])
    done = _run(args, timeout=90)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert elapsed < 60  # seconds, not the process group's 30 minutes; generous for a busy host
    assert "RuntimeError: boom at step 3 on rank 1" in done.stderr  # the failing rank's traceback is shown
    # one line names the rank (its exit code is 1, or 134 when torch aborts while exiting with a live group)
    assert re.search(
        r"\[tandem\] rank 1 (exited with code 1|was killed by SIGABRT); stopping the other ranks", done.stderr
    ), done.stderr
    # rank 0, in a collective or asleep, raises in its main thread: its context manager sees why, then exits 1
    assert done.returncode == 1
    ended = (tmp_path / "exit0").read_text()
    assert re.match(r"RankFailedError: rank 1 (exited with code 1|was killed by SIGABRT); the other ranks", ended)
    assert "Its traceback:\nTraceback (most recent call last):" in ended and "boom at step 3 on rank 1" in ended
    if rank0_sleeps:  # woken where it slept: no collective of its own broke, and rank 1's error is the last word
        assert ended.rstrip().endswith("RuntimeError: boom at step 3 on rank 1"), ended
        assert "collective then broke" not in ended, ended
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in (0, 1)]
    assert _all_ended(pids)


@pytest.mark.timeout(150)
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


# ---------------------------------------------------------------------------------------------- ddp_spawn

SPAWN_RUNS = SCRIPT.parent / "spawn_runs.py"


@pytest.fixture(scope="module")
def spawn_runs(tmp_path_factory) -> dict:
    """``scripts/spawn_runs.py``: every ddp_spawn scenario in one process (the launcher alone, then with a Trainer),
    ending with a rank killed by SIGKILL."""
    out = tmp_path_factory.mktemp("spawn_runs")
    done = _run([str(SPAWN_RUNS), "--out", str(out)], timeout=300)
    return {"out": out, "done": done}


@pytest.mark.timeout(60)
def test_spawn_returns_rank_0_results(spawn_runs):
    received = torch.load(spawn_runs["out"] / "spawn.pt", weights_only=False)
    result = received["result"]
    assert result["rank"] == 0 and result["sum"] == 2.0
    for name, value in result["weights"].items():  # the trained weights are loaded into the caller's module
        assert torch.equal(received["after"][name], value)
        assert not torch.equal(received["before"][name], value)
    assert received["callback_metrics"] == {"stale": 1.0, "seen_by": torch.tensor(0.0)}  # rank 0's dict
    assert received["best_model_path"] == "best-from-rank0.ckpt"
    assert received["progress"] == {"epoch": 10}  # rank 0's fit_loop.state_dict(), loaded into the caller's


@pytest.mark.timeout(60)
def test_spawn_failure_names_the_rank(spawn_runs):
    """The caller raises (here caught, so the first launch's results survive; the Trainer's killed rank below shows
    the exit of a job that does not catch it)."""
    message = (spawn_runs["out"] / "error.txt").read_text()
    assert message.startswith("ddp_spawn: rank 1 exited with code 1; the other ranks were stopped. Its traceback:")
    assert "ValueError: spawned rank 1 fails" in message


# ---------------------------------------------------------------------------------------------- ddp_spawn + Trainer


def _spawned_pids(out: Path, scenario: str) -> list[int]:
    return [int((out / f"pid-{scenario}-{r}").read_text()) for r in (0, 1)]


@pytest.mark.timeout(120)
def test_spawn_follows_seed_everything(spawn_runs):
    """Dropout and a shuffled loader in spawned ranks: two fits after seed_everything(7) have equal weights after
    two steps (the second fit is the one whose rank 1 is then killed)."""
    out = spawn_runs["out"]
    first, second = (torch.load(out / f"step2-{scenario}.pt", weights_only=False) for scenario in ("seeded", "killed"))
    for name, value in first.items():
        assert torch.equal(value, second[name]), name


@pytest.mark.timeout(120)
def test_spawn_keeps_one_run_folder_and_the_fitted_progress(spawn_runs):
    """fit, then test, then trainer.log_dir: one version folder, which exists; current_epoch and global_step
    read the fitted values in the calling process."""
    result = torch.load(spawn_runs["out"] / "seeded.pt", weights_only=False)
    run = spawn_runs["out"] / "seeded" / "tandem_logs" / "version_0"
    assert result["versions"] == ["version_0"]
    assert result["log_dir"] == result["after_fit"]["log_dir"] == str(run) and result["log_dir_exists"]
    assert result["after_fit"]["epoch"] == 2 and result["after_fit"]["step"] == 8  # 2 epochs of 4 batches per rank
    assert result["best_model_path"] == str(run / "checkpoints" / "epoch=1-step=8.ckpt")  # Lightning's default file
    # the test's event file alone: the fit wrote no row and, the module having saved no hyperparameters, none of
    # those either (Lightning's rule)
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    assert result["tested"][0]["test_loss"] > 0


@pytest.mark.timeout(120)
def test_a_finished_spawn_run_is_freed_without_the_garbage_collector(spawn_runs):
    assert (spawn_runs["out"] / "seeded-alive.txt").read_text() == ""


@pytest.mark.timeout(120)
def test_spawn_names_the_attribute_that_cannot_be_pickled(spawn_runs):
    message = (spawn_runs["out"] / "unpicklable.txt").read_text()
    assert message.startswith(
        "strategy='ddp_spawn' sends your module, data and Trainer to each process it starts by pickling them, and "
        "Classifier.net.writer.lock (a _thread.lock) cannot be pickled: cannot pickle '_thread.lock' object. "
        "Use strategy='ddp'"
    ), message
    assert not list(spawn_runs["out"].glob("pid-unpicklable-*"))  # no process was started


@pytest.mark.timeout(120)
def test_spawn_reports_a_rank_killed_by_a_signal_as_killed(spawn_runs):
    """Rank 1 dies by SIGKILL while rank 0 is in the gradient all-reduce and fails in turn: the caller reports
    rank 1's signal (never rank 0's echo, nor a half-written error file), quickly, and no process is left."""
    out, done = spawn_runs["out"], spawn_runs["done"]
    assert done.returncode == 1
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line == (
        "tandem.utilities.exceptions.RankFailedError: ddp_spawn: rank 1 was killed by SIGKILL (the kernel's "
        "out-of-memory killer sends SIGKILL); the other ranks were stopped. It left no Python traceback; its own "
        "output (above) may say more."
    ), done.stderr[-3000:]
    assert "EOFError" not in done.stderr and "Connection closed" not in done.stderr  # rank 0's echo is not shown
    assert done.stderr.count("Traceback (most recent call last)") == 1
    reported = float((out / "killed-reported-at").read_text()) - float((out / "killed-at").read_text())
    assert 0 < reported < 10
    assert _all_ended([p for scenario in ("seeded", "killed") for p in _spawned_pids(out, scenario)])


@pytest.mark.timeout(200)
def test_spawn_without_a_main_guard_gets_one_clear_error(tmp_path):
    """Each spawned process imports the script again; without the guard that import would start training: the
    processes end quietly and the caller raises one error naming the fix (instead of pages of multiprocessing)."""
    start = time.monotonic()
    done = _run([str(SCRIPT.parent / "spawn_unguarded.py"), str(tmp_path)], timeout=150)
    elapsed = time.monotonic() - start
    assert done.returncode == 1 and elapsed < 150
    assert done.stderr.count("Traceback (most recent call last)") == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "tandem.utilities.exceptions.TandemConfigError: strategy='ddp_spawn' starts each process by importing "
        "your script again, and this script starts training as it is imported (it has no `if __name__ == "
        '"__main__":` guard). Put the code that creates the Trainer and calls fit under `if __name__ == '
        '"__main__":`, or use strategy="ddp", which runs the whole script on every rank.'
    )
    assert "bootstrapping phase" not in done.stderr
    pids = [int(p.name.split("-")[1]) for p in tmp_path.glob("pid-*")]
    # the script, and the processes that imported it again: both, unless the first one's end stopped the other
    # before it got that far (a loaded machine)
    assert len(pids) in (2, 3) and _all_ended(pids)


# ---------------------------------------------------------------------------------------------- no processes


def test_rank_0s_own_error_is_kept_whole_behind_the_failure(tmp_path):
    """A started rank failed, and rank 0 then raised an error of its own: RankFailedError carries the rank's
    traceback, and rank 0's error stays attached as its context, whole (not cut at 200 characters)."""
    record = tmp_path / "rank1.txt"
    _write_error_record(str(record), "Traceback (most recent call last):\nValueError: rank 1's own")
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    child.wait()
    watchdog = _Watchdog()
    watchdog.children = [_Child(1, child, str(record))]
    own = RuntimeError("rank 0's long message " + "x" * 500 + " END")
    with pytest.raises(RankFailedError) as caught:
        try:
            raise own
        except RuntimeError as error:
            failure = watchdog.failure_behind(error)
            assert failure is not None
            raise failure  # noqa: B904 (as ScriptLauncher.launch does)
    assert str(caught.value) == (
        "rank 1 exited with code 3; the other ranks were stopped. Its traceback:\n"
        "Traceback (most recent call last):\nValueError: rank 1's own\n"
        "Rank 0 then raised RuntimeError (shown above), most likely because rank 1 had stopped."
    )
    assert caught.value.__context__ is own
    printed = "".join(traceback.format_exception(caught.value))
    assert "x" * 500 + " END" in printed


def test_rank_0_woken_where_it_was_raises_the_ranks_error_not_a_broken_collective(tmp_path):
    """Rank 0 busy outside any collective when rank 1 failed: the watchdog's signal raises RankFailedError where it
    was. That error is the failure itself, not an echo of it: it is raised as it is, ending with rank 1's error,
    and tandem's own text is never quoted as "the broken collective"."""
    record = tmp_path / "rank1.txt"
    error = RuntimeError("bad batch on rank 1")
    _write_error_record(str(record), "Traceback (most recent call last):\nRuntimeError: bad batch on rank 1", error)
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    child.wait()
    watchdog = _Watchdog()
    watchdog.children = [_Child(1, child, str(record))]
    watchdog.failure = watchdog.children[0]
    with pytest.raises(RankFailedError) as woken:
        watchdog._on_wake_signal(_WAKE_SIGNAL, None)  # what the wake-up signal runs in the main thread
    assert watchdog.failure_behind(woken.value) is woken.value
    assert str(woken.value).endswith(
        "Its traceback:\nTraceback (most recent call last):\nRuntimeError: bad batch on rank 1"
    )


def test_script_command_forms(monkeypatch):
    main = sys.modules["__main__"]
    monkeypatch.setattr(sys, "argv", ["train.py", "--lr", "0.1"])
    monkeypatch.setattr(main, "__spec__", None, raising=False)
    monkeypatch.setattr(main, "__file__", "train.py", raising=False)
    assert script_command() == [sys.executable, os.path.abspath("train.py"), "--lr", "0.1"]

    monkeypatch.setattr(main, "__spec__", types.SimpleNamespace(name="project.train"))
    assert script_command() == [sys.executable, "-m", "project.train", "--lr", "0.1"]
    monkeypatch.setattr(main, "__spec__", types.SimpleNamespace(name="project.__main__"))
    assert script_command() == [sys.executable, "-m", "project", "--lr", "0.1"]

    monkeypatch.setattr(main, "__spec__", None)
    monkeypatch.setattr(sys, "argv", ["-c"])
    with pytest.raises(TandemConfigError, match="ddp_spawn"):
        script_command()


def test_no_processes_are_started_by_importing_the_launchers():
    assert not processes_started()
