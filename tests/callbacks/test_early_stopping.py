import logging
import math
import warnings
from types import SimpleNamespace

import pytest

from callbacks._fake import fake_trainer, metrics
from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import EarlyStopping
from tandem.callbacks.early_stopping import EarlyStoppingReason
from tandem.utilities.exceptions import MissingMetricError, TandemConfigError


def _run(callback, scores, trainer=None, key="val_loss"):
    """Feed one score per epoch; return the epoch at which the trainer was told to stop, or None."""
    trainer = trainer or fake_trainer(".")
    for epoch, score in enumerate(scores):
        trainer.current_epoch = epoch
        trainer.callback_metrics = metrics(**{key: score})
        callback.on_train_epoch_end(trainer, None)
        if trainer.should_stop:
            return epoch
    return None


def test_patience_counts_epochs_without_improvement():
    callback = EarlyStopping("val_loss", patience=2)
    assert _run(callback, [3.0, 2.0, 2.5, 2.1, 1.0]) == 3
    assert callback.wait_count == 2 and callback.stopped_epoch == 3 and callback.best_score == 2.0
    assert _run(EarlyStopping("val_loss", patience=2), [3.0, 2.0, 2.5, 1.0, 1.5, 0.5]) is None


def test_min_delta_ignores_improvements_that_are_too_small():
    assert _run(EarlyStopping("val_loss", patience=2, min_delta=0.1), [1.0, 0.95, 0.91, 0.5]) == 2
    assert _run(EarlyStopping("val_loss", patience=2, min_delta=0.01), [1.0, 0.95, 0.91, 0.5]) is None


def test_mode_max_wants_higher_values():
    assert _run(EarlyStopping("val_acc", patience=1, mode="max"), [0.5, 0.6, 0.55], key="val_acc") == 2
    assert _run(EarlyStopping("val_acc", patience=1, mode="max"), [0.5, 0.6, 0.7], key="val_acc") is None


def test_check_finite_stops_on_nan_at_once_unless_disabled():
    assert _run(EarlyStopping("val_loss", patience=5), [1.0, math.nan, 0.5]) == 1
    assert _run(EarlyStopping("val_loss", patience=5), [1.0, math.inf]) == 1
    assert _run(EarlyStopping("val_loss", patience=5, check_finite=False), [1.0, math.nan, 0.5]) is None


def test_stopping_and_divergence_thresholds():
    assert _run(EarlyStopping("val_loss", patience=9, stopping_threshold=0.1), [1.0, 0.5, 0.05, 0.01]) == 2
    assert _run(EarlyStopping("val_loss", patience=9, divergence_threshold=5.0), [1.0, 2.0, 6.0, 0.1]) == 2
    max_mode = EarlyStopping("val_acc", mode="max", patience=9, stopping_threshold=0.9)
    assert _run(max_mode, [0.5, 0.95], key="val_acc") == 1
    max_mode = EarlyStopping("val_acc", mode="max", patience=9, divergence_threshold=0.1)
    assert _run(max_mode, [0.5, 0.05], key="val_acc") == 1


def test_the_reason_is_reported_in_lightnings_words_through_the_modules_log(caplog):
    caplog.set_level(logging.INFO)
    _run(EarlyStopping("val_loss", patience=1), [1.0, 2.0])
    (record,) = caplog.records
    assert record.name == "tandem.callbacks.early_stopping"  # early_stopping.log, as Lightning's
    assert record.getMessage() == (
        "Monitored metric val_loss did not improve in the last 1 records. Best score: 1.000. Signaling Trainer to stop."
    )


