"""DDP at 8 ranks (gloo, 2 cores oversubscribed), against one process: the same weights after a shuffled fit in the
global data order, elastic resume mid-epoch from 3 ranks to 8 and from 8 to 4 at the exact sample, and a bad batch on
one rank rolled back past on every rank in step, a rank killed mid-save losing nothing; and what coordination costs a rank (``benchmarks/scale.py``'s
counts) the same at 4 and 8 ranks. Three launches for the module (3, 8 and 4 ranks, one after the other) of
``scripts/world_runs.py``; each test reads their results. (A hang among 8 ranks: ``test_hang.py``.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import launch_free_env, max_abs_diff

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _launch(out: Path, devices: int, scenarios: list[str], resume: str | None = None) -> dict[str, Any]:
    """Each scenario's results by rank; with ``killed_save`` (last: it ends the job) the job's output instead."""
    args = [sys.executable, str(SCRIPTS / "world_runs.py"), *scenarios, "--out", str(out), "--devices", str(devices)]
    args += ["--count"] if "counts" in scenarios else []
    done = subprocess.run(
        [*args, *(["--resume", resume] if resume else []), "--hang-after", "100"],
        capture_output=True,
        text=True,
        timeout=150,
        env={**launch_free_env(), "PYTHONUNBUFFERED": "1"},  # tandem picks the threads: 1 a rank here
        cwd=out,
    )
    killed = "killed_save" in scenarios
    assert (done.returncode != 0) == killed, done.stdout[-3000:] + done.stderr[-5000:]
    results: dict[str, Any] = {"output": done.stdout + done.stderr}
    for name in scenarios[:-1] if killed else scenarios:
        results[name] = [torch.load(out / f"{name}-{devices}-rank{r}.pt", weights_only=False) for r in range(devices)]
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``runs[devices][scenario][rank]``, and ``runs["one"]``: the one-process references (run here)."""
    out = tmp_path_factory.mktemp("world_size")
    sys.path.insert(0, str(SCRIPTS))
    try:
        import world_runs
    finally:
        sys.path.remove(str(SCRIPTS))
    results: dict[Any, Any] = {
        "one": {name: world_runs.SCENARIOS[name](out, 1, None) for name in ("whole", "rollback")}
    }
    results["scale"], results["out"] = world_runs.scale, out  # benchmarks/scale.py, as world_runs imports it
    results[3] = _launch(out, 3, ["whole"])
    scenarios = ["counts", "whole", "resume", "rollback", "killed_save"]
    results[8] = _launch(out, 8, scenarios, resume=str(out / "elastic-3.ckpt"))
    results["world_runs"] = world_runs
    results[4] = _launch(out, 4, ["counts", "resume"], resume=str(out / "elastic-8.ckpt"))
    return results


