"""A Hydra app under strategy="ddp": the started ranks join the parent's Hydra job (one run folder; under -m, one
job per sweep value, not a sweep per rank). Skipped without hydra-core (``make test`` installs it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers import launch_free_env, run_python

pytest.importorskip("hydra")
pytestmark = pytest.mark.timeout(120)

APP = Path(__file__).parent / "scripts" / "hydra_app.py"
# A run folder named to the microsecond: a rank that resolved its own would get a folder of its own.
RUN_DIR = "hydra.run.dir=outputs/${now:%H-%M-%S-%f}"


def _ranks(folder: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in folder.glob("rank*.json")), key=lambda r: r["rank"])


def test_the_ranks_of_a_hydra_run_share_its_run_folder(tmp_path):
    done = run_python([str(APP), RUN_DIR], timeout=100, cwd=tmp_path, env=launch_free_env())
    assert done.returncode == 0, done.stderr[-3000:]
    folders = list((tmp_path / "outputs").iterdir())
    assert len(folders) == 1, folders  # one run folder for the job, not one per rank
    assert [r["rank"] for r in _ranks(folders[0])] == [0, 1]
    assert (folders[0] / ".hydra" / "config.yaml").is_file()  # written once, by rank 0
    assert {p.name for p in folders[0].glob("*.log")} <= {"hydra_app.log", "hydra_app_rank1.log"}


def test_a_hydra_sweep_runs_each_job_once_on_both_ranks(tmp_path):
    sweep_dir = "hydra.sweep.dir=multirun/${now:%H-%M-%S-%f}"  # a rank that swept again would get its own
    done = run_python([str(APP), "-m", "lr=0.1,0.2", sweep_dir], timeout=110, cwd=tmp_path, env=launch_free_env())
    assert done.returncode == 0, done.stderr[-3000:]
    sweeps = list((tmp_path / "multirun").iterdir())
    assert len(sweeps) == 1, sweeps  # the parent's sweep only
    jobs = sorted(p for p in sweeps[0].iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"], jobs  # two jobs, not a sweep started again by each rank
    assert [[(r["rank"], r["lr"]) for r in _ranks(job)] for job in jobs] == [[(0, 0.1), (1, 0.1)], [(0, 0.2), (1, 0.2)]]
    assert not (tmp_path / "outputs").exists()  # no rank ran a job of its own


def test_hydra_is_not_imported_by_tandem():
    done = run_python(["-c", "import sys, tandem; tandem.Trainer(); print('hydra' in sys.modules)"])
    assert done.stdout.strip().splitlines()[-1] == "False"
    assert sys.modules.get("hydra") is not None  # this test process has it (importorskip above)
