"""MLflow and W&B under two gloo ranks: one run each, made by rank 0, whose id every rank agrees on."""

import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import launch_free_env

pytest.importorskip("mlflow")
pytest.importorskip("wandb")
from mlflow.tracking import MlflowClient  # noqa: E402
from wandb_records import history, run_records  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "ddp_loggers.py"


def test_only_rank_zero_makes_and_writes_the_runs_and_every_rank_agrees_on_them(tmp_path, monkeypatch):
    env = launch_free_env(
        PYTHONUNBUFFERED="1",
        MLFLOW_ALLOW_FILE_STORE="true",
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_CONSOLE="off",
        WANDB_DISABLE_GIT="true",
        WANDB_DISABLE_CODE="true",
        WANDB_DATA_DIR=str(tmp_path / "wandb-data"),
        WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
        WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("WANDB_PROJECT", None)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=100, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(f"file:{tmp_path / 'mlruns'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "ddp"]
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert ranks[0]["mlflow"] == ranks[1]["mlflow"] == run.info.run_id
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == [0, 1, 2, 3]
    logged = sorted(a.path for a in client.list_artifacts(run.info.run_id))
    assert logged == ["epoch=0-step=2", "epoch=1-step=4"] == [Path(c).stem for c in ranks[0]["checkpoints"]]
    # the checkpoints of both ranks' ModelCheckpoint are in rank 0's run folder
    assert ranks[0]["dirpath"] == ranks[1]["dirpath"] == str(Path(ranks[0]["log_dir"]) / "checkpoints")
    assert ranks[0]["log_dir"] == str(tmp_path / "mlruns" / experiment.experiment_id / run.info.run_id)

    assert len(glob.glob(str(tmp_path / "wandb" / "offline-run-*"))) == 1  # no run made by rank 1
    records = run_records(tmp_path)
    assert ranks[0]["wandb"] == ranks[1]["wandb"] == records["run"][0].run.run_id
    steps = [row["trainer/global_step"] for row in history(records) if "train_loss" in row]
    assert steps == [0, 1, 2, 3]  # Lightning's steps: the batches stepped before each
    assert len(records["artifact"]) == 2