@pytest.mark.parametrize(
    ("kwargs", "scores", "reason", "message"),
    [
        ({"patience": 1}, [1.0, 2.0], EarlyStoppingReason.PATIENCE_EXHAUSTED, "did not improve in the last 1 records"),
        ({"stopping_threshold": 0.6}, [1.0, 0.5], EarlyStoppingReason.STOPPING_THRESHOLD, "val_loss = 0.5 < 0.6"),
        ({"divergence_threshold": 8.0}, [1.0, 9.0], EarlyStoppingReason.DIVERGENCE_THRESHOLD, "val_loss = 9.0 > 8.0"),
        ({}, [1.0, math.nan], EarlyStoppingReason.NON_FINITE_METRIC, "val_loss = nan is not finite"),
        ({}, [1.0, 0.9, 0.8], EarlyStoppingReason.NOT_STOPPED, None),
    ],
)
def test_stopping_reason_says_why_it_stopped(kwargs, scores, reason, message):
    callback = EarlyStopping("val_loss", **kwargs)
    assert callback.stopping_reason is EarlyStoppingReason.NOT_STOPPED and callback.stopping_reason_message is None
    _run(callback, scores)
    assert callback.stopping_reason is reason
    if message is None:
        assert callback.stopping_reason_message is None
    else:
        assert message in callback.stopping_reason_message
    restored = EarlyStopping("val_loss")
    restored.load_state_dict(callback.state_dict())
    assert (restored.stopping_reason, restored.stopping_reason_message) == (reason, callback.stopping_reason_message)


def test_improvements_are_reported_with_verbose_and_every_rank_prefixes_its_rank(caplog):
    caplog.set_level(logging.INFO)
    _run(EarlyStopping("val_loss", verbose=True), [1.0, 0.5])
    assert [r.getMessage() for r in caplog.records] == [
        "Metric val_loss improved. New best score: 1.000",
        "Metric val_loss improved by 0.500 >= min_delta = 0.0. New best score: 0.500",
    ]
    caplog.clear()
    for rank in (0, 1):
        for zero_only in (False, True):
            trainer = SimpleNamespace(global_rank=rank, world_size=2)
            EarlyStopping._log_info(trainer, "bar", zero_only)
    assert [r.getMessage() for r in caplog.records] == ["[rank: 0] bar", "[rank: 0] bar", "[rank: 1] bar"]


def test_a_checkpoint_without_a_reason_restores_not_stopped():
    callback = EarlyStopping("val_loss")
    callback.load_state_dict({"wait_count": 2, "stopped_epoch": 5, "best_score": 0.5, "patience": 3})
    assert callback.stopping_reason is EarlyStoppingReason.NOT_STOPPED and callback.stopping_reason_message is None
    assert (callback.wait_count, callback.stopped_epoch) == (2, 5)


