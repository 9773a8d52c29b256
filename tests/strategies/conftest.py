"""The DDP launch that this folder's Trainer tests share: ``scripts/ddp_trainer_runs.py`` plays every scenario on two
gloo ranks; ``test_ddp_trainer.py``, ``test_ddp_follow.py`` and ``test_existing_group.py`` read its files. A launch costs its ranks' interpreters,
imports and process group (about 7 CPU-seconds), so a new DDP program of these tests is one more scenario there
rather than a launch of its own. (A test of a crash, a hang or a way to start the ranks owns its job.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import tandem
from helpers import launch_free_env, shared_folder

SCRIPTS = Path(__file__).parent / "scripts"
SCENARIOS = (
    "equivalence",
    "evaluation",
    "logging",
    "decisions",
    "resume",
    "elastic",
    "prediction_writer",
    "uneven",
    "true_half",
    "follow",
    "existing_group",
    "mismatch",
)  # mismatch ends the job
ORDERS = ("sampler", "global")


def _elastic_one_process(out: Path) -> dict[str, dict[str, torch.Tensor]]:
    """In each data order: one process x batch 8, shuffled, 2 epochs, saving ``elastic-one-<order>.ckpt`` mid-epoch
    1: its final weights."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        from ddp_trainer_common import ELASTIC_STEP, TRAIN_SAMPLES, Net, SaveAtStep, dataset, elastic_trainer, weights
    finally:
        sys.path.remove(str(SCRIPTS))
    seed = os.environ.get("TANDEM_GLOBAL_SEED")
    finals = {}
    for order in ORDERS:
        tandem.seed_everything(11)
        model = Net("adam", lr=0.01)
        saver = SaveAtStep(ELASTIC_STEP, str(out / f"elastic-one-{order}.ckpt"))
        trainer = elastic_trainer(callbacks=[saver], csv=out / f"elastic-csv-one-{order}", data_order=order)
        trainer.fit(model, DataLoader(dataset(TRAIN_SAMPLES), batch_size=8, shuffle=True))
        finals[order] = weights(model)
    os.environ.pop("TANDEM_GLOBAL_SEED")  # the launched ranks seed themselves
    if seed is not None:
        os.environ["TANDEM_GLOBAL_SEED"] = seed
    return finals


def _launch(out: Path) -> None:
    """The elastic scenario's 1 -> 2 checkpoint first (and its run's weights), then the launch."""
    torch.save(_elastic_one_process(out), out / "elastic_one_process.pt")
    env = launch_free_env()  # tandem picks the threads
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "ddp_trainer_runs.py"), *SCENARIOS, "--out", str(out), "--hang-after", "90"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PYTHONUNBUFFERED": "1"},
        cwd=out,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    (out / "output.txt").write_text(done.stdout + done.stderr)


@pytest.fixture(scope="session")
def ddp_trainer_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every scenario's per-rank results (``runs[name][rank]``), the job's captured output, its folder, and the
    one-process elastic run's weights. One launch per test run, shared by pytest-xdist's workers."""
    out = shared_folder(tmp_path_factory, "ddp_trainer", _launch)
    results: dict[str, Any] = {
        "out": out,
        "output": (out / "output.txt").read_text(),
        "elastic_one_process": torch.load(out / "elastic_one_process.pt", weights_only=False),
    }
    for name in SCENARIOS:
        results[name] = [torch.load(out / f"{name}-rank{r}.pt", weights_only=False) for r in (0, 1)]
    return results
