import pytest
import torch

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
    """``pytest -n N`` hands out whole files (``--dist loadfile``) unless ``--dist`` says otherwise: a module's shared
    launch (a module-scoped fixture) then runs once, not once on every worker that got one of its tests."""
    if config.getoption("dist") == "load":
        from xdist.scheduler import LoadFileScheduling

        return LoadFileScheduling(config, log)
    return None


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (GPU tests run on a machine with a GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
