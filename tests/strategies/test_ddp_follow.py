"""DDP that follows the module (issue 30): the patterns of ``scripts/ddp_follow_runs.py`` under 2-process ``ddp``
(the ``follow`` scenario of the shared launch, ``tests/conftest.py``'s ``ddp_trainer_runs``) end with equal weights
on both ranks, equal to one process with twice the batch (within 1e-6: the sums are added in another order); what
tandem did is said in one info line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import tandem
from helpers import max_abs_diff

SCRIPTS = Path(__file__).parent / "scripts"
PATTERNS = ("unfreeze", "head", "plateau", "gan", "target", "fsdp_unfreeze", "midway", "diverge")
CORRECT = PATTERNS[:-1]  # what tandem makes equal to one process
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def follow() -> Any:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import ddp_follow_runs

        yield ddp_follow_runs
    finally:
        sys.path.remove(str(SCRIPTS))


@pytest.fixture(scope="module")
def runs(ddp_trainer_runs: dict[str, Any]) -> dict[str, Any]:
    """Each pattern's per-rank results, and the job's captured output."""
    results: dict[str, Any] = {"output": ddp_trainer_runs["output"]}
    for name in PATTERNS:
        results[name] = [rank[name] for rank in ddp_trainer_runs["follow"]]
    return results


def _one_process(follow: Any, pattern: str) -> dict[str, Any]:
    tandem.seed_everything(0)
    return follow.fit(pattern, devices=1)


@pytest.mark.parametrize("pattern", CORRECT)
def test_two_ranks_end_equal_and_equal_to_one_process_with_twice_the_batch(runs, follow, pattern):
    rank0, rank1 = runs[pattern]
    if rank1["final"]:  # under fsdp, rank 0 alone gets the gathered weights
        assert max_abs_diff(rank0["final"], rank1["final"]) == 0.0
    alone = _one_process(follow, pattern)
    assert rank0["steps"] == alone["steps"]
    difference = max_abs_diff(rank0["final"], alone["final"])
    assert difference <= 1e-6, difference


def test_an_unfreeze_rebuilds_the_wrapper_and_a_checkpoint_after_it_resumes_exactly(runs):
    rank0, rank1 = runs["unfreeze"]
    for result in (rank0, rank1):
        assert max_abs_diff(result["resumed"], result["final"]) == 0.0
    assert (
        "DDP's wrapper was built again: the trainable parameters changed: 4 parameter(s) now take gradients"
        in (runs["output"])
    )


def test_a_callback_head_starts_as_rank_zeros_and_is_trained_alike(runs):
    output = runs["output"]
    assert "left parameters without a gradient on every rank (online.weight, online.bias)" in output
    assert "averaged by a hook" in output


def test_a_gan_under_plain_ddp_turns_on_the_unused_parameter_search(runs):
    assert "with find_unused_parameters=True" in runs["output"]


def test_a_target_network_outside_the_loss_is_left_out_of_ddp(runs):
    assert "(target.weight, target.bias)" in runs["output"]


def test_replicas_no_trainer_can_keep_equal_train_on_with_a_warning_when_asked(runs):
    """on_replica_divergence="warn": the fit ends (3 epochs), rank 0 warns at each epoch's end naming the tensor and
    the way out, rank 1 stays quiet, and the ranks' copies differ (what Lightning does without a word)."""
    rank0, rank1 = runs["diverge"]
    assert rank0["steps"] == rank1["steps"] == 12
    assert len(rank0["warnings"]) == 3 and rank1["warnings"] == []
    assert "parameter 'head.bias' on rank 1 is not what rank 0 holds" in rank0["warnings"][0]
    assert "Training goes on (on_replica_divergence='warn')" in rank0["warnings"][0]
    assert max_abs_diff(rank0["final"], rank1["final"]) > 0


def test_the_divergence_reaction_is_checked_and_the_error_names_the_way_out():
    with pytest.raises(tandem.utilities.exceptions.TandemConfigError, match="on_replica_divergence.*'raise'.*'warn'"):
        tandem.Trainer(on_replica_divergence="ignore")
    from tandem.trainer.replicas import diverged_error

    error = diverged_error([("parameter", "w")], (0, [1], 1), "at the end of epoch 0", manual=False, world=2)
    assert "meta-learning inner loop" in str(error) and "Trainer(on_replica_divergence='warn')" in str(error)
