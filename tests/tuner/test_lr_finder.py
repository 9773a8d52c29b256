"""Tuner.lr_find: the learning-rate range test, its suggestion and plot, and a search that leaves no trace."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

import tandem
from helpers import Regression, quiet_trainer
from tandem.callbacks import LearningRateFinder
from tandem.loggers import CSVLogger
from tandem.tuner import LRFinder, Tuner
from tandem.utilities.exceptions import TandemConfigError


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_lr_find_suggests_a_sane_rate_sets_it_and_leaves_the_state_as_it_was(tmp_path):
    torch.manual_seed(0)
    model = Regression(lr=0.01)
    before = _weights(model)
    trainer = quiet_trainer(max_epochs=1, default_root_dir=tmp_path)
    rng = torch.get_rng_state()

    finder = Tuner(trainer).lr_find(model, num_training=100)

    lrs, losses = finder.results["lr"], finder.results["loss"]
    assert len(lrs) == len(losses) and 20 < len(lrs) <= 100  # 16 batches an epoch: the search crosses epochs
    assert lrs[0] == 1e-8 and all(b > a for a, b in zip(lrs, lrs[1:]))
    suggestion = finder.suggestion()
    assert 1e-3 < suggestion < 1.0  # SGD on this regression: loss falls fastest between 0.01 and 0.5
    assert model.hparams.lr == suggestion  # update_attr=True
    # nothing the search trained stays: weights bitwise, counters, RNG, no temporary checkpoint
    assert _equal(_weights(model), before)
    assert trainer.global_step == 0 and trainer.current_epoch == 0
    assert torch.equal(torch.get_rng_state(), rng)
    assert trainer.state.status == "finished" and trainer.callbacks == []
    assert list(Path(tmp_path).glob(".trial-*")) == []


def test_fit_after_lr_find_is_the_fit_without_it(tmp_path):
    """Same seed, same module: a fit after a search (update_attr=False) ends bitwise where a plain fit ends, and the
    logger got nothing from the search."""
    runs = []
    for search in (False, True):
        torch.manual_seed(0)
        model = Regression(lr=0.05)
        logger = CSVLogger(tmp_path / str(search), name="run")
        trainer = quiet_trainer(max_epochs=2, logger=logger, log_every_n_steps=1, default_root_dir=tmp_path)
        if search:
            Tuner(trainer).lr_find(model, num_training=30, update_attr=False)
            assert model.hparams.lr == 0.05
        trainer.fit(model)
        rows = (Path(logger.log_dir) / "metrics.csv").read_text().splitlines()
        runs.append((_weights(model), trainer.global_step, rows))
    (plain, plain_steps, plain_rows), (searched, searched_steps, searched_rows) = runs
    assert plain_steps == searched_steps == 32
    assert _equal(plain, searched)
    assert searched_rows == plain_rows


def test_linear_mode_spaces_rates_evenly_and_a_diverging_loss_stops_the_search(tmp_path):
    torch.manual_seed(0)
    model = Regression()
    trainer = quiet_trainer(max_epochs=1, default_root_dir=tmp_path)
    finder = Tuner(trainer).lr_find(model, min_lr=0.01, max_lr=10.0, num_training=50, mode="linear", update_attr=False)
    lrs = finder.results["lr"]
    gaps = [b - a for a, b in zip(lrs, lrs[1:])]
    assert lrs[0] == 0.01 and all(math.isclose(g, 9.99 / 49) for g in gaps)
    assert len(lrs) < 50  # SGD at a few units diverges on this problem: stopped early
    assert not math.isfinite(finder.results["loss"][-1]) or finder.results["loss"][-1] > 4 * min(finder.results["loss"])
    # without a threshold the search runs every step, NaN or not, and no NaN check interrupts it
    finder = Tuner(trainer).lr_find(
        model, min_lr=0.01, max_lr=10.0, num_training=50, mode="linear", early_stop_threshold=None
    )
    assert len(finder.results["lr"]) == 50


def _finder(losses: list[float], mode: str = "exponential") -> LRFinder:
    finder = LRFinder(mode, 1e-4, 1.0, len(losses))
    finder.results = {"lr": finder.schedule(), "loss": losses}
    return finder


def test_suggestion_is_the_steepest_descent_past_the_skipped_ends():
    losses = [5.0] * 13 + [4.5, 2.0, 1.8, 1.7, 1.6, 1.6, 9.0]
    finder = _finder(losses)
    assert finder.suggestion() == finder.results["lr"][13]  # central difference (2.0 - 5.0) / 2: the steepest
    assert finder.suggestion(skip_end=0) == finder.results["lr"][13]  # skip_end=0 keeps every point
    assert finder.suggestion(skip_begin=14) == finder.results["lr"][14]
    # non-finite points are left out, and the index still names a rate of the original list
    losses[14] = math.nan
    finder = _finder(losses)
    assert finder.suggestion() in (finder.results["lr"][13], finder.results["lr"][15])
    assert finder.results["lr"][finder._optimal_idx] == finder.suggestion()
    with pytest.warns(UserWarning, match="too few points"):
        assert _finder([1.0] * 12).suggestion() is None


def test_exponential_suggestion_takes_the_slope_over_log_lr_not_the_noise_among_tiny_rates():
    # a wiggle among the first rates (closely spaced in lr) is steep over lr but not over log10(lr)
    losses = [3.0] * 40
    losses[11], losses[12] = 3.1, 2.9
    for k in range(25, 32):
        losses[k] = 3.0 - 0.3 * (k - 24)  # the real descent
    finder = _finder(losses)
    finder.suggestion()
    assert 24 <= finder._optimal_idx <= 31


def test_plot_draws_the_curve_and_marks_the_suggestion():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    finder = _finder([5.0] * 12 + [4.9, 4.0, 2.0, 1.5, 1.4, 1.3, 1.3, 9.0])
    fig = finder.plot(suggest=True)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "Learning rate"
    curve, marker = ax.get_lines()
    assert list(curve.get_xdata()) == finder.results["lr"]
    assert list(marker.get_xdata()) == [finder.suggestion()]


def test_plot_without_matplotlib_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        _finder([1.0] * 20).plot()


class _TwoOptimizers(Regression):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        return None

    def configure_optimizers(self):
        return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.1)]


class _NoLr(Regression):
    """Its learning rate is called ``step_size``."""

    def __init__(self):
        super().__init__()
        self.hparams["step_size"] = self.hparams.pop("lr")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.step_size)


def test_lr_find_refuses_what_it_cannot_search(tmp_path):
    trainer = quiet_trainer(max_epochs=1, default_root_dir=tmp_path)
    tuner = Tuner(trainer)
    with pytest.raises(TandemConfigError, match="neither of \\('lr', 'learning_rate'\\)"):
        tuner.lr_find(_NoLr(), num_training=5)
    finder = tuner.lr_find(_NoLr(), num_training=20, attr_name="step_size")  # a name of the user's
    with pytest.raises(TandemConfigError, match="attr_name='rate'"):
        tuner.lr_find(_NoLr(), num_training=5, attr_name="rate")
    assert finder is not None
    with pytest.raises(TandemConfigError, match="method='fit' is the only"):
        tuner.lr_find(Regression(), method="validate")
    with pytest.raises(TandemConfigError, match="mode='cosine'"):
        tuner.lr_find(Regression(), mode="cosine")
    with pytest.raises(TandemConfigError, match="already has a LearningRateFinder"):
        Tuner(quiet_trainer(callbacks=[LearningRateFinder()])).lr_find(Regression())
    with pytest.raises(TandemConfigError, match="with 2 optimizers"):
        tuner.lr_find(_TwoOptimizers(), num_training=5)
    with pytest.warns(UserWarning, match="fast_dev_run"):
        assert Tuner(quiet_trainer(fast_dev_run=True)).lr_find(Regression()) is None


def test_the_tuner_refuses_ddp_spawn_whose_result_would_not_come_back():
    trainer = quiet_trainer(strategy="ddp_spawn", devices=2)
    with pytest.raises(TandemConfigError, match="would not come back"):
        Tuner(trainer).lr_find(Regression())


def test_trial_outside_a_fit_says_where_to_call_it():
    with pytest.raises(TandemConfigError, match="runs inside a fit"), quiet_trainer().trial():
        pass
    assert tandem.Trainer.trial.__doc__
