"""Tuner.scale_batch_size: the largest batch size that trains, found with a module that runs out of memory (a
simulated device) above a size, and a search that leaves no trace."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import tandem
from helpers import Regression, quiet_trainer, regression_data
from tandem.tuner import Tuner
from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.memory import is_oom_error


def _sizes(tried: list[int]) -> list[int]:
    """The batch sizes of the trials, in order (a trial's steps see the same size)."""
    return [size for i, size in enumerate(tried) if i == 0 or tried[i - 1] != size]


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize(
    ("mode", "oom", "expected", "tried"),
    [
        ("power", "torch", 32, [2, 4, 8, 16, 32, 64]),
        ("binsearch", "message", 40, [2, 4, 8, 16, 32, 64, 48, 40, 44, 42, 41]),
    ],
)
def test_finds_the_largest_size_that_fits_and_sets_it(tmp_path, mode, oom, expected, tried):
    torch.manual_seed(0)
    model = Regression(batch_size=7, fits_up_to=40, oom=oom)
    before = _weights(model)
    trainer = quiet_trainer(max_epochs=1, default_root_dir=tmp_path)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = Tuner(trainer).scale_batch_size(model, mode=mode, steps_per_trial=2)

    assert found == expected and model.hparams.batch_size == expected
    # a trial is not a resume: nothing about another data layout reaches the user (it printed one line a trial)
    assert not [w for w in caught if "global batch" in str(w.message) or "data layout" in str(w.message)]
    assert _sizes(model.tried) == tried  # each size once (2 steps each), in this order
    assert all(torch.equal(a, before[k]) for k, a in _weights(model).items())
    assert trainer.global_step == 0 and trainer.current_epoch == 0
    assert list(Path(tmp_path).glob(".trial-*")) == []
    # the fit that follows trains with the size found, from the weights as they were
    model.tried.clear()
    trainer.fit(model)
    assert set(model.tried[:-1]) == {expected} and trainer.global_step == -(-1024 // expected)


def test_the_search_stops_at_the_dataset_size_and_halves_from_a_first_size_too_large(tmp_path):
    trainer = quiet_trainer(max_epochs=1, default_root_dir=tmp_path)
    assert Tuner(trainer).scale_batch_size(Regression(n=64), init_val=8) == 64  # 8, 16, 32, 64 = the whole set
    model = Regression(fits_up_to=20)
    assert Tuner(trainer).scale_batch_size(model, init_val=64) == 16
    assert _sizes(model.tried) == [64, 32, 16, 32]
    model = Regression(fits_up_to=20)
    assert Tuner(trainer).scale_batch_size(model, init_val=64, mode="binsearch") == 20
    assert _sizes(model.tried) == [64, 32, 16, 24, 20, 22, 21]


def test_max_trials_bounds_the_sizes_tried(tmp_path):
    model = Regression()
    assert Tuner(quiet_trainer(default_root_dir=tmp_path)).scale_batch_size(model, max_trials=3) == 8
    assert _sizes(model.tried) == [2, 4, 8]


class _Data(tandem.DataModule):
    def __init__(self):
        super().__init__()
        self.batch_size = 4

    def train_dataloader(self):
        return DataLoader(regression_data(256), batch_size=self.batch_size)


class _Fixed(Regression):
    """Reads no batch size: its DataModule does."""

    def __init__(self):
        super().__init__(fits_up_to=100)
        del self.hparams["batch_size"]


def test_a_datamodule_batch_size_is_searched_and_set(tmp_path):
    data = _Data()
    trainer = quiet_trainer(max_epochs=1, default_root_dir=tmp_path)
    assert Tuner(trainer).scale_batch_size(_Fixed(), datamodule=data) == 64
    assert data.batch_size == 64


class _Broken(Regression):
    def training_step(self, batch, batch_idx):
        raise RuntimeError("a bug, not memory")


def test_other_errors_end_the_search_and_the_state_still_comes_back(tmp_path):
    model = _Broken()
    before = _weights(model)
    trainer = quiet_trainer(default_root_dir=tmp_path)
    with pytest.raises(RuntimeError, match="a bug, not memory"):
        Tuner(trainer).scale_batch_size(model)
    assert all(torch.equal(a, before[k]) for k, a in _weights(model).items())
    assert list(Path(tmp_path).glob(".trial-*")) == [] and trainer.callbacks == []


def test_the_search_refuses_what_it_cannot_do(tmp_path):
    trainer = quiet_trainer(default_root_dir=tmp_path)
    with pytest.raises(TandemConfigError, match="even batch size 1 ran out of memory"):
        Tuner(trainer).scale_batch_size(Regression(fits_up_to=0))
    with pytest.raises(TandemConfigError, match="dataloaders passed to fit\\(\\) directly"):
        Tuner(trainer).scale_batch_size(Regression(), DataLoader(regression_data(64), batch_size=4))
    with pytest.raises(TandemConfigError, match="'per_device'"):
        Tuner(trainer).scale_batch_size(Regression(), batch_arg_name="per_device")
    with pytest.raises(TandemConfigError, match="method='test'\\) is not supported"):
        Tuner(trainer).scale_batch_size(Regression(), method="test")
    with pytest.raises(TandemConfigError, match="with 2 processes"):
        Tuner(quiet_trainer(strategy="ddp", devices=2)).scale_batch_size(Regression())


def test_is_oom_error_knows_the_allocators_messages():
    assert is_oom_error(torch.OutOfMemoryError("anything"))
    assert is_oom_error(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom_error(RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried"))
    assert is_oom_error(RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if"))
    assert not is_oom_error(RuntimeError("shape mismatch"))
    assert not is_oom_error(ValueError("CUDA out of memory"))