def test_missing_metric_raises_when_strict_and_warns_once_otherwise():
    trainer = fake_trainer(".")
    trainer.callback_metrics = metrics(train_loss=1.0)
    with pytest.raises(MissingMetricError, match="Logged metrics: 'train_loss'") as err:
        EarlyStopping("val_loss").on_train_epoch_end(trainer, None)
    assert isinstance(err.value, RuntimeError)  # Lightning's type there: a ported `except RuntimeError` catches it

    lenient = EarlyStopping("val_loss", strict=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            lenient.on_train_epoch_end(trainer, None)
    assert [str(w.message) for w in caught if "val_loss" in str(w.message)] == [
        "EarlyStopping(monitor='val_loss', strict=False): the metric was not logged, so the check is "
        "skipped. Logged metrics: ['train_loss']."
    ]
    assert not trainer.should_stop and lenient.wait_count == 0


def test_sanity_check_is_skipped():
    trainer = fake_trainer(".", sanity_checking=True)
    trainer.callback_metrics = metrics(val_loss=math.nan)
    EarlyStopping("val_loss").on_train_epoch_end(trainer, None)
    assert not trainer.should_stop


@pytest.mark.parametrize(("rank0_scores", "rank0_stops"), [([1.0, 0.9, 0.8], None), ([1.0, 2.0, 3.0], 1)])
def test_every_rank_follows_rank_zeros_decision(rank0_scores, rank0_stops):
    channel = []
    rank0, rank1 = EarlyStopping("val_loss", patience=1), EarlyStopping("val_loss", patience=1)
    trainer0 = fake_trainer(".", rank=0, channel=channel)
    trainer1 = fake_trainer(".", rank=1, channel=channel)
    rank1_scores = list(reversed(rank0_scores))  # locally, rank 1 sees the opposite trend
    stops = []
    for callback, trainer, scores in ((rank0, trainer0, rank0_scores), (rank1, trainer1, rank1_scores)):
        stops.append(_run(callback, scores, trainer))
    assert stops == [rank0_stops, rank0_stops]
    assert rank1.state_dict() == rank0.state_dict()
    assert channel == []


def test_state_dict_round_trip_and_state_key():
    callback = EarlyStopping("val_loss", patience=4)
    _run(callback, [1.0, 0.5, 0.7, 0.8])
    state = callback.state_dict()
    assert state == {
        "wait_count": 2,
        "stopped_epoch": 0,
        "best_score": 0.5,
        "patience": 4,
        "stopping_reason": 0,  # Lightning 2.6's keys: EarlyStoppingReason.NOT_STOPPED.value
        "stopping_reason_message": None,
    }
    restored = EarlyStopping("val_loss", patience=4)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    # resumed: two more bad epochs exhaust the patience carried over
    assert _run(restored, [0.9, 0.9]) == 1
    assert callback.state_key == "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "auto"}, "EarlyStopping: mode='auto' is not valid"),
        ({"patience": -1}, "EarlyStopping: patience=-1 is out of range"),
        ({"min_delta": -0.1}, "EarlyStopping: min_delta=-0.1 is out of range"),
        ({"min_delta": math.nan}, "EarlyStopping: min_delta=nan is out of range"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, message):
    with pytest.raises(TandemConfigError) as err:
        EarlyStopping("val_loss", **kwargs)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("settings", "checked_at"),
    [
        ({}, "train_epoch_end"),  # validation once, at each epoch's end (or none)
        ({"val_check_interval": 0.25}, "validation_end"),
        ({"check_val_every_n_epoch": 3}, "validation_end"),
        ({"val_check_interval": 0.25, "check_on_train_epoch_end": True}, "train_epoch_end"),
        ({"check_on_train_epoch_end": False}, "validation_end"),
    ],
)
def test_when_the_check_runs_follows_lightning(settings, checked_at):
    settings = dict(settings)
    callback = EarlyStopping(
        "val_loss", patience=0, check_on_train_epoch_end=settings.pop("check_on_train_epoch_end", None)
    )
    trainer = fake_trainer(".", **settings)
    trainer.callback_metrics = metrics(val_loss=1.0)
    callback.on_validation_end(trainer, None)
    after_validation = callback.best_score
    callback.on_train_epoch_end(trainer, None)
    assert (after_validation == 1.0) == (checked_at == "validation_end")
    assert callback.best_score == 1.0  # checked exactly once: patience=0 would have stopped on a second check
    assert not trainer.should_stop


def test_no_check_outside_fit_or_in_the_sanity_check():
    for attrs in ({"state": SimpleNamespace(fn="validate", stage="validate")}, {"sanity_checking": True}):
        trainer = fake_trainer(".", **attrs)
        trainer.callback_metrics = metrics(val_loss=math.nan)
        callback = EarlyStopping("val_loss", check_on_train_epoch_end=False)
        callback.on_validation_end(trainer, None)
        assert not trainer.should_stop


def test_positional_arguments_in_lightnings_order():
    callback = EarlyStopping("val_acc", 0.01, 5, True, "max", False, False, 0.99, 0.1, True, True)
    assert (callback.min_delta, callback.patience, callback.verbose, callback.mode) == (0.01, 5, True, "max")
    assert (callback.strict, callback.check_finite, callback.stopping_threshold) == (False, False, 0.99)
    assert (callback.divergence_threshold, callback.check_on_train_epoch_end) == (0.1, True)


def test_a_real_fit_stops_after_patience_runs_out():
    class Plateau(TinyModule):
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", [3.0, 2.0, 2.5, 2.4, 2.6, 1.0, 1.0, 1.0][self.current_epoch])

    stopper = EarlyStopping("val_loss", patience=2)
    trainer = quiet_trainer(max_epochs=8, callbacks=[stopper])
    trainer.fit(Plateau(), loader(32), loader(16))
    assert trainer.current_epoch == 4 and stopper.stopped_epoch == 3 and stopper.best_score == 2.0


def test_mode_error_says_lightnings_sentence_first_and_fast_dev_run_never_stops():
    with pytest.raises(TandemConfigError) as err:
        EarlyStopping("val_loss", mode="auto")
    assert str(err.value).startswith("`mode` can be min, max, got auto. EarlyStopping: mode='auto' is not valid")
    trainer = fake_trainer(".")
    trainer.fast_dev_run = 2
    assert _run(EarlyStopping("val_loss", patience=1), [1.0, 2.0, 3.0], trainer=trainer) is None
