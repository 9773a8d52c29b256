import logging
import math
import warnings

import pytest

from callbacks._fake import fake_trainer, metrics
from tandem.callbacks import EarlyStopping
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


def test_the_reason_is_reported_on_rank_zero(caplog):
    caplog.set_level(logging.INFO)
    _run(EarlyStopping("val_loss", patience=1), [1.0, 2.0])
    assert "val_loss did not improve in the last 1 checks" in caplog.text


def test_missing_metric_raises_when_strict_and_warns_once_otherwise():
    trainer = fake_trainer(".")
    trainer.callback_metrics = metrics(train_loss=1.0)
    with pytest.raises(MissingMetricError, match="Logged metrics: 'train_loss'"):
        EarlyStopping("val_loss").on_train_epoch_end(trainer, None)

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
    assert state == {"wait_count": 2, "stopped_epoch": 0, "best_score": 0.5, "patience": 4}
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
