"""The fit loop's reading of the training batches: when each batch is read relative to ``training_step`` is
Lightning's, so a dataset whose items depend on the training state (reinforcement learning collecting episodes with
the current policy in an IterableDataset) yields the same sequence under both."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import launch_free_env

SCRIPT = Path(__file__).parent / "scripts" / "lookahead_program.py"

# The items training_step saw under Lightning 2.6.6 (torch 2.13.0 CPU), per setting (see the script): each is
# (10 * rank + index in the epoch, steps run when the dataset produced it). Recorded with
#   cd /tmp && python tests/trainer/scripts/lookahead_program.py lightning      # one process
#   cd /tmp && OMP_NUM_THREADS=1 python tests/trainer/scripts/lookahead_program.py lightning 2   # ddp, 2 ranks
# (python: a venv with lightning==2.6.6). Unknown length: batch i + 1 is read before the step on batch i (so
# items 0 and 1 both come before the first step); a limit_train_batches count makes the length known and nothing
# is read ahead. Under ddp each rank reads as one process does.
ONE_AHEAD = [[0, 0], [1, 0], [2, 1], [3, 2], [4, 3], [0, 5], [1, 5], [2, 6], [3, 7], [4, 8]]
NONE_AHEAD = [[0, 0], [1, 1], [2, 2], [3, 3], [0, 4], [1, 5], [2, 6], [3, 7]]
LIGHTNING = {"unknown_length": ONE_AHEAD, "limit_train_batches": NONE_AHEAD, "accumulate": ONE_AHEAD}


def _on_rank(rank: int, seen: list[list[int]]) -> list[list[int]]:
    return [[10 * rank + i, steps] for i, steps in seen]


def _program():
    spec = importlib.util.spec_from_file_location("lookahead_program", SCRIPT)
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    return program


def test_training_batches_are_read_when_lightning_reads_them():
    assert _program().run("tandem") == LIGHTNING


@pytest.mark.timeout(240)
def test_under_ddp_each_rank_reads_as_lightnings_ranks(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "tandem", "2", str(tmp_path / "seen")],
        capture_output=True,
        text=True,
        timeout=200,
        env=launch_free_env(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    got = {k: v for rank in (0, 1) for k, v in json.loads((tmp_path / f"seen.rank{rank}.json").read_text()).items()}
    want = {f"rank{rank}/{name}": _on_rank(rank, seen) for rank in (0, 1) for name, seen in LIGHTNING.items()}
    assert got == want