def _same_on_every_rank(results: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    for result in results[1:]:
        assert max_abs_diff(result["final"], results[0]["final"]) == 0.0, result["final"]
    return results[0]["final"]


def test_eight_ranks_train_as_one_process_in_the_global_order(runs):
    one = runs["one"]["whole"]["final"]
    for devices in (3, 8):
        final = _same_on_every_rank(runs[devices]["whole"])
        assert max_abs_diff(final, one) <= 1e-6, (devices, max_abs_diff(final, one))
        assert runs[devices]["whole"][0]["global_step"] == 16


@pytest.mark.parametrize("resumed, saved", [(8, 3), (4, 8)])
def test_a_mid_epoch_checkpoint_resumes_on_another_world_size_at_the_exact_sample(runs, resumed, saved):
    """Saved by ``saved`` ranks after batch 4 of epoch 1, resumed by ``resumed`` ranks (global batch 24 both
    divide): the weights of the uninterrupted run."""
    final = _same_on_every_rank(runs[resumed]["resume"])
    result = runs[resumed]["resume"][0]
    assert result["global_step"] == 16 and result["epoch"] == 2
    assert not [w for w in result["warnings"] if "global batch" in w]  # kept: nothing to warn about
    whole = runs[saved]["whole"][0]["final"]
    assert max_abs_diff(final, whole) <= 1e-6, max_abs_diff(final, whole)


def test_a_bad_batch_on_one_of_eight_ranks_is_rolled_back_on_every_rank_in_step(runs):
    one = runs["one"]["rollback"]
    results = runs[8]["rollback"]
    final = _same_on_every_rank(results)
    assert all(torch.isfinite(v).all() for v in final.values())
    assert len(one["rollbacks"]) == 2  # batch 2 of each epoch
    for result in results:
        assert result["rollbacks"] == one["rollbacks"] and result["global_step"] == one["global_step"]
    assert max_abs_diff(final, one["final"]) <= 1e-6, max_abs_diff(final, one["final"])


def test_a_rank_killed_mid_save_loses_nothing(runs, tmp_path):
    """Rank 5 of 8 killed as the second checkpoint (step 8) is built, rank 0 writing: the job ends naming it; every
    file in the folder is whole, and the newest, resumed on one process (global batch 24), ends as the uninterrupted
    run."""
    from tandem.utilities.checkpoint import load_checkpoint_file

    output = runs[8]["output"]
    assert "rank 5" in output and "SIGKILL" in output, output[-3000:]
    folder = runs["out"] / "killed"
    steps = {n: load_checkpoint_file(folder / n)["global_step"] for n in os.listdir(folder) if n.endswith(".ckpt")}
    assert 4 in steps.values() and max(steps.values()) <= 8, steps
    newest = max(steps, key=steps.get)
    world_runs = runs["world_runs"]
    final = world_runs.resume(tmp_path, 1, str(folder / newest))
    assert final["global_step"] == 16
    assert max_abs_diff(final["final"], runs["one"]["whole"]["final"]) <= 1e-6


# ---------------------------------------------------------------------- what coordination costs a rank, at 4 and 8
@pytest.fixture(scope="module")
def counts(runs) -> dict[int, dict[str, Any]]:
    """``benchmarks/scale.py``'s summary of each world size's counts (per rank: mean and busiest)."""
    return {world: runs["scale"].summarize(world, runs[world]["counts"], None) for world in (4, 8)}


def _per_rank(result: dict, phase: str, kind: str, which: str = "mean") -> float:
    return result["phases"][phase][which].get(kind, 0.0)


def test_no_count_a_rank_grows_from_4_to_8_ranks(runs, counts):
    """The harness's own rule: store requests, store bytes and collective bytes a rank, per step, publishing step,
    epoch end and save, and no gather in any of them (every rank logs the same names: the values travel packed)."""
    assert runs["scale"].not_flat([counts[4], counts[8]]) == []


def test_plain_steps_cost_no_store_request_and_no_collective(counts):
    for world, result in counts.items():
        for kind in ("store_requests", "collectives"):
            assert _per_rank(result, "step", kind, "max") == 0, (world, kind)


def test_a_publishing_step_costs_a_rank_a_few_store_requests_and_two_small_all_reduces(counts):
    """One checked collective: the all-reduce of the names' layout and the notes, then the packed values' (the loss,
    logged with sync_dist=True: its sum, weight and presence); the same bytes at 4 and 8 ranks, and no gather."""
    for result in counts.values():
        assert _per_rank(result, "publish", "collectives") == 2
        assert _per_rank(result, "publish", "gathers", "max") == 0
        assert _per_rank(result, "publish", "store_requests", "max") <= 14, result["phases"]["publish"]
    assert _per_rank(counts[4], "publish", "coll_bytes") == _per_rank(counts[8], "publish", "coll_bytes")
    small, large = (_per_rank(counts[w], "publish", "store_bytes", "max") for w in (4, 8))
    assert large <= 1.5 * small + 100, (small, large)  # no rank reads every rank's keys


def test_epoch_ends_and_saves_cost_the_same_collectives_at_4_and_8_ranks(counts):
    for phase in ("epoch_end", "save"):
        assert _per_rank(counts[4], phase, "collectives") == _per_rank(counts[8], phase, "collectives"), phase
    # the replica check before a save is one all-reduce of a few numbers a tensor, not a gather of every rank's
    assert _per_rank(counts[4], "save", "coll_bytes") == _per_rank(counts[8], "save", "coll_bytes")
