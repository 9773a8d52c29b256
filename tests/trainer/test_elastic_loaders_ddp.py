"""Elastic resume of two training loaders between 1 and 2 processes (gloo, real processes: the ``elastic`` scenario of
the trainer tests' shared launch, ``core_ddp``), in each CombinedLoader mode under ``data_order="global"``: with each
loader's global batch kept, a mid-epoch checkpoint of 2 ranks continues on one process, and one of one process on 2
ranks, as if never interrupted; with another batch size each loader's order goes on without a repeat or a gap."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import max_abs_diff

SCRIPTS = Path(__file__).parent / "scripts"
MODES = ("max_size_cycle", "min_size", "max_size")


def _programs() -> Any:
    sys.path.insert(0, str(SCRIPTS))
    try:
        import elastic_loaders_run
    finally:
        sys.path.remove(str(SCRIPTS))
    return elastic_loaders_run


@pytest.fixture(scope="module")
def runs(core_ddp: dict[str, Any]) -> dict[str, Any]:
    """The launch's folder of this scenario (the two-process checkpoints), the one-process runs written there before
    the launch, and each rank's results."""
    out = core_ddp["out"] / "elastic"
    return {"out": out, "one": torch.load(out / "one.pt", weights_only=False), "ranks": core_ddp["elastic"]}


def _global(rank0: list[dict[str, Any]], rank1: list[dict[str, Any]]) -> list[dict[str, list[int] | None]]:
    """Each step's ids of both ranks in the global order (rank r of 2 holds its items r, r+2, ...)."""
    steps = []
    for a, b in zip(rank0, rank1, strict=True):
        steps.append({k: None if a[k] is None else [i for pair in zip(a[k], b[k]) for i in pair] for k in a})
    return steps


def _stream(steps: list[dict[str, list[int] | None]], name: str) -> list[int]:
    return [i for step in steps if step[name] is not None for i in step[name]]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
def test_a_two_process_checkpoint_continues_on_one_process_as_if_never_interrupted(runs, mode):
    programs = _programs()
    at = programs.SAVED_AT[mode]
    whole = [rank[mode]["whole"] for rank in runs["ranks"]]
    resumed = programs.resume(1, mode, runs["out"] / f"two-{mode}.ckpt")
    assert resumed["seen"] == _global(whole[0]["seen"], whole[1]["seen"])[at:]
    assert max_abs_diff(resumed["weights"], whole[0]["weights"]) < 1e-6  # the gradient's mean, summed otherwise


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", MODES)
def test_a_one_process_checkpoint_continues_on_two_processes_as_if_never_interrupted(runs, mode):
    at, one = _programs().SAVED_AT[mode], runs["one"][mode]
    rank0, rank1 = (rank[mode]["resumed"] for rank in runs["ranks"])
    assert _global(rank0["seen"], rank1["seen"]) == one["seen"][at:]
    assert max_abs_diff(rank0["weights"], rank1["weights"]) == 0.0
    assert max_abs_diff(rank0["weights"], one["weights"]) < 1e-6


@pytest.mark.timeout(300)
def test_a_two_process_checkpoint_continues_each_loaders_order_with_other_batch_sizes(runs):
    """2 ranks x batch 2 (each loader) resumed on one process with batch 8 for "a" and 2 for "b": each loader's
    epoch goes on from the global order's next item (max_size_cycle: "a" in its second pass)."""
    programs, mode = _programs(), "max_size_cycle"
    at = programs.SAVED_AT[mode]
    whole = _global(*(rank[mode]["whole"]["seen"] for rank in runs["ranks"]))
    with pytest.warns(UserWarning, match="processes 2 -> 1, batch sizes 2 -> 8, 2 -> 2"):
        resumed = programs.resume(1, mode, runs["out"] / f"two-{mode}.ckpt", sizes={"a": 8, "b": 2})
    rest = resumed["seen"][: len(resumed["seen"]) - 10]  # epoch 1: "b"'s 20 samples in batches of 2
    for name, n in (("a", 12), ("b", 20)):
        stream = _stream(whole[:at] + rest, name)
        order = _stream(whole, name)[:n]  # the epoch's order (every pass of it)
        assert stream == (order * 3)[: len(stream)], name
    assert len(_stream(whole[:at] + rest, "b")) == 20  # the epoch ends with "b"'s pass
