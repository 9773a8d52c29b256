import os
from pathlib import Path

# The suite runs more processes than cores (xdist workers, each launching ranks): an idle OpenMP thread of a
# launched process sleeps instead of spinning, or it burns a core another test is waiting for (3 epochs of the digits
# example on a loaded host: 9.6 s of CPU spinning, 6.0 s sleeping). Thread counts, and so every result, are unchanged.
# Set before torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

from tandem.utilities.rank_zero import rank_zero_only

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
