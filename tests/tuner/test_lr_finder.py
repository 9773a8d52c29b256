"""Tuner.lr_find: the learning-rate range test, its suggestion and plot, and a search that leaves no trace."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

import tandem
from helpers import Regression, quiet_trainer
from tandem.callbacks import LearningRateFinder
from tandem.loggers import CSVLogger
from tandem.tuner import LRFinder, Tuner
from tandem.utilities.exceptions import MisconfigurationException, PossibleUserWarning, TandemConfigError

SCRIPTS = Path(__file__).parent / "scripts"


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_lr_find_suggests_a_sane_rate_sets_it_and_leaves_the_state_as_it_was(tmp_path):
    torch.manual_seed(0)
    model = Regression(lr=0.01)
    before = _weights(model)
    trainer = quiet_trainer(max_epochs=10, default_root_dir=tmp_path)
    rng = torch.get_rng_state()

    finder = Tuner(trainer).lr_find(model, num_training=100)

    lrs, losses = finder.results["lr"], finder.results["loss"]
    assert len(lrs) == len(losses) and 20 < len(lrs) <= 100  # 16 batches an epoch: the search crosses epochs
    assert lrs[0] == 1e-8 and all(b > a for a, b in zip(lrs, lrs[1:]))
    suggestion = finder.suggestion()
    assert suggestion == lrs[finder._optimal_idx] and 10 <= finder._optimal_idx < len(lrs) - 1
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
    trainer = quiet_trainer(max_epochs=10, default_root_dir=tmp_path)
    finder = Tuner(trainer).lr_find(model, min_lr=0.01, max_lr=10.0, num_training=50, mode="linear", update_attr=False)
    lrs = finder.results["lr"]
    gaps = [b - a for a, b in zip(lrs, lrs[1:])]
    # Lightning's schedule: step k >= 1 trains at (k + 1) / 50 of the way, so the first gap is two steps wide
    assert lrs[0] == 0.01 and math.isclose(gaps[0], 2 * 9.99 / 50) and all(math.isclose(g, 9.99 / 50) for g in gaps[1:])
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


def _parity() -> ModuleType:
    """``scripts/lr_find_parity.py``: the program and curves whose results under Lightning 2.6.6 the tests
    compare with (it imports Lightning only when run with ``--lightning``)."""
    spec = importlib.util.spec_from_file_location("lr_find_parity", SCRIPTS / "lr_find_parity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _close(ours: list[float], theirs: list[float | str]) -> bool:
    """Equal lists, numbers within 1e-6 relative; non-finite ones (strings in the JSON file) the same."""
    theirs = [float(v) for v in theirs]
    return len(ours) == len(theirs) and all(
        a == b or math.isclose(a, b, rel_tol=1e-6) or (math.isnan(a) and math.isnan(b)) for a, b in zip(ours, theirs)
    )


def test_suggestion_is_lightnings_steepest_gradient_over_lr_on_a_hand_made_curve(caplog):
    """Lightning's rule (``_LRFinder.suggestion``): the steepest gradient of the loss over the rate itself, not
    over log10(rate), past the skipped ends, without the NaN point. The hand-made curve is CURVE_LRS / CURVE_LOSSES
    of scripts/lr_find_parity.py; Lightning's answers are its "curve" entry, printed by
        /tmp/lvenv/bin/python tests/tuner/scripts/lr_find_parity.py --lightning
    (Lightning 2.6.6, torch 2.13). tandem's former rule (slope over log10(lr)) said 0.0251 for each call."""
    parity = _parity()
    lightning = {  # (skip_begin, skip_end): Lightning's suggestion
        (10, 1): 0.0003981071705534973,
        (0, 1): 2.51188643150958e-06,
        (14, 1): 0.00630957344480193,
        (5, 3): 0.0003981071705534973,
    }
    finder = LRFinder("exponential", parity.CURVE_LRS[0], parity.CURVE_LRS[-1], len(parity.CURVE_LRS))
    finder.results = {"lr": list(parity.CURVE_LRS), "loss": list(parity.CURVE_LOSSES)}
    for (begin, end), expected in lightning.items():
        assert finder.suggestion(skip_begin=begin, skip_end=end) == expected
        assert finder.results["lr"][finder._optimal_idx] == expected
    assert finder.suggestion() == lightning[(10, 1)]  # the defaults: skip_begin=10, skip_end=1
    with caplog.at_level(logging.ERROR):  # as Lightning: None, and an error logged
        assert finder.suggestion(skip_begin=28, skip_end=1) is None
    assert "Failed to compute suggestion for learning rate" in caplog.text
    assert finder._optimal_idx is None


