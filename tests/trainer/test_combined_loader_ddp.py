"""Several training loaders under ``strategy="ddp", devices=2`` (gloo, real processes: the ``combined`` scenario of the
trainer tests' shared launch, ``core_ddp``): each loader is sharded by a sampler of its own, the steps equal one
process's under ``data_order="global"``, and a mid-epoch checkpoint resumes exactly."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import max_abs_diff

SCRIPT = Path(__file__).parent / "scripts" / "combined_ddp_run.py"
MODES = ("max_size_cycle", "min_size", "max_size")


@pytest.fixture(scope="module")
def ranks(core_ddp: dict[str, Any]) -> list[dict[str, Any]]:
    return core_ddp["combined"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import combined_ddp_run
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return combined_ddp_run.run(1, tmp_path_factory.mktemp("combined_one"))


def _merged(rank0: dict[str, Any], rank1: dict[str, Any]) -> list[dict[str, list[int] | None]]:
    """Each step's ids of both ranks, per loader, sorted (the global batch)."""
    steps = []
    for a, b in zip(rank0, rank1, strict=True):
        steps.append({k: None if a[k] is None else sorted(a[k] + b[k]) for k in a})
    return steps


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
def test_each_loader_is_sharded_and_the_steps_equal_one_process(ranks, one_process, mode):
    rank0, rank1 = ranks[0][mode], ranks[1][mode]
    reference = one_process[mode]
    assert rank0["batches"] == rank1["batches"] == reference["batches"]
    assert rank0["steps"] == reference["steps"]
    assert rank0["samplers"] == ["GlobalOrderSampler", "GlobalOrderSampler"]  # a DistributedSampler each
    for a, b in zip(rank0["seen"], rank1["seen"]):  # the ranks' shares of each loader are disjoint
        assert all(a[k] is None or not set(a[k]) & set(b[k]) for k in a)
    one = [{k: None if v is None else sorted(v) for k, v in step.items()} for step in reference["seen"]]
    assert _merged(rank0["seen"], rank1["seen"]) == one
    assert max_abs_diff(rank0["weights"], rank1["weights"]) == 0.0
    assert max_abs_diff(rank0["weights"], reference["weights"]) < 1e-6  # the gradient's mean, summed otherwise


@pytest.mark.timeout(300)
def test_a_mid_epoch_checkpoint_of_two_loaders_resumes_exactly_under_ddp(ranks, one_process):
    for rank in ranks:
        full, resumed = rank["max_size_cycle"], rank["resumed"]
        assert resumed["seen"] == full["seen"][4:]
        assert max_abs_diff(resumed["weights"], full["weights"]) == 0.0
    assert one_process["resumed"]["seen"] == one_process["max_size_cycle"]["seen"][4:]


@pytest.mark.timeout(300)
def test_a_dataloader_iter_step_takes_each_ranks_share_and_resumes_exactly_under_ddp(ranks, one_process):
    """training_step(self, dataloader_iter) taking two batches a step: each rank takes its shard, the steps equal
    one process's, and a checkpoint at step 2 (batch 4 of 5) resumes exactly."""
    rank0, rank1, reference = ranks[0]["iter"], ranks[1]["iter"], one_process["iter"]
    assert rank0["steps"] == rank1["steps"] == reference["steps"] == 6  # 2 + 2 + 1 batches, twice
    for a, b in zip(rank0["seen"], rank1["seen"]):
        assert all(not set(a[k]) & set(b[k]) for k in a)
    one = [{k: sorted(v) for k, v in step.items()} for step in reference["seen"]]
    assert _merged(rank0["seen"], rank1["seen"]) == one
    assert max_abs_diff(rank0["weights"], reference["weights"]) < 1e-6
    for rank in (*ranks, one_process):
        assert rank["iter_resumed"]["seen"] == rank["iter"]["seen"][4:]
        assert max_abs_diff(rank["iter_resumed"]["weights"], rank["iter"]["weights"]) == 0.0
