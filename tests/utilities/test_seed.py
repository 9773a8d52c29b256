from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from tandem import seed_everything
from tandem.utilities.seed import capture_rng_state, pl_worker_init_function, reset_seed, restore_rng_state

pytestmark = pytest.mark.timeout(30)


def test_seed_everything_seeds_every_source_and_rejects_bad_seeds():
    seed_everything(7)
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    seed_everything(7)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first
    with pytest.raises(ValueError, match="expected an integer"):
        seed_everything(-1)


def test_capture_and_restore_rng_state():
    state = capture_rng_state()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_rng_state_loads_with_weights_only_and_old_numpy_tuples_still_restore(tmp_path):
    seed_everything(3)
    np.random.randn()  # numpy now holds a cached gaussian
    torch.save(capture_rng_state(), tmp_path / "rng.pt")
    first = (random.random(), np.random.rand(), np.random.randn(), torch.rand(1).item())
    restore_rng_state(torch.load(tmp_path / "rng.pt"))  # torch's default weights_only=True reads it
    assert (random.random(), np.random.rand(), np.random.randn(), torch.rand(1).item()) == first

    seed_everything(4)
    np.random.randn()  # leaves a cached gaussian in numpy's state
    old = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}  # tandem 0.1
    expected = (random.random(), np.random.randn(), torch.rand(1).item())
    restore_rng_state(old)
    assert (random.random(), np.random.randn(), torch.rand(1).item()) == expected


@pytest.mark.parametrize("bit_generator", [np.random.PCG64, np.random.Philox, np.random.SFC64])
def test_rng_state_of_another_numpy_bit_generator_saves_and_restores(tmp_path, bit_generator):
    default = np.random.get_bit_generator()
    np.random.set_bit_generator(bit_generator(5))  # numpy's global state on another generator than MT19937
    try:
        np.random.randn()  # a cached gaussian
        torch.save(capture_rng_state(), tmp_path / "rng.pt")
        first = np.random.rand(3).tolist(), np.random.randn()
        restore_rng_state(torch.load(tmp_path / "rng.pt"))  # weights_only=True reads it
        assert (np.random.rand(3).tolist(), np.random.randn()) == first
    finally:
        np.random.set_bit_generator(default)


def test_reset_seed_seeds_again_with_seed_everythings_seed_and_does_nothing_without_it(monkeypatch):
    """What a strategy of several processes does as each run sets up (Lightning's reset_seed under DDP): every rank
    starts the run's draws (dropout, the loaders' seeds) from the seed_everything state."""
    seed_everything(42)
    fresh = (random.random(), np.random.rand(), torch.rand(3))
    torch.rand(5), random.random(), np.random.rand()  # the module's initialisation, say
    reset_seed()
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert fresh[:2] == again[:2] and torch.equal(fresh[2], again[2])
    monkeypatch.delenv("TANDEM_GLOBAL_SEED")
    monkeypatch.delenv("PL_GLOBAL_SEED")  # Lightning's name, read when tandem's is absent
    before = torch.get_rng_state()
    reset_seed()
    assert torch.equal(torch.get_rng_state(), before)


def test_seed_everything_exports_lightnings_variables_and_reads_them_back(monkeypatch):
    """Lightning's names are set beside tandem's (a launcher or program written for Lightning reads them), and a
    seed only Lightning's variable holds is the one used."""
    for name in ("TANDEM_GLOBAL_SEED", "TANDEM_SEED_WORKERS", "PL_GLOBAL_SEED", "PL_SEED_WORKERS"):
        monkeypatch.delenv(name, raising=False)
    seed_everything(5, workers=True)
    assert os.environ["PL_GLOBAL_SEED"] == os.environ["TANDEM_GLOBAL_SEED"] == "5"
    assert os.environ["PL_SEED_WORKERS"] == os.environ["TANDEM_SEED_WORKERS"] == "1"
    seed_everything(6)
    assert os.environ["PL_SEED_WORKERS"] == "0"
    monkeypatch.delenv("TANDEM_GLOBAL_SEED")
    monkeypatch.setenv("PL_GLOBAL_SEED", "9")
    assert seed_everything() == 9


# Lightning 2.6.6's lightning.fabric.utilities.seed.pl_worker_init_function, run on the same torch: after
# torch.manual_seed(base + worker_id), (torch.initial_seed(), random.random(), numpy.random.rand()) in the worker.
_LIGHTNING_WORKER_SEEDS = {
    (1234, 1, 0): (18247304121853680413, 0.643804146946211, 0.6726819280425754),
    (99, 2, 1): (9318127681261004462, 0.27270426159327643, 0.2575261139770434),
}


@pytest.mark.parametrize(("base", "worker_id", "rank"), list(_LIGHTNING_WORKER_SEEDS))
def test_pl_worker_init_function_seeds_a_worker_as_lightnings(base, worker_id, rank):
    torch.manual_seed(base + worker_id)  # what a DataLoader worker starts with
    pl_worker_init_function(worker_id, rank=rank)
    assert (torch.initial_seed(), random.random(), float(np.random.rand())) == _LIGHTNING_WORKER_SEEDS[
        base, worker_id, rank
    ]
