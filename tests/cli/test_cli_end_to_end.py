"""tandem.cli end to end, in fresh processes: a fit from config files and overrides, the saved config.yaml
reproducing the run bit for bit, a ddp run (rank 1 parses the same command line), and --help of the example.
(Resuming from a saved config.yaml with --ckpt_path last runs in this process, in test_cli.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from helpers import REPO, launch_free_env
from tandem.cli.save_config import saved_text

SCRIPT = Path(__file__).parent / "scripts" / "cli_train.py"
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def run_cli(*args: str, cwd: Path, timeout: float = 60, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env or launch_free_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"),
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stderr


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=False)["state_dict"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run A: two config files and overrides; run B: A's saved config.yaml."""
    root = tmp_path_factory.mktemp("cli_runs")
    (root / "base.yaml").write_text(
        "trainer:\n  max_epochs: 5\n  accelerator: cpu\n  limit_train_batches: 4\n"
        "model:\n  hidden: 12\n  dropout: 0.2\ndata:\n  samples: ${model.hidden}\n"
    )
    (root / "more.yaml").write_text("trainer:\n  max_epochs: 4\nmodel:\n  lr: 0.3\n")
    run_cli(
        "fit", "-c", "base.yaml", "--config=more.yaml", "--trainer.max_epochs", "2", "model.lr=0.05", *QUIET, cwd=root
    )
    saved = root / "tandem_logs" / "version_0" / "config.yaml"
    run_cli("fit", "--config", str(saved), cwd=root)
    return root


@pytest.mark.timeout(120)
def test_fit_from_configs_and_overrides_builds_the_expected_run(runs: Path) -> None:
    run = runs / "tandem_logs" / "version_0"
    hparams = yaml.safe_load((run / "hparams.yaml").read_text())
    assert hparams == {"hidden": 12, "lr": 0.05, "dropout": 0.2}  # base < more.yaml < model.lr=0.05
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["trainer"]["max_epochs"] == 2 and config["trainer"]["limit_train_batches"] == 4
    assert config["data"] == {"samples": 12, "batch_size": 16}  # ${model.hidden}, resolved
    assert isinstance(config["seed_everything"], int)  # true became the seed the run used
    assert config["ckpt_path"] is None
    checkpoint = torch.load(run / "checkpoints" / "epoch=1-step=2.ckpt", weights_only=False)  # Lightning's default
    assert checkpoint["epoch"] == 1 and checkpoint["global_step"] == 2  # 12 samples / 16 = 1 batch, 2 epochs


@pytest.mark.timeout(120)
def test_saved_config_reproduces_the_run_bit_for_bit(runs: Path) -> None:
    first, again = (runs / "tandem_logs" / f"version_{v}" for v in (0, 1))
    assert (again / "config.yaml").read_text() == (first / "config.yaml").read_text()
    name = "epoch=1-step=2.ckpt"  # the default ModelCheckpoint's, as Lightning's
    a, b = weights(first / "checkpoints" / name), weights(again / "checkpoints" / name)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.timeout(120)
def test_ddp_run_through_the_cli_parses_the_same_command_on_every_rank(tmp_path: Path) -> None:
    env = launch_free_env(PYTHONUNBUFFERED="1", CLI_TEST_OUT=str(tmp_path))
    args = ["fit", "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
    run_cli(*args, "--trainer.max_epochs", "2", "data.samples=64", *QUIET, cwd=tmp_path, timeout=100, env=env)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    assert ranks[0]["config"] == ranks[1]["config"]  # seed_everything: true -> rank 0's seed on both
    assert ranks[0]["weights"] == ranks[1]["weights"] and ranks[0]["global_step"] == 4  # 64 / 2 ranks / 16, 2 epochs
    saved = list(tmp_path.glob("tandem_logs/*/config.yaml"))
    assert [p.parent.name for p in saved] == ["version_0"]  # written once, by rank 0
    assert saved[0].read_text() == saved_text(ranks[0]["config"])


@pytest.mark.timeout(60)
def test_help_of_the_example_lists_the_module_arguments_with_types_and_defaults(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "digits_cli.py"), "fit", "--help"],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=tmp_path,
        env=launch_free_env(OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())  # the help text wraps
    assert "--model.lr FLOAT" in out and "(type: float, default: 0.001)" in out
    assert "--model.dropout FLOAT" in out and "(type: float, default: 0.25)" in out
    assert "--data.batch_size INT" in out and "(type: int, default: 64)" in out
    assert "--trainer.max_epochs VALUE" in out and "(type: int | None, default: null)" in out
    assert "--ckpt_path" in out and "--print_config" in out and "--config" in out
