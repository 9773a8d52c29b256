"""tandem's ddp joins a default process group that someone else initialised (Ray Train, the script itself)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import launch_free_env, max_abs_diff, run_python

SCRIPT = Path(__file__).parent / "scripts" / "existing_group.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The fits in a process group the script initialised itself."""
    out = tmp_path_factory.mktemp("existing_group")
    result = run_python([str(SCRIPT), str(out)], env=launch_free_env(), timeout=110)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return out


@pytest.fixture(scope="module")
def ref(ddp_trainer_runs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The same fit under tandem's own ddp launch (the ``existing_group`` scenario of the shared launch,
    ``tests/conftest.py``):
    rank 0's weights."""
    return ddp_trainer_runs["existing_group"][0]["weights"]


def test_fit_in_an_existing_group_matches_the_ddp_run(runs: Path, ref: dict[str, torch.Tensor]) -> None:
    own = [torch.load(runs / f"own_{rank}.pt") for rank in (0, 1)]
    assert max_abs_diff(own[0], own[1]) == 0.0
    assert max_abs_diff(own[0], ref) == 0.0


def test_world_size_mismatch_names_both_sizes(runs: Path) -> None:
    for rank in (0, 1):
        text = (runs / f"mismatch_{rank}.txt").read_text()
        assert "world size 2" in text and "2 × 1 = 2" not in text and "3 × 1 = 3" in text


@pytest.mark.timeout(300)
def test_fit_inside_ray_train_matches_the_ddp_run(runs: Path, ref: dict[str, torch.Tensor]) -> None:
    """Ray's TorchTrainer starts the workers and initialises the group; tandem's ddp joins it (about 20 s)."""
    pytest.importorskip("ray.train.torch")
    env = launch_free_env(PYTHONPATH=f"{SCRIPT.parents[3] / 'src'}:{SCRIPT.parents[2]}", RAY_USAGE_STATS_ENABLED="0")
    result = run_python([str(SCRIPT.parent / "ray_fit.py"), str(runs)], env=env, timeout=280)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    weights = [torch.load(runs / f"ray_{rank}.pt") for rank in (0, 1)]
    assert max_abs_diff(weights[0], weights[1]) == 0.0
    assert max_abs_diff(weights[0], ref) == 0.0
    metrics, files = (runs / "ray_result.txt").read_text().splitlines()  # RayTrainReportCallback's last report
    assert "train_loss" in metrics and "epoch" in metrics
    assert files == "['checkpoint.ckpt']"
