from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, TensorDataset

from helpers import launch_free_env
from tandem.utilities.data import (
    end_workers_with_process,
    extract_batch_size,
    find_sampler,
    in_order,
    make_skippable,
    rebuild_dataloader,
    seed_workers,
)
from tandem.utilities.seed import pl_worker_init_function

pytestmark = pytest.mark.timeout(30)


def _loader(**kwargs):
    return DataLoader(TensorDataset(torch.arange(10.0)), **kwargs)


def test_skippable_loader_gives_the_same_order_as_the_plain_loader_and_can_skip():
    plain = _loader(batch_size=3, shuffle=True)
    wrapped, skippable = make_skippable(plain)
    torch.manual_seed(5)
    expected = [b[0].tolist() for b in plain]
    torch.manual_seed(5)
    assert [b[0].tolist() for b in wrapped] == expected
    torch.manual_seed(5)
    skippable.skip = 2
    assert [b[0].tolist() for b in wrapped] == expected[2:]
    assert len(wrapped) == 4 and isinstance(find_sampler(wrapped), RandomSampler)


def test_rebuild_keeps_loader_settings_and_refuses_custom_subclasses():
    base = _loader(batch_size=4, drop_last=True, collate_fn=lambda b: b)
    rebuilt = rebuild_dataloader(base, sampler=list(range(10))[::-1])
    assert rebuilt.batch_size == 4 and rebuilt.drop_last and rebuilt.collate_fn is base.collate_fn

    class Custom(DataLoader):
        def __init__(self, dataset, extra):
            super().__init__(dataset)

    with pytest.raises(TypeError, match="cannot rebuild it safely"):
        rebuild_dataloader(Custom(TensorDataset(torch.arange(3.0)), 1), sampler=[0])


def test_a_loader_given_a_batch_sampler_is_rebuilt_with_its_batch_size_and_drop_last():
    dataset = TensorDataset(torch.arange(10.0))
    given = DataLoader(dataset, batch_sampler=BatchSampler(SequentialSampler(dataset), 4, drop_last=True))
    assert (given.batch_size, given.drop_last) == (None, False)  # torch's: the BatchSampler holds them
    rebuilt = rebuild_dataloader(given, sampler=list(range(10))[::-1])
    assert [b.tolist() for (b,) in rebuilt] == [[9.0, 8.0, 7.0, 6.0], [5.0, 4.0, 3.0, 2.0]]

    custom = DataLoader(dataset, batch_sampler=type("MyBatches", (BatchSampler,), {})(range(10), 4, False))
    with pytest.raises(TypeError, match="pass batch_sampler=... instead"):
        rebuild_dataloader(custom, sampler=list(range(10)))


def test_overfit_order_reads_the_sampler_of_a_given_batch_sampler():
    dataset = TensorDataset(torch.arange(10.0))
    shuffled = DataLoader(dataset, batch_sampler=BatchSampler(RandomSampler(dataset), 4, drop_last=False))
    with pytest.warns(UserWarning, match="overfit_batches"):
        ordered = in_order(shuffled, "training batches")
    assert [b.tolist() for (b,) in ordered] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0], [8.0, 9.0]]
    custom = DataLoader(dataset, batch_sampler=type("MyBatches", (BatchSampler,), {})(RandomSampler(dataset), 4, False))
    assert in_order(custom, "training batches") is custom  # a batch sampler of the user's draws its own order


def test_extract_batch_size_from_collections():
    assert extract_batch_size({"x": torch.zeros(5, 2), "meta": "a"}) == 5
    assert extract_batch_size([["a"], (torch.zeros(3),)]) == 3
    assert extract_batch_size(torch.tensor(1.0)) == 1


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie is not running
    except FileNotFoundError:
        return True


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_dataloader_workers_end_within_a_second_of_a_killed_process(tmp_path):
    """A fitting process (2 DataLoader workers, the user's worker_init_fn still called) killed with SIGKILL:
    its workers are gone within a second (torch's own check of the parent takes up to 5 s)."""
    script = Path(__file__).parents[1] / "trainer" / "scripts" / "preempt_run.py"
    env = {**launch_free_env(), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(script), "workers", str(tmp_path), "1"], env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 25
        while len(list(tmp_path.glob("worker-*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [int(p.read_text()) for p in tmp_path.glob("worker-*.pid")]
        assert len(pids) == 2 and not any(_gone(p) for p in pids)
    finally:
        proc.kill()
        proc.wait()
    killed = time.monotonic()
    while not all(_gone(p) for p in pids) and time.monotonic() - killed < 1.0:
        time.sleep(0.02)
    assert all(_gone(p) for p in pids), f"workers {pids} outlived their process"


def test_worker_init_is_wrapped_once_and_keeps_the_users_function():
    def mine(worker_id):
        return None

    loader = _loader(num_workers=2, worker_init_fn=mine)
    end_workers_with_process(loader)
    end_workers_with_process(loader)
    assert loader.worker_init_fn.inner is mine and loader.worker_init_fn.parent == os.getpid()
    plain = _loader()
    end_workers_with_process(plain)
    assert plain.worker_init_fn is None  # no workers, nothing to do


def test_a_rebuilt_loader_keeps_its_workers_ending_with_the_process_and_seeded(monkeypatch):
    import tandem.utilities.data as data

    monkeypatch.setattr(data, "seed_workers_requested", lambda: True)  # seed_everything(workers=True)
    loader = _loader(num_workers=2)
    end_workers_with_process(loader)
    rebuilt = rebuild_dataloader(loader, sampler=RandomSampler(loader.dataset))
    assert isinstance(rebuilt.worker_init_fn, type(loader.worker_init_fn))
    assert rebuilt.worker_init_fn is not loader.worker_init_fn
    seed_workers(rebuilt, rank=1)
    assert rebuilt.worker_init_fn.inner.func is data.pl_worker_init_function
    assert rebuilt.worker_init_fn.inner.keywords == {"rank": 1}


def test_seed_everything_workers_gives_loaders_lightnings_worker_init_fn_and_leaves_the_users(monkeypatch):
    """Lightning's _auto_add_worker_init_fn: after seed_everything(workers=True) every loader the Trainer runs that
    has no worker_init_fn of its own gets pl_worker_init_function (with or without workers); workers=False, or a
    function of the user's, is left as it is."""
    from tandem.utilities.seed import seed_everything

    for name in ("TANDEM_GLOBAL_SEED", "TANDEM_SEED_WORKERS", "PL_GLOBAL_SEED", "PL_SEED_WORKERS"):
        monkeypatch.delenv(name, raising=False)
    loader = _loader()
    seed_workers(loader, rank=0)
    assert loader.worker_init_fn is None
    seed_everything(0, workers=False)
    seed_workers(loader, rank=0)
    assert loader.worker_init_fn is None
    seed_everything(0, workers=True)
    assert os.environ["PL_SEED_WORKERS"] == os.environ["TANDEM_SEED_WORKERS"] == "1"
    mine = _loader(worker_init_fn=print)
    seed_workers(mine, rank=0)
    assert mine.worker_init_fn is print
    seed_workers(loader, rank=0)
    assert loader.worker_init_fn.func is pl_worker_init_function and loader.worker_init_fn.keywords == {"rank": 0}