def test_suggestion_skip_end_zero_keeps_the_last_point(caplog):
    """tandem's one departure from Lightning's rule: Lightning slices ``[skip_begin:-skip_end]``, so its
    ``skip_end=0`` keeps no point at all (None); here it keeps every point to the end, which is what it says."""
    finder = _finder([5.0] * 12 + [4.9, 4.8, 4.7, 1.0])
    assert finder.suggestion(skip_end=0) == finder.results["lr"][15]  # the drop at the very end
    assert finder.suggestion(skip_end=1) != finder.results["lr"][15]
    with caplog.at_level(logging.ERROR):
        assert _finder([1.0] * 12).suggestion() is None
    assert "Failed to compute suggestion" in caplog.text


def test_the_recorder_smooths_and_stops_as_lightnings():
    """The search's recorder on raw losses, one step each (``record`` of scripts/lr_find_parity.py): the running
    average divided by ``1 - 0.98 ** (step + 1)``, a stop after the step whose smoothed loss exceeds 4 times the best
    (from the second step; the best starts as the first step's), a NaN that stops nothing, an inf that stops, and a
    first step without a loss (Lightning's best stays 0 then: the second step stops). Lightning's numbers are the
    "recorded" entry printed by
        /tmp/lvenv/bin/python tests/tuner/scripts/lr_find_parity.py --lightning"""
    nan, inf = math.nan, math.inf
    lightning = {
        "blow_up": [
            1.010101010101009,
            1.1767106516120251,
            1.182710599156222,
            1.1446772697632033,
            1.1018107013089835,
            1.3896889154051641,
            5.223900996023589,
        ],
        "nan": [1.010101010101009, 1.0066657597605762, nan, nan, nan, nan],
        "inf": [1.010101010101009, 1.0066657597605762, inf],
        "no_loss_first": [nan, 0.6801795674057948],
    }
    parity = _parity()
    for name, raw in parity.RAW_LOSSES.items():
        assert _close(parity.record(raw), lightning[name]), name


def test_lr_find_on_a_tiny_program_gives_lightnings_rates_losses_and_suggestion(tmp_path, monkeypatch):
    """Issue 29, item 4: the same program (scripts/lr_find_parity.py: an MLP, SGD, 200 samples read in order,
    num_training=50; exponential with the defaults, and linear 1e-3..2 which diverges and stops early) gives the
    rates, smoothed losses and suggestion Lightning gives it. Lightning's numbers, in scripts/lr_find_lightning.json,
    were written by
        /tmp/lvenv/bin/python tests/tuner/scripts/lr_find_parity.py --lightning > tests/tuner/scripts/lr_find_lightning.json
    (Lightning 2.6.6, torch 2.13, CPU). Before the fix tandem suggested 0.153 on the exponential search (Lightning:
    1.2e-06) and stopped the linear one after 16 steps, not 14."""
    monkeypatch.chdir(tmp_path)  # the search's temporary checkpoint
    lightning = json.loads((SCRIPTS / "lr_find_lightning.json").read_text())
    ours = _parity().searches()
    assert lightning["exponential"]["suggestion"] == 1.2022644346174132e-06
    assert lightning["linear"]["suggestion"] == 0.44078 and len(lightning["linear"]["lr"]) == 14
    for search in ("exponential", "linear"):
        mine, theirs = ours[search], lightning[search]
        assert _close(mine["lr"], theirs["lr"]), search
        assert _close(mine["loss"], theirs["loss"]), search
        assert math.isclose(mine["suggestion"], theirs["suggestion"], rel_tol=1e-6), search
        assert math.isclose(mine["model_lr"], theirs["model_lr"], rel_tol=1e-6), search  # update_attr


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
    with pytest.raises(AttributeError, match="should have one of these fields: \\('lr', 'learning_rate'\\)"):
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
    with pytest.raises(MisconfigurationException, match="only works with single optimizer"):
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


