"""``benchmarks/gpu_check.py`` (``make gpu-check``): its dry run, the same plan on the CPU at tiny sizes, so that
the GPU session's one command is known to work before a GPU runs it."""

from __future__ import annotations

import json
import os

import pytest
import torch

from helpers import REPO, run_python

SCRIPT = str(REPO / "benchmarks" / "gpu_check.py")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif("GPU_CHECK_JSONL" in os.environ, reason="inside gpu_check.py's own suite step")
def test_the_dry_run_runs_every_step_and_writes_every_result(tmp_path):
    out = tmp_path / "results"
    result = run_python([SCRIPT, "--dry-run", "--out", str(out)], timeout=280, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = (out / "summary.md").read_text()
    for step in ("syncs", "suite", "gpu", "fsdp_gpu"):
        assert f"| {step} | ok |" in summary, summary
        assert (out / f"{step}.log").exists()
    assert "dry run: two test files" in summary and "need CUDA" in summary  # what the dry run left out
    records = [json.loads(line) for line in (out / "suite.jsonl").read_text().splitlines()]
    assert {r["outcome"] for r in records} == {"passed", "skipped"}  # the GPU test skipped on the CPU
    assert (out / "suite.xml").exists() and json.loads((out / "environment.json").read_text())["dry_run"]
    rows = json.loads((out / "syncs.json").read_text())["rows"]
    assert {r["precision"] for r in rows} == {"32-true", "16-mixed", "bf16-mixed"}
    for row in rows:  # tandem reads no more than the hand loop, by the profiler and by HostReads
        assert row["tandem"]["profiler"]["aten::item"] <= row["hand"]["profiler"]["aten::item"], row
        assert sum(row["tandem"]["host_reads"].values()) <= sum(row["hand"]["host_reads"].values()), row


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the note printed without CUDA")
def test_without_cuda_and_without_dry_run_it_says_so_and_runs_nothing(tmp_path):
    result = run_python([SCRIPT, "--out", str(tmp_path / "results")], timeout=60, cwd=REPO)
    assert result.returncode == 0 and "needs CUDA" in result.stdout and "--dry-run" in result.stdout
    assert list((tmp_path / "results").iterdir()) == []
