"""A hang anywhere (not only in tandem's own collectives) ends the job within ``hang_timeout``: every rank prints its
stack and rank 0 raises HangError with a table of where each rank was. One two-rank job per mistake (a hang ends
the job), under tandem's launcher on gloo; ``hang_timeout`` is 3 s (5 minutes by default)."""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import launch_free_env
from tandem.strategies.ddp import DDPStrategy
from tandem.strategies.environments.machine import find_free_port
from tandem.utilities.exceptions import TandemConfigError

SCRIPT = Path(__file__).parent / "scripts" / "hang_runs.py"
HANG_TIMEOUT = 3.0


def _run(
    mode: str, out: Path, torchrun: bool = False, devices: int = 2
) -> tuple[subprocess.CompletedProcess, float, str]:
    """One job of ``hang_runs.py`` on ``devices`` ranks: (the finished process, seconds it took, what rank 0's fit
    raised)."""
    start = time.monotonic()
    run = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d"]
    run += ["--rdzv-endpoint", f"127.0.0.1:{find_free_port()}"] if torchrun else []
    done = subprocess.run(
        [sys.executable, *(run if torchrun else []), str(SCRIPT), mode, str(out), str(HANG_TIMEOUT), str(devices)],
        capture_output=True,
        text=True,
        timeout=150 if devices <= 2 else 240,  # generous: a parallel suite on 2 cores; 8 processes start there too
        env=launch_free_env(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"),
    )
    elapsed = time.monotonic() - start
    raised = (out / "raised0").read_text() if (out / "raised0").exists() else ""
    return done, elapsed, raised


def _row(raised: str, rank: int) -> str:
    found = re.search(rf"^  {rank}  .*$", raised, re.M)
    assert found, raised
    return re.sub(r"\s+", " ", found.group(0)).strip()


def _ended_as_a_hang(done: subprocess.CompletedProcess, elapsed: float, raised: str, limit: float = 140) -> None:
    assert done.returncode != 0
    assert raised.split("\n", 1)[1].startswith("HangError: No rank made progress for 3 s (hang_timeout=3 s)"), (
        raised or done.stderr[-3000:]
    )
    fit_seconds = float(raised.split("\n", 1)[0])
    # the hang timeout and a margin for a busy machine (a parallel suite, a loaded CI host): not the process
    # group's 30 minutes
    assert fit_seconds < HANG_TIMEOUT + 90, fit_seconds
    assert elapsed < limit, elapsed
    # every rank printed its Python stack (faulthandler), naming the user's frame
    assert "rank 1: rank 0 declared a hang; this rank's stack:" in done.stderr
    assert "rank 0's stack:" in done.stderr
    assert done.stderr.count("(most recent call first)") >= 3, done.stderr[-3000:]


@pytest.mark.timeout(180)
def test_one_rank_skipping_backward_is_a_hang_error_naming_each_rank(tmp_path):
    """Rank 1 skips manual_backward once: DDP's gradient all-reduces pair up one step apart, and rank 0 is left
    in its last backward while rank 1 waits at the fit's end."""
    done, elapsed, raised = _run("skip_backward1", tmp_path)
    _ended_as_a_hang(done, elapsed, raised)
    assert _row(raised, 0).startswith("0 train backward 0 ")
    assert "torch's _engine_run_backward" in _row(raised, 0)
    row1 = _row(raised, 1)
    assert row1.startswith("1 train ") and "tandem's collective check, called at hang_runs.py:" in row1
    steps = [int(_row(raised, r).split()[4]) for r in (0, 1)]
    assert steps[1] == steps[0] + 1  # rank 0 is one all-reduce behind


@pytest.mark.timeout(180)
def test_a_one_rank_all_reduce_is_a_hang_error_naming_the_users_line(tmp_path):
    done, elapsed, raised = _run("all_reduce1", tmp_path)
    _ended_as_a_hang(done, elapsed, raised)
    assert _row(raised, 0).startswith("0 train backward 0 2 2 ")
    assert re.match(
        r"1 train training_step 0 2 2 hang_runs.py:\d+ in training_step torch's all_reduce", _row(raised, 1)
    )
    rank1_stack = done.stderr.split("rank 1: rank 0 declared a hang; this rank's stack:")[1]
    assert re.search(r'hang_runs.py", line \d+ in training_step', rank1_stack), rank1_stack[:3000]


@pytest.mark.slow
@pytest.mark.timeout(260)
def test_a_one_rank_all_reduce_among_eight_ranks_is_named_by_every_rank(tmp_path):
    """8 ranks (issue 34): rank 1 alone in an all-reduce, the 7 others in DDP's gradient all-reduce. Rank 0's table
    names rank 1's line; every rank prints its own stack."""
    done, elapsed, raised = _run("all_reduce1", tmp_path, devices=8)
    _ended_as_a_hang(done, elapsed, raised, limit=230)  # the start of 8 processes on 2 busy cores included
    assert re.match(
        r"1 train training_step 0 2 2 hang_runs.py:\d+ in training_step torch's all_reduce", _row(raised, 1)
    )
    for rank in (0, *range(2, 8)):
        assert re.match(rf"{rank} train backward 0 2 2 ", _row(raised, rank)), _row(raised, rank)
    for rank in range(1, 8):
        assert f"rank {rank}: rank 0 declared a hang; this rank's stack:" in done.stderr


@pytest.mark.timeout(180)
def test_under_torchrun_rank_zeros_broken_collective_raises_the_hang_error(tmp_path):
    """No tandem launcher in rank 0: the hang reaches its main thread as its all-reduce breaks (rank 1 ended)."""
    done, elapsed, raised = _run("all_reduce1", tmp_path, torchrun=True)
    _ended_as_a_hang(done, elapsed, raised)
    assert re.match(
        r"1 train training_step 0 2 2 hang_runs.py:\d+ in training_step torch's all_reduce", _row(raised, 1)
    )


@pytest.mark.timeout(180)
def test_a_hang_in_validate_alone_is_a_hang_error_naming_the_batch(tmp_path):
    done, elapsed, raised = _run("validate_all_reduce1", tmp_path)
    _ended_as_a_hang(done, elapsed, raised)
    # rank 0 ran its 32 batches (index 31) and waits in the epoch end's reduction for rank 1
    assert re.match(r"0 validate - 0 0 31 .*tandem's collective check", _row(raised, 0)), _row(raised, 0)
    assert re.match(
        r"1 validate validation_step 0 0 2 hang_runs.py:\d+ in validation_step torch's all_reduce", _row(raised, 1)
    )


@pytest.mark.timeout(180)
def test_a_data_loader_blocked_on_one_rank_is_a_hang_error(tmp_path):
    done, elapsed, raised = _run("slow_data1", tmp_path)
    _ended_as_a_hang(done, elapsed, raised)
    assert _row(raised, 0).startswith("0 train backward 0 2 2 ")
    assert re.match(r"1 train fetching a batch 0 2 2 hang_runs.py:\d+ in __getitem__", _row(raised, 1))


def test_hang_timeout_must_be_a_positive_timedelta():
    with pytest.raises(TandemConfigError, match="hang_timeout"):
        DDPStrategy(hang_timeout=30)
    with pytest.raises(TandemConfigError, match="hang_timeout"):
        DDPStrategy(hang_timeout=datetime.timedelta(0))
    assert DDPStrategy().hang_timeout == datetime.timedelta(minutes=5)
    assert DDPStrategy(hang_timeout=None).hang_timeout is None


@pytest.mark.timeout(180)
def test_a_slow_rank_before_the_loop_is_no_hang(tmp_path):
    """Rank 0 in setup() for twice hang_timeout (a download) while rank 1 waits: no loop runs yet, so no hang."""
    done, _, raised = _run("slow_setup0", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not raised and "No rank made progress" not in done.stderr
    assert (tmp_path / "done0").exists() and (tmp_path / "done1").exists()