def test_repeated_searches_on_one_seeded_model_give_lightnings_twenty_points_each_time(tmp_path, monkeypatch):
    """Issue 42, item 5 (Lightning's ``test_multiple_lr_find_calls_gives_same_results``): three ``lr_find`` calls on
    one seeded model, ``max_epochs=2`` of 10 batches, then a fit (scripts/lr_find_repeat.py). The fit's max_epochs
    ends each search after 20 steps, and a search draws no randomness the next one (or the fit) would see: its
    loaders are drawn as Lightning draws them, after on_fit_start inside the search. Lightning's numbers were printed
    by
        /root/lightning_suite_work/lvenv/bin/python tests/tuner/scripts/lr_find_repeat.py --lightning
    (Lightning 2.6.6, torch 2.13, CPU). Before the fix tandem gave 96 points, then 2, then 97."""
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("lr_find_repeat", SCRIPTS / "lr_find_repeat.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    ours = script.searches()
    first = ours["results"][0]
    assert all(results == first for results in ours["results"][1:])
    assert len(first["lr"]) == len(first["loss"]) == 20
    lightning_losses = [0.989158105368565, 1.2690542279709076, 0.9603061821983357]  # the first three
    assert _close(first["loss"][:3], lightning_losses) and _close(first["loss"][-1:], [1.4848932409309485])
    assert first["lr"][-1] == 3.9810717055349735e-07
    assert ours["suggestion"] == 1.0964781961431852e-07
    assert math.isclose(ours["weight_sum_after_fit"], 0.7033242583274841, rel_tol=1e-6)


def test_min_lr_above_max_lr_searches_downwards_as_lightning(tmp_path):
    """Lightning's ``test_lr_candidates_between_min_and_max``: ``min_lr > max_lr`` is a search from high to low,
    not an error."""
    trainer = quiet_trainer(max_epochs=10, default_root_dir=tmp_path)
    finder = Tuner(trainer).lr_find(Regression(lr=0.1), min_lr=1.0, max_lr=1e-8, num_training=3, update_attr=False)
    lrs = finder.results["lr"]
    assert len(lrs) == 3 and lrs[0] == 1.0 and all(1e-8 <= lr <= 1.0 for lr in lrs) and lrs[1] > lrs[2]
    with pytest.raises(TandemConfigError, match="both > 0"):
        LearningRateFinder(min_lr=0.0, max_lr=1.0)


class _SometimesNoLoss(Regression):
    calls = 0

    def training_step(self, batch, batch_idx):
        self.calls += 1
        if self.calls - 1 in (5, 12, 17):  # the search's 6th, 13th and 18th batches
            return None
        return super().training_step(batch, batch_idx)


def test_a_training_step_returning_none_is_a_nan_point_and_the_search_still_suggests(tmp_path):
    """Lightning's ``test_lr_finder_training_step_none_output``: a batch whose ``training_step`` returns None gives
    a NaN point (the suggestion leaves it out), one rate per batch, and a search of ``num_training`` points."""
    torch.manual_seed(0)
    model = _SometimesNoLoss(lr=0.123)
    trainer = quiet_trainer(max_epochs=10, default_root_dir=tmp_path)
    with pytest.warns(PossibleUserWarning, match=r"`training_step` returned `None`"):
        finder = Tuner(trainer).lr_find(model, num_training=20, early_stop_threshold=None)
    losses = torch.tensor(finder.results["loss"])
    assert len(finder.results["lr"]) == len(losses) == 20
    assert torch.isnan(losses[[5, 12, 17]]).all() and torch.isfinite(losses).sum() == 17
    suggestion = finder.suggestion()
    assert suggestion is not None and math.isfinite(suggestion) and model.hparams.lr == suggestion
