"""Trainer(profiler=...) under ddp (the shared ``core_ddp`` launch); the profilers themselves are tested in
``tests/profilers``."""

from __future__ import annotations


def test_ddp_writes_a_report_per_rank_and_prints_one(core_ddp):
    folder = core_ddp["out"] / "profiling"
    for rank, result in enumerate(core_ddp["profiling"]):
        report = (folder / f"fit-perf-{rank}.txt").read_text()
        assert "[Strategy]DDPStrategy.training_step" in report
        assert result["counts"]["[Strategy]DDPStrategy.training_step"] == 4
    assert core_ddp["output"].count("FIT Profiler Report") == 1  # profiler="simple": printed by rank 0 only
