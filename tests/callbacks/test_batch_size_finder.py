"""BatchSizeFinder: the batch size search at fit start, then the fit with the size found."""

from __future__ import annotations

import pytest
import torch

from helpers import Regression, quiet_trainer
from tandem.callbacks import BatchSizeFinder
from tandem.utilities.exceptions import TandemConfigError


def test_the_search_runs_at_fit_start_and_the_fit_trains_with_the_size_found(tmp_path):
    torch.manual_seed(0)
    model = Regression(batch_size=3, fits_up_to=100)
    finder = BatchSizeFinder(mode="binsearch", steps_per_trial=1)
    trainer = quiet_trainer(max_epochs=1, callbacks=[finder], default_root_dir=tmp_path)
    trainer.fit(model)
    assert finder.optimal_batch_size == 100 and model.hparams.batch_size == 100
    assert trainer.global_step == 11  # ceil(1024 / 100): the search's steps are not counted
    fit_sizes = model.tried[-11:]
    assert fit_sizes == [100] * 10 + [24]


def test_the_finder_checks_its_arguments_and_the_module():
    with pytest.raises(TandemConfigError, match="mode='double'"):
        BatchSizeFinder(mode="double")
    with pytest.raises(TandemConfigError, match="steps_per_trial=0"):
        BatchSizeFinder(steps_per_trial=0)
    trainer = quiet_trainer(callbacks=[BatchSizeFinder(batch_arg_name="bs")])
    with pytest.raises(TandemConfigError, match="batch_arg_name='bs'"):
        trainer.fit(Regression())
    with pytest.raises(TandemConfigError, match="with 2 processes"):
        BatchSizeFinder().setup(quiet_trainer(strategy="ddp", devices=2), Regression(), "fit")


class _Both(Regression):
    def __init__(self):
        super().__init__()
        self.batch_size = 8


def test_an_attribute_and_an_hparam_of_one_name_get_lightnings_warning():
    with pytest.warns(UserWarning, match="mutually exclusive"):
        BatchSizeFinder().setup(quiet_trainer(), _Both(), "fit")
