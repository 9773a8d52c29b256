from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tandem import seed_everything
from tandem.utilities.seed import capture_rng_state, restore_rng_state

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
