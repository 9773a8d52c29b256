import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# The suite runs more processes than cores (xdist workers, each launching ranks): an idle OpenMP thread of a
# launched process sleeps instead of spinning, or it burns a core another test is waiting for (3 epochs of the digits
# example on a loaded host: 9.6 s of CPU spinning, 6.0 s sleeping). Thread counts, and so every result, are unchanged.
# Set before torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import tandem  # noqa: E402
from helpers import launch_free_env, shared_folder  # noqa: E402
from tandem.utilities.rank_zero import rank_zero_only  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _rank_zero_and_cwd(tmp_path, monkeypatch):
    """Each test runs in its own folder (default_root_dir is the cwd) as rank 0."""
    monkeypatch.chdir(tmp_path)
    rank_zero_only.rank = 0
    yield
    rank_zero_only.rank = 0


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``pytest -n N`` hands out tests one by one, except the modules that share a launch among their tests (a
    module-scoped fixture): each of those goes whole to one worker, so its launch runs once, not once on every worker
    that got one of its tests. An explicit ``--dist`` other than the default ``load`` is kept. (xdist's own
    ``loadgroup`` cannot do this under pytest 9: it renames node ids through an attribute pytest no longer reads.)"""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    tests = Path(__file__).parent
    shared = {
        path.relative_to(config.rootpath).as_posix()
        for path in tests.rglob("test_*.py")
        if 'scope="module"' in path.read_text(encoding="utf-8")
    }

    class WholeModulesThatShareALaunch(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path in shared else nodeid

    return WholeModulesThatShareALaunch(config, log)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (GPU tests run on a machine with a GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# ---------------------------------------------------------------------------------------------- the DDP Trainer launch
# ``strategies/scripts/ddp_trainer_runs.py`` plays every scenario on two gloo ranks; ``strategies/test_ddp_trainer.py``,
# ``test_ddp_follow.py``, ``test_existing_group.py`` and ``callbacks/test_model_checkpoint.py`` read its files. A
# launch costs its ranks' interpreters, imports and process group (about 7 CPU-seconds), so a new DDP program of these
# tests is one more scenario there rather than a launch of its own (a test of a crash, a hang or a way to start the
# ranks owns its job). The trainer tests share ``trainer/conftest.py``'s ``core_ddp`` the same way.
STRATEGY_SCRIPTS = Path(__file__).parent / "strategies" / "scripts"
DDP_TRAINER_SCENARIOS = (
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
    "dirpath",
    "mismatch",
)  # mismatch ends the job
ELASTIC_ORDERS = ("sampler", "global")


def _elastic_one_process(out: Path) -> dict[str, dict[str, torch.Tensor]]:
    """In each data order: one process x batch 8, shuffled, 2 epochs, saving ``elastic-one-<order>.ckpt`` mid-epoch
    1: its final weights."""
    sys.path.insert(0, str(STRATEGY_SCRIPTS))
    try:
        from ddp_trainer_common import ELASTIC_STEP, TRAIN_SAMPLES, Net, SaveAtStep, dataset, elastic_trainer, weights
    finally:
        sys.path.remove(str(STRATEGY_SCRIPTS))
    seed = os.environ.get("TANDEM_GLOBAL_SEED")
    finals = {}
    for order in ELASTIC_ORDERS:
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


def _launch_ddp_trainer(out: Path) -> None:
    """The elastic scenario's 1 -> 2 checkpoint first (and its run's weights), then the launch."""
    torch.save(_elastic_one_process(out), out / "elastic_one_process.pt")
    env = launch_free_env()  # tandem picks the threads
    done = subprocess.run(
        [
            sys.executable,
            str(STRATEGY_SCRIPTS / "ddp_trainer_runs.py"),
            *DDP_TRAINER_SCENARIOS,
            "--out",
            str(out),
            "--hang-after",
            "90",
        ],
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
    out = shared_folder(tmp_path_factory, "ddp_trainer", _launch_ddp_trainer)
    results: dict[str, Any] = {
        "out": out,
        "output": (out / "output.txt").read_text(),
        "elastic_one_process": torch.load(out / "elastic_one_process.pt", weights_only=False),
    }
    for name in DDP_TRAINER_SCENARIOS:
        results[name] = [torch.load(out / f"{name}-rank{r}.pt", weights_only=False) for r in (0, 1)]
    return results
