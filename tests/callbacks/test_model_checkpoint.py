import csv
import errno
import logging
import os
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch

from callbacks._fake import fake_trainer, metrics
from helpers import TinyModule, loader, max_abs_diff, quiet_trainer
from tandem.callbacks import Callback, ModelCheckpoint
from tandem.loggers import CSVLogger
from tandem.utilities.checkpoint import load_checkpoint_file
from tandem.utilities.exceptions import (
    CheckpointError,
    FileWriteError,
    MisconfigurationException,
    MissingMetricError,
    TandemConfigError,
)


def _setup(callback, tmp_path, **attrs):
    trainer = fake_trainer(tmp_path, callbacks=[callback], **attrs)
    callback.setup(trainer, None, "fit")
    return trainer


def _epoch_end(callback, trainer, epoch, steps_per_epoch=10, **values):
    trainer.current_epoch = epoch
    trainer.global_step = (epoch + 1) * steps_per_epoch
    trainer.callback_metrics = metrics(**values)
    callback.on_train_epoch_end(trainer, None)


def _ckpts(folder):
    return {os.path.join(folder, name) for name in os.listdir(folder) if name.startswith("epoch=")}


def _files(folder):
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


# ---------------------------------------------------------------------- names
def test_format_checkpoint_name_fills_epoch_step_metrics_and_version(tmp_path):
    default = ModelCheckpoint(dirpath=tmp_path)
    expected = str(tmp_path / "epoch=0-step=100.ckpt")
    assert default.format_checkpoint_name({"epoch": 0, "step": 100}) == expected

    named = ModelCheckpoint(filename="{epoch:02d}-{val_loss:.2f}-{train.acc:.1f}")
    values = {"epoch": torch.tensor(3), "val_loss": torch.tensor(0.1234), "train.acc": 0.87}
    assert named.format_checkpoint_name(values) == "epoch=03-val_loss=0.12-train.acc=0.9.ckpt"
    assert named.format_checkpoint_name(values, ver=2) == "epoch=03-val_loss=0.12-train.acc=0.9-v2.ckpt"

    bare = ModelCheckpoint(filename="model-{epoch}-{val_loss:.1f}", auto_insert_metric_name=False)
    assert bare.format_checkpoint_name({"epoch": 1, "val_loss": 2.25}) == "model-1-2.2.ckpt"

    # a placeholder that names no logged value is written as 0 (validation may not have run yet)
    assert named.format_checkpoint_name({"epoch": 1}) == "epoch=01-val_loss=0.00-train.acc=0.0.ckpt"


def test_dirpath_defaults_to_first_logger_then_root(tmp_path):
    from callbacks._fake import RecordingLogger

    with_logger = ModelCheckpoint()
    _setup(with_logger, tmp_path, loggers=[RecordingLogger(str(tmp_path / "logs" / "version_3"))])
    assert with_logger.dirpath == str(tmp_path / "logs" / "version_3" / "checkpoints")

    without = ModelCheckpoint()
    _setup(without, tmp_path)
    assert without.dirpath == str(tmp_path / "checkpoints")

    given = ModelCheckpoint(dirpath=tmp_path / "mine")
    _setup(given, tmp_path, loggers=[RecordingLogger(str(tmp_path / "logs"))])
    assert given.dirpath == str(tmp_path / "mine")


# ---------------------------------------------------------------------- top-k
@pytest.mark.parametrize(
    ("mode", "scores", "kept_epochs", "best_epoch"),
    [("min", [5, 3, 4, 1, 2], [3, 4], 3), ("max", [5, 3, 4, 1, 6], [0, 4], 4)],
)
def test_top_k_keeps_the_best_and_deletes_evicted_files(tmp_path, mode, scores, kept_epochs, best_epoch):
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", mode=mode, save_top_k=2)
    trainer = _setup(callback, tmp_path)
    for epoch, score in enumerate(scores):
        _epoch_end(callback, trainer, epoch, val_loss=score)

    expected = [f"epoch={e}-step={(e + 1) * 10}.ckpt" for e in kept_epochs]
    assert _files(tmp_path) == sorted(expected)
    assert set(callback.best_k_models) == {str(tmp_path / name) for name in expected}
    assert callback.best_model_path == str(tmp_path / f"epoch={best_epoch}-step={(best_epoch + 1) * 10}.ckpt")
    assert callback.best_model_score == scores[best_epoch]
    worst = max if mode == "min" else min
    assert callback.kth_value == worst(scores[e] for e in kept_epochs)
    # the state saved inside the best file already lists that file as the best
    saved = torch.load(callback.best_model_path, weights_only=False)["callbacks"][callback.state_key]
    assert saved["best_model_path"] == callback.best_model_path


def test_save_top_k_minus_one_keeps_all_and_zero_keeps_none_but_last(tmp_path):
    keep_all = ModelCheckpoint(dirpath=tmp_path / "all", monitor="val_loss", save_top_k=-1)
    trainer = _setup(keep_all, tmp_path)
    for epoch, score in enumerate([3, 2, 5]):
        _epoch_end(keep_all, trainer, epoch, val_loss=score)
    assert len(_files(tmp_path / "all")) == 3
    assert keep_all.best_model_score == 2

    only_last = ModelCheckpoint(dirpath=tmp_path / "last", monitor="val_loss", save_top_k=0, save_last=True)
    trainer = _setup(only_last, tmp_path)
    for epoch, score in enumerate([3, 2]):
        _epoch_end(only_last, trainer, epoch, val_loss=score)
    assert _files(tmp_path / "last") == []  # Lightning 2.6: no top-k file saved, so no last.ckpt yet
    only_last.on_train_end(trainer, None)  # ... until the fit ends having saved nothing
    assert _files(tmp_path / "last") == ["last.ckpt"]
    assert only_last.best_k_models == {} and only_last.best_model_path == ""


def test_save_last_overwrites_last_ckpt_at_every_save_event(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=10, save_top_k=0)
    assert callback.CHECKPOINT_NAME_LAST == "last"
    trainer = _setup(callback, tmp_path)
    for step in (10, 20, 30):
        trainer.global_step = step
        callback.on_train_batch_end(trainer, None, None, None, step - 1)
        assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == step
    assert callback.last_model_path == str(tmp_path / "last.ckpt")
    assert _files(tmp_path) == ["last.ckpt"]


def test_save_last_is_written_when_a_checkpoint_is_saved_as_lightning_2_6(tmp_path):
    """Lightning 2.6: last.ckpt is "a copy whenever a checkpoint file gets saved": at an epoch save point only when
    a top-k file was written there (not when the score did not make the top k), at every step save point, and at
    the end of a fit that saved nothing."""
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_last=True, filename="{epoch}")
    trainer = _setup(callback, tmp_path)
    for epoch, score in enumerate([3, 2, 5]):  # epoch 2 does not make the top 1
        _epoch_end(callback, trainer, epoch, val_loss=score)
    last = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert last["global_step"] == 20  # epoch 1's, the last step a checkpoint was saved at
    best = torch.load(tmp_path / "epoch=1.ckpt", weights_only=False)
    assert last["callbacks"][callback.state_key] == best["callbacks"][callback.state_key]  # the same state
    callback.on_train_end(trainer, None)  # the fit saved checkpoints: nothing more
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 20

    never = ModelCheckpoint(dirpath=tmp_path / "never", save_last=True, every_n_epochs=5, save_top_k=0)
    trainer = _setup(never, tmp_path)
    for epoch in range(2):
        _epoch_end(never, trainer, epoch)
    assert _files(tmp_path / "never") == []
    never.on_train_end(trainer, None)
    assert torch.load(tmp_path / "never" / "last.ckpt", weights_only=False)["global_step"] == 20


def test_without_monitor_the_latest_checkpoint_is_kept(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path)
    trainer = _setup(callback, tmp_path)
    for epoch in range(3):
        _epoch_end(callback, trainer, epoch, train_loss=1.0)
    assert _files(tmp_path) == ["epoch=2-step=30.ckpt"]
    assert callback.best_model_path == str(tmp_path / "epoch=2-step=30.ckpt")
    assert callback.best_model_score is None


def test_existing_file_of_the_same_name_gets_a_version_suffix(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, filename="model", monitor="val_loss", save_top_k=-1)
    trainer = _setup(callback, tmp_path)
    for epoch in range(3):
        _epoch_end(callback, trainer, epoch, val_loss=1.0)
    assert _files(tmp_path) == ["model-v1.ckpt", "model-v2.ckpt", "model.ckpt"]


def test_without_a_monitor_a_name_that_does_not_change_is_overwritten(tmp_path):
    """Lightning's rule: without a monitor the new checkpoint may take the name of the latest one (measured with
    Lightning 2.6.6: ModelCheckpoint(filename="model", save_top_k=-1) over 3 epochs leaves model.ckpt alone; with
    save_last=True and another run's last.ckpt there, last-v1.ckpt, last.ckpt and model.ckpt)."""
    callback = ModelCheckpoint(dirpath=tmp_path, filename="model", save_top_k=-1)
    trainer = _setup(callback, tmp_path)
    for epoch in range(3):
        _epoch_end(callback, trainer, epoch)
    assert _files(tmp_path) == ["model.ckpt"]
    assert callback.best_model_path == str(tmp_path / "model.ckpt") and callback.best_k_models == {}


def test_nan_score_never_becomes_best(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=1)
    trainer = _setup(callback, tmp_path)
    _epoch_end(callback, trainer, 0, val_loss=1.0)
    _epoch_end(callback, trainer, 1, val_loss=float("nan"))
    assert callback.best_model_score == 1.0
    assert _files(tmp_path) == ["epoch=0-step=10.ckpt"]


# ---------------------------------------------------------------------- when to save
def test_every_n_train_steps_saves_once_per_due_step_and_not_at_epoch_end(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1)
    trainer = _setup(callback, tmp_path)
    # two micro-batches per optimizer step (gradient accumulation): global_step repeats
    for batch_idx, step in enumerate([0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7]):
        trainer.global_step = step
        callback.on_train_batch_end(trainer, None, {"loss": torch.tensor(1.0)}, None, batch_idx)
    callback.on_train_epoch_end(trainer, None)
    assert trainer.saved == [str(tmp_path / "epoch=0-step=3.ckpt"), str(tmp_path / "epoch=0-step=6.ckpt")]


def test_every_n_epochs_and_no_saves_in_sanity_check_or_fast_dev_run(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, every_n_epochs=2, save_top_k=-1)
    trainer = _setup(callback, tmp_path)
    for epoch in range(4):
        _epoch_end(callback, trainer, epoch)
        callback.on_train_batch_end(trainer, None, None, None, 0)  # step saving is off
    assert _files(tmp_path) == ["epoch=1-step=20.ckpt", "epoch=3-step=40.ckpt"]

    for flag in ({"sanity_checking": True}, {"fast_dev_run": 1}):
        quiet = ModelCheckpoint(dirpath=tmp_path / str(flag), save_last=True)
        trainer = _setup(quiet, tmp_path, **flag)
        _epoch_end(quiet, trainer, 0)
        assert trainer.saved == []


def test_missing_monitor_warns_before_the_first_validation_and_raises_after(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", every_n_train_steps=5, save_last=True)
    trainer = _setup(callback, tmp_path)
    trainer.global_step, trainer.callback_metrics = 5, metrics(train_loss=1.0)
    with pytest.warns(UserWarning, match="monitor='val_loss'.* no top-k checkpoint is saved until it is logged"):
        callback.on_train_batch_end(trainer, None, None, None, 4)  # as Lightning: validation has not run yet
    assert _files(tmp_path) == ["last.ckpt"]

    callback.on_validation_end(trainer, None)
    trainer.global_step, trainer.callback_metrics = 10, metrics(train_loss=1.0, val_acc=0.5)
    with pytest.raises(MissingMetricError) as err:
        callback.on_train_batch_end(trainer, None, None, None, 9)
    message = str(err.value)
    assert "'val_loss'" in message and "'train_loss', 'val_acc'" in message and "self.log" in message


# ---------------------------------------------------------------------- several processes
def test_a_dirpath_given_on_each_rank_is_rank_zeros_on_every_rank(tmp_path):
    """``ModelCheckpoint(dirpath=f"runs/{timestamp}")`` differs between ranks started a second apart: every rank
    takes rank 0's (Lightning broadcasts it too), so they name, rank and load the same files."""
    channel = []
    rank0 = ModelCheckpoint(dirpath=tmp_path / "runs" / "120000", monitor="val_loss")
    rank1 = ModelCheckpoint(dirpath=tmp_path / "runs" / "120001", monitor="val_loss")
    trainer0 = fake_trainer(tmp_path, rank=0, channel=channel, callbacks=[rank0])
    trainer1 = fake_trainer(tmp_path, rank=1, channel=channel, callbacks=[rank1])
    rank0.setup(trainer0, None, "fit")
    rank1.setup(trainer1, None, "fit")
    assert rank1.dirpath == rank0.dirpath == str(tmp_path / "runs" / "120000")
    _epoch_end(rank0, trainer0, 0, val_loss=1.0)
    _epoch_end(rank1, trainer1, 0, val_loss=1.0)
    assert rank1.best_model_path == rank0.best_model_path and os.path.isfile(rank1.best_model_path)
    assert channel == []


def test_under_ddp_a_dirpath_built_from_the_time_on_each_rank_finds_rank_zeros_best_checkpoint(ddp_trainer_runs):
    """Two gloo ranks whose ``dirpath`` differs (``scripts/ddp_dirpath.py``, the ``dirpath`` scenario of the shared
    DDP launch): before, rank 1 failed in ``trainer.test(ckpt_path="best")`` with "Checkpoint ... does not exist", in
    a folder of its own."""
    rank0, rank1 = ddp_trainer_runs["dirpath"]
    assert rank0["given"] != rank1["given"]  # each rank built its own
    assert rank1["dirpath"] == rank0["dirpath"] == rank0["given"] and rank1["best"] == rank0["best"]
    assert rank0["found"] and rank1["found"]
    runs = ddp_trainer_runs["out"] / "dirpath" / "runs"
    assert sorted(os.listdir(runs)) == [os.path.basename(rank0["given"])]  # one folder, rank 0's


def test_every_rank_names_rank_zeros_files(tmp_path):
    """File names come from rank 0's metrics on every rank (the save decisions themselves are voted on by the
    ranks: a real two-process run in tests/strategies/test_ddp_trainer.py)."""
    channel = []
    rank0 = ModelCheckpoint(monitor="val_loss", filename="{epoch}-{val_loss:.1f}")
    rank1 = ModelCheckpoint(monitor="val_loss", filename="{epoch}-{val_loss:.1f}")
    trainer0 = fake_trainer(tmp_path, rank=0, channel=channel, callbacks=[rank0])
    trainer1 = fake_trainer(tmp_path, rank=1, channel=channel, callbacks=[rank1])
    rank0.setup(trainer0, None, "fit")
    rank1.setup(trainer1, None, "fit")
    _epoch_end(rank0, trainer0, 0, val_loss=3.0)
    _epoch_end(rank1, trainer1, 0, val_loss=1.0)
    assert channel == [] and trainer1.saved == trainer0.saved
    assert (
        list(rank1.best_k_models)
        == list(rank0.best_k_models)
        == [str(tmp_path / "checkpoints" / "epoch=0-val_loss=3.0.ckpt")]
    )
    assert rank0.best_model_score == 3.0 and rank1.best_model_score == 1.0  # each rank's own value, as Lightning's


# ---------------------------------------------------------------------- state
def test_state_dict_round_trip_and_state_key(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=2, save_last=True)
    trainer = _setup(callback, tmp_path)
    for epoch, score in enumerate([3, 1, 2]):
        _epoch_end(callback, trainer, epoch, val_loss=score)
    state = callback.state_dict()
    for key in (
        "monitor",
        "best_model_score",
        "best_model_path",
        "best_k_models",
        "kth_best_model_path",
        "dirpath",
        "last_model_path",
    ):
        assert key in state

    assert callback.state_key.startswith("ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'")
    assert ModelCheckpoint(monitor="val_acc", mode="max").state_key != callback.state_key

    restored = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=2, save_last=True)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    assert restored.kth_best_model_path == callback.kth_best_model_path

    # restored before setup resolved the default folder: applied once it is known
    later = ModelCheckpoint(monitor="val_loss", save_top_k=2)
    later.load_state_dict(state)
    with pytest.warns(UserWarning, match="The dirpath has changed from .*the run's top 2 keep their rank"):
        _setup(later, tmp_path / "other")
    assert later.best_model_path == callback.best_model_path
    assert later.best_k_models == callback.best_k_models  # another folder: the ranking still holds
    assert later.last_model_path == ""  # but last.ckpt is written afresh in the new folder


@pytest.mark.parametrize(
    ("kwargs", "fix"),
    [
        ({"mode": "avg"}, "'min' for losses"),
        ({"save_top_k": -2}, "save_top_k=-2 is out of range"),
        ({"every_n_epochs": -1}, "every_n_epochs=-1 is out of range"),
        ({"every_n_train_steps": 1.5}, "every_n_train_steps=1.5"),
        ({"every_n_train_steps": 100, "every_n_epochs": 1}, "Pass only one of them"),
        ({"save_top_k": 3}, "Set monitor= to the logged metric that ranks them"),
    ],
)
def test_bad_arguments_fail_at_construction_naming_the_fix(kwargs, fix):
    with pytest.raises(TandemConfigError, match="ModelCheckpoint") as err:
        ModelCheckpoint(**kwargs)
    assert fix in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "lightning"),
    [  # Lightning 2.6.5's sentences (callbacks/model_checkpoint.py), first in the message
        ({"mode": "avg"}, "`mode` can be min, max but got avg."),
        ({"save_top_k": -2}, "Invalid value for save_top_k=-2. Must be >= -1."),
        ({"every_n_epochs": -1}, "Invalid value for every_n_epochs=-1. Must be >= 0."),
        ({"every_n_train_steps": -3}, "Invalid value for every_n_train_steps=-3. Must be >= 0."),
        (
            {"every_n_train_steps": 100, "every_n_epochs": 1},
            "Combination of parameters every_n_train_steps=100, every_n_epochs=1 and train_time_interval=None "
            "should be mutually exclusive.",
        ),
        (
            {"save_top_k": 3},
            "ModelCheckpoint(save_top_k=3, monitor=None) is not a valid configuration. No quantity for top_k to track.",
        ),
    ],
)
def test_bad_arguments_say_lightnings_sentence_first(kwargs, lightning):
    with pytest.raises(MisconfigurationException) as err:
        ModelCheckpoint(**kwargs)
    assert str(err.value).startswith(lightning)


# ---------------------------------------------------------------------- Lightning's other arguments
def test_save_weights_only_and_the_version_counter(tmp_path):
    weights = ModelCheckpoint(dirpath=tmp_path / "w", save_weights_only=True, save_last=True)
    trainer = _setup(weights, tmp_path)
    _epoch_end(weights, trainer, 0)
    assert torch.load(tmp_path / "w" / "last.ckpt", weights_only=False)["weights_only"] is True

    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "last.ckpt").write_bytes(b"another run's")
    counted = ModelCheckpoint(dirpath=tmp_path / "v", filename="model", save_top_k=-1, save_last=True)
    trainer = _setup(counted, tmp_path)
    for epoch in range(2):
        _epoch_end(counted, trainer, epoch)
    assert _files(tmp_path / "v") == ["last-v1.ckpt", "last.ckpt", "model.ckpt"]  # Lightning's (see above)
    assert (tmp_path / "v" / "last.ckpt").read_bytes() == b"another run's"  # not overwritten

    overwrite = ModelCheckpoint(dirpath=tmp_path / "o", filename="model", save_top_k=-1, enable_version_counter=False)
    trainer = _setup(overwrite, tmp_path)
    for epoch in range(2):
        _epoch_end(overwrite, trainer, epoch)
    assert _files(tmp_path / "o") == ["model.ckpt"]
    assert torch.load(tmp_path / "o" / "model.ckpt", weights_only=False)["global_step"] == 20


def test_train_time_interval_saves_when_rank_zeros_clock_says_so(tmp_path, monkeypatch):
    from tandem.callbacks import model_checkpoint

    clock = iter([0.0, 3.0, 11.0, 15.0, 22.0])
    monkeypatch.setattr(model_checkpoint.time, "monotonic", lambda: next(clock))
    callback = ModelCheckpoint(dirpath=tmp_path, train_time_interval=timedelta(seconds=10), save_top_k=-1)
    trainer = _setup(callback, tmp_path)
    callback.on_train_start(trainer, None)
    for step in range(1, 5):
        trainer.global_step = step
        callback.on_train_batch_end(trainer, None, None, None, step - 1)
    assert [os.path.basename(p) for p in trainer.saved] == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt"]
    _epoch_end(callback, trainer, 0)  # no epoch schedule with a time interval
    assert len(trainer.saved) == 2
    with pytest.raises(TandemConfigError, match="train_time_interval=30"):
        ModelCheckpoint(train_time_interval=30)


@pytest.mark.parametrize(
    ("settings", "saved_at"),
    [
        ({}, "train_epoch_end"),  # validation once, at each epoch's end
        ({"num_val_batches": 0}, "train_epoch_end"),  # no validation
        ({"val_check_interval": 0.5}, "validation_end"),  # validation twice an epoch: after each
        ({"check_val_every_n_epoch": 2}, "validation_end"),  # not every epoch: only with fresh metrics
        ({"val_check_interval": 0.5, "save_on_train_epoch_end": True}, "train_epoch_end"),
        ({"save_on_train_epoch_end": False}, "validation_end"),
    ],
)
def test_epoch_save_point_follows_lightnings_rule(tmp_path, settings, saved_at):
    settings = dict(settings)
    callback = ModelCheckpoint(dirpath=tmp_path, save_on_train_epoch_end=settings.pop("save_on_train_epoch_end", None))
    trainer = _setup(callback, tmp_path, **settings)
    trainer.global_step = 10
    callback.on_validation_end(trainer, None)
    after_validation = list(trainer.saved)
    trainer.global_step = 11  # a step later, so the epoch end is not the same save
    callback.on_train_epoch_end(trainer, None)
    expected = {"validation_end": (1, 1), "train_epoch_end": (0, 1)}[saved_at]
    assert (len(after_validation), len(trainer.saved)) == expected


def test_nothing_is_saved_outside_fit(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = _setup(callback, tmp_path, state=SimpleNamespace(fn="validate", stage="validate"))
    callback.on_validation_end(trainer, None)
    _epoch_end(callback, trainer, 0)
    assert trainer.saved == []


def test_verbose_says_what_was_saved_in_lightnings_words(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=1, verbose=True)
    trainer = _setup(callback, tmp_path)
    _epoch_end(callback, trainer, 0, val_loss=2.0)
    _epoch_end(callback, trainer, 1, val_loss=3.0)
    path = str(tmp_path / "epoch=0-step=10.ckpt")
    assert f"Epoch 0, global step 10: 'val_loss' reached 2.00000 (best 2.00000), saving model to {path!r} as top 1" in (
        caplog.text
    )
    assert "Epoch 1, global step 20: 'val_loss' was not in top 1" in caplog.text


# ---------------------------------------------------------------------- resume keeps the run's history (real fits)
SCORES = [3.0, 1.0, 2.0, 4.0, 1.5]


class Scored(TinyModule):
    """Validation logs ``score`` = SCORES[epoch]."""

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.log("score", SCORES[min(self.current_epoch, len(SCORES) - 1)])


def _fit(root, epochs, logger, resume=False):
    checkpoint = ModelCheckpoint(monitor="score", save_top_k=2, save_last=True, filename="{epoch}")
    trainer = quiet_trainer(
        max_epochs=epochs, default_root_dir=root, logger=logger, callbacks=[checkpoint], enable_checkpointing=True
    )
    trainer.fit(Scored(), loader(32), loader(16), ckpt_path="last" if resume else None)
    return trainer, checkpoint


@pytest.mark.timeout(60)
def test_resume_into_the_same_version_keeps_the_top_k_and_the_best(tmp_path):
    _, first = _fit(tmp_path, 3, CSVLogger(tmp_path, version=0))
    assert os.path.basename(first.best_model_path) == "epoch=1.ckpt"
    trainer, resumed = _fit(tmp_path, 5, CSVLogger(tmp_path, version=0), resume=True)
    folder = tmp_path / "tandem_logs" / "version_0"
    # epochs 1 (1.0) and 4 (1.5) are the run's best two; epoch 2 (2.0), ranked in the first launch, was deleted
    assert _files(folder / "checkpoints") == ["epoch=1.ckpt", "epoch=4.ckpt", "last.ckpt"]
    assert resumed.best_model_path == str(folder / "checkpoints" / "epoch=1.ckpt") and resumed.best_model_score == 1.0
    assert sorted(os.path.basename(p) for p in resumed.best_k_models) == ["epoch=1.ckpt", "epoch=4.ckpt"]
    with open(folder / "metrics.csv", newline="") as f:  # one table for the whole run
        rows = list(csv.DictReader(f))
    assert sorted({int(r["epoch"]) for r in rows if r["score"]}) == [0, 1, 2, 3, 4]
    model = Scored()
    trainer.validate(model, loader(16), ckpt_path="best")  # the run's best: epoch 1's weights
    best = load_checkpoint_file(folder / "checkpoints" / "epoch=1.ckpt")
    assert best["epoch"] == 1 and max_abs_diff(model.state_dict(), best["state_dict"]) == 0.0


@pytest.mark.timeout(60)
def test_resume_into_a_new_version_folder_keeps_the_best_of_the_earlier_folder(tmp_path):
    _fit(tmp_path, 3, CSVLogger(tmp_path))
    trainer, resumed = _fit(tmp_path, 5, CSVLogger(tmp_path), resume=True)  # the run's own versions: no warning
    old, new = (tmp_path / "tandem_logs" / f"version_{v}" / "checkpoints" for v in (0, 1))
    assert trainer.log_dir.endswith("version_1")
    assert resumed.best_model_path == str(old / "epoch=1.ckpt") and resumed.best_model_score == 1.0
    assert set(resumed.best_k_models) == {str(old / "epoch=1.ckpt"), str(new / "epoch=4.ckpt")}
    assert _files(old) == ["epoch=1.ckpt", "epoch=2.ckpt", "last.ckpt"]  # nothing deleted in the earlier folder
    assert _files(new) == ["epoch=4.ckpt", "last.ckpt"]
    best = load_checkpoint_file(resumed.best_model_path)
    assert best["epoch"] == 1


# ---------------------------------------------------------------------- the folder


class _CountBatches(Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.batches += 1


def test_an_unwritable_checkpoint_folder_fails_at_setup_before_any_training(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    counter = _CountBatches()
    trainer = quiet_trainer(max_epochs=1, callbacks=[ModelCheckpoint(dirpath=blocker / "ckpts"), counter])
    with pytest.raises(FileWriteError, match=r"Could not write the ModelCheckpoint folder .*a-file' is a file") as err:
        trainer.fit(TinyModule(), loader())
    assert "Checked before training, so no work is lost" in str(err.value) and err.value.errno == errno.ENOTDIR
    assert counter.batches == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # the check leaves nothing behind


# ---------------------------------------------------------------------- mistakes that would pass silently
def test_a_folder_with_another_runs_checkpoints_warns(tmp_path):
    folder = tmp_path / "ckpts"
    folder.mkdir()
    (folder / "epoch=3-step=40.ckpt").write_bytes(b"old")
    callback = ModelCheckpoint(dirpath=folder)
    with pytest.warns(UserWarning, match=r"Checkpoint directory .*ckpts exists and is not empty: .*epoch=3-step=40"):
        quiet_trainer(max_epochs=1, callbacks=[callback], enable_checkpointing=True).fit(TinyModule(), loader(32))


def test_no_folder_warning_for_a_fresh_folder_a_second_fit_or_a_resume_from_it(tmp_path, recwarn):
    folder = tmp_path / "ckpts"
    callback = ModelCheckpoint(dirpath=folder, save_last=True)
    trainer = quiet_trainer(max_epochs=1, callbacks=[callback], enable_checkpointing=True, limit_val_batches=0)
    trainer.fit(TinyModule(), loader(32))
    trainer = quiet_trainer(max_epochs=2, callbacks=[callback], enable_checkpointing=True, limit_val_batches=0)
    trainer.fit(TinyModule(), loader(32))  # the same callback: its files are its own
    resumed = ModelCheckpoint(dirpath=folder, save_last=True)
    trainer = quiet_trainer(max_epochs=3, callbacks=[resumed], enable_checkpointing=True, limit_val_batches=0)
    trainer.fit(TinyModule(), loader(32), ckpt_path=folder / "last.ckpt")
    assert trainer.ckpt_path == str(folder / "last.ckpt")
    assert not [w for w in recwarn if "is not empty" in str(w.message)]


def test_a_filename_naming_an_unlogged_metric_warns_once(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}-{val_acc:.2f}", monitor="val_loss", save_top_k=-1)
    trainer = _setup(callback, tmp_path)
    with pytest.warns(UserWarning) as caught:
        _epoch_end(callback, trainer, 0, val_loss=2.0)
        _epoch_end(callback, trainer, 1, val_loss=1.0)
    messages = [str(w.message) for w in caught if "filename=" in str(w.message)]
    assert len(messages) == 1
    assert "names 'val_acc', which was not logged (logged: ['val_loss'])" in messages[0]
    assert _files(tmp_path) == ["epoch=0-val_acc=0.00.ckpt", "epoch=1-val_acc=0.00.ckpt"]  # Lightning's 0, as before


# ---------------------------------------------------------------------- Lightning's contract
def test_the_default_checkpoint_is_lightnings_and_best_model_path_names_it(tmp_path):
    """Trainer(enable_checkpointing=True) with no ModelCheckpoint adds Lightning's ModelCheckpoint(): the latest
    epoch's ``epoch=N-step=M.ckpt`` alone (save_top_k=1, no monitor, no last.ckpt), named by best_model_path, so
    load_from_checkpoint(best_model_path) and test(ckpt_path="best") work (Lightning 2.6.6, 3 epochs of 2 batches
    of BoringModel: ['epoch=2-step=6.ckpt'], best_model_score None, best_k_models {}, kth_value tensor(inf))."""
    trainer = quiet_trainer(max_epochs=3, enable_checkpointing=True, default_root_dir=tmp_path)
    trainer.fit(TinyModule(), loader(32), loader(16))
    callback = trainer.checkpoint_callback
    assert _files(tmp_path / "checkpoints") == ["epoch=2-step=6.ckpt"]
    assert callback.best_model_path == str(tmp_path / "checkpoints" / "epoch=2-step=6.ckpt")
    assert (callback.save_top_k, callback.save_last, callback.monitor, callback.last_model_path) == (1, None, None, "")
    assert callback.best_model_score is None and callback.best_k_models == {}
    assert torch.equal(callback.kth_value, torch.tensor(float("inf")))
    loaded = TinyModule.load_from_checkpoint(callback.best_model_path)
    assert max_abs_diff(loaded.state_dict(), trainer.strategy.module.state_dict()) == 0.0
    (result,) = trainer.test(ckpt_path="best", dataloaders=loader(16), verbose=False)
    assert trainer.ckpt_path == callback.best_model_path and "test_loss" in result


def test_scores_are_tensors_as_lightnings(tmp_path):
    """best_model_score, current_score, kth_value and best_k_models' values are 0-dim tensors (programs call
    .item() on them); kth_value starts at tensor(inf) for mode="min", tensor(-inf) for "max"; a checkpoint of an
    earlier tandem (floats) restores as tensors."""
    assert torch.equal(ModelCheckpoint(mode="max").kth_value, torch.tensor(float("-inf")))
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=2)
    trainer = _setup(callback, tmp_path)
    for epoch, score in enumerate([0.3, 0.1, 0.2]):
        _epoch_end(callback, trainer, epoch, val_loss=score)
    for score in (
        callback.best_model_score,
        callback.current_score,
        callback.kth_value,
        *callback.best_k_models.values(),
    ):
        assert type(score) is torch.Tensor and score.dim() == 0
    assert callback.best_model_score.item() == pytest.approx(0.1) and callback.current_score.item() == pytest.approx(
        0.2
    )
    assert callback.kth_value.item() == pytest.approx(0.2)
    state = callback.state_dict()
    old = {**state, "best_model_score": 0.1, "current_score": 0.2, "kth_value": 0.2}
    old["best_k_models"] = {path: float(score) for path, score in state["best_k_models"].items()}
    restored = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=2)
    restored.load_state_dict(old)
    assert type(restored.best_model_score) is torch.Tensor and type(restored.kth_value) is torch.Tensor
    assert all(type(s) is torch.Tensor for s in restored.best_k_models.values())


def test_a_model_checkpoint_with_checkpointing_off_is_an_error():
    """Lightning raises MisconfigurationException for Trainer(enable_checkpointing=False, callbacks=[ModelCheckpoint()])."""
    with pytest.raises(MisconfigurationException, match="enable_checkpointing=False.*ModelCheckpoint"):
        quiet_trainer(enable_checkpointing=False, callbacks=[ModelCheckpoint()])
    assert issubclass(TandemConfigError, MisconfigurationException) and issubclass(TandemConfigError, ValueError)


def test_dirpath_expands_the_home_folder_and_is_absolute(tmp_path, monkeypatch):
    """As Lightning: dirpath="~/ckpts" is the home folder's (not a folder named "~"), and a relative one absolute."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ModelCheckpoint(dirpath="~/ckpts").dirpath == str(tmp_path / "ckpts")
    monkeypatch.chdir(tmp_path)
    assert ModelCheckpoint(dirpath="rel").dirpath == str(tmp_path / "rel")


def test_an_empty_checkpoint_path_says_no_best_checkpoint_was_saved(tmp_path):
    """best_model_path is "" when no checkpoint was kept; loading it names that, not the working folder."""
    trainer = quiet_trainer(max_epochs=1, callbacks=[ModelCheckpoint(dirpath=tmp_path, save_top_k=0)])
    trainer.fit(TinyModule(), loader(32))
    assert trainer.checkpoint_callback.best_model_path == ""
    with pytest.raises(CheckpointError, match="checkpoint path is empty.*no best checkpoint was saved"):
        TinyModule.load_from_checkpoint(trainer.checkpoint_callback.best_model_path)
    with pytest.raises(ValueError, match=r"trainer.fit\(ckpt_path=''\): the checkpoint path is empty"):
        quiet_trainer(max_epochs=1).fit(TinyModule(), loader(32), ckpt_path="")


def test_a_resumed_fit_never_deletes_the_checkpoint_it_resumed_from(tmp_path):
    """As Lightning: the default ModelCheckpoint (save_top_k=1) of a fit resumed from its folder keeps that file."""
    first = quiet_trainer(max_epochs=1, enable_checkpointing=True, default_root_dir=tmp_path)
    first.fit(TinyModule(), loader(32))
    start = first.checkpoint_callback.best_model_path
    resumed = quiet_trainer(max_epochs=2, enable_checkpointing=True, default_root_dir=tmp_path)
    resumed.fit(TinyModule(), loader(32), ckpt_path=start)
    assert _files(tmp_path / "checkpoints") == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"]


# ---------------------------------------------------------------------- save_on_exception
class _FailsAt(TinyModule):
    """Raises in ``training_step`` at global step ``step`` (when ``nan``, after making a weight NaN); in the sanity
    check with ``in_sanity_check``."""

    def __init__(self, step=-1, nan=False, in_sanity_check=False):
        super().__init__()
        self.step, self.nan, self.in_sanity_check = step, nan, in_sanity_check

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == self.step:
            if self.nan:
                with torch.no_grad():
                    self.net[0].weight[0, 0] = float("nan")
            raise RuntimeError("bad batch")
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        if self.in_sanity_check and self.trainer.sanity_checking:
            raise RuntimeError("bad validation")
        return super().validation_step(batch, batch_idx)


def test_save_on_exception_saves_where_the_run_failed_in_lightnings_name(tmp_path, caplog):
    callback = ModelCheckpoint(dirpath=tmp_path, save_on_exception=True, save_last=True, every_n_epochs=5)
    model = _FailsAt(step=6)
    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError, match="bad batch"):
        quiet_trainer(max_epochs=3, callbacks=[callback]).fit(model, loader(64, 16))
    assert _files(tmp_path) == ["epoch=1-step=6.ckpt", "last.ckpt"]
    saved = load_checkpoint_file(tmp_path / "epoch=1-step=6.ckpt")
    assert saved["global_step"] == 6 and max_abs_diff(saved["state_dict"], model.state_dict()) == 0.0
    assert callback.best_k_models == {} and callback.last_model_path == str(tmp_path / "last.ckpt")
    assert "An RuntimeError was raised with message: bad batch, saved checkpoint to" in caplog.text


def test_save_on_exception_skips_the_sanity_check_fast_dev_run_and_a_step_saved_already(tmp_path):
    def fit(folder, model, **kwargs):
        ckpt = {"save_on_exception": True, **kwargs.pop("ckpt", {})}
        callback = ModelCheckpoint(dirpath=tmp_path / folder, **ckpt)
        with pytest.raises(RuntimeError, match="bad"):
            quiet_trainer(callbacks=[callback], **kwargs).fit(model, loader(64, 16), loader(32, 16))
        return _files(tmp_path / folder)

    assert fit("sanity", _FailsAt(in_sanity_check=True), num_sanity_val_steps=1, max_epochs=2) == []
    assert fit("fast", _FailsAt(step=1), fast_dev_run=3) == []
    # every_n_train_steps=2 saved step 2, where the run then fails: nothing more
    assert fit("saved", _FailsAt(step=2), ckpt={"every_n_train_steps": 2}, max_epochs=1) == ["epoch=0-step=2.ckpt"]
    assert fit("off", _FailsAt(step=3), ckpt={"save_on_exception": False}, max_epochs=1) == []
    assert ModelCheckpoint().save_on_exception is False  # as Lightning's default


def test_save_on_exception_never_replaces_a_kept_checkpoint(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, filename="model", save_on_exception=True)
    with pytest.raises(RuntimeError, match="bad batch"):
        quiet_trainer(max_epochs=3, callbacks=[callback]).fit(_FailsAt(step=6), loader(64, 16))
    assert _files(tmp_path) == ["model-v1.ckpt", "model.ckpt"]
    assert callback.best_model_path == str(tmp_path / "model.ckpt")
    assert load_checkpoint_file(tmp_path / "model.ckpt")["global_step"] == 4


def test_save_on_exception_never_writes_non_finite_weights(tmp_path):
    """The save meets the check every save meets: NaN weights are not written, and a note on the run's own
    exception says so (the exception that ends the run stays the one raised)."""
    callback = ModelCheckpoint(dirpath=tmp_path, save_on_exception=True, save_last=True, every_n_epochs=5)
    with pytest.raises(RuntimeError, match="bad batch") as raised:
        quiet_trainer(max_epochs=3, callbacks=[callback]).fit(_FailsAt(step=6, nan=True), loader(64, 16))
    assert "epoch=1-step=6.ckpt" not in _files(tmp_path)
    assert any("wrote no checkpoint: its parameters hold NaN or inf" in n for n in raised.value.__notes__)
    last = [load_checkpoint_file(tmp_path / name)["global_step"] for name in _files(tmp_path) if name == "last.ckpt"]
    assert all(step < 6 for step in last) and callback.best_model_path == ""


# ---------------------------------------------------------------------- Lightning 2.6's small API
def test_state_key_is_lightnings_and_a_checkpoint_under_the_earlier_key_restores(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=2)
    assert callback.state_key == (
        "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1,"
        " 'train_time_interval': None}"
    )
    trainer = quiet_trainer(max_epochs=2, callbacks=[callback])
    trainer.fit(TinyModule(), loader(64, 16), loader(32, 16))
    saved = torch.load(callback.best_model_path)
    # a checkpoint of an earlier tandem version: the key had no train_time_interval when it was None
    earlier = "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1}"
    saved["callbacks"] = {earlier: saved["callbacks"].pop(callback.state_key), **saved["callbacks"]}
    del saved["tandem_checksum"]  # edited on purpose
    torch.save(saved, tmp_path / "earlier.ckpt")
    resumed = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=2)
    quiet_trainer(max_epochs=3, callbacks=[resumed]).fit(
        TinyModule(), loader(64, 16), loader(32, 16), ckpt_path=tmp_path / "earlier.ckpt"
    )
    # the state came back: the files of the first fit keep their rank against the third epoch's
    assert len(resumed.best_k_models) == 2 and set(resumed.best_k_models) <= {
        *callback.best_k_models,
        *_ckpts(tmp_path),
    }
    assert resumed.state_key in torch.load(resumed.best_model_path)["callbacks"]  # written under Lightning's key


def test_to_yaml_writes_the_best_k_scores(tmp_path):
    import yaml

    callback = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=2)
    quiet_trainer(max_epochs=3, callbacks=[callback]).fit(TinyModule(), loader(64, 16), loader(32, 16))
    callback.to_yaml()
    written = yaml.safe_load((tmp_path / "best_k_models.yaml").read_text())
    assert written == {path: score.item() for path, score in callback.best_k_models.items()} and len(written) == 2
    callback.to_yaml(tmp_path / "other.yaml")
    assert yaml.safe_load((tmp_path / "other.yaml").read_text()) == written


def test_hooks_take_lightnings_keyword_names(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path)
    trainer = fake_trainer(tmp_path, callbacks=[callback])
    callback.setup(trainer=trainer, pl_module=None, stage="fit")
    Callback().setup(trainer=trainer, pl_module=None, stage="fit")
    assert callback.dirpath == str(tmp_path)


# ---------------------------------------------------------------------- Lightning 2.6's last.ckpt and restore rules
def test_a_fit_that_saved_nothing_writes_last_at_its_end(tmp_path):
    """save_on_train_epoch_end=False and no validation: no save point ever comes, but save_last still gives a
    last.ckpt of the final state (Lightning 2.6); not with fast_dev_run, which saves nothing."""
    callback = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_on_train_epoch_end=False)
    trainer = quiet_trainer(max_epochs=2, callbacks=[callback])
    trainer.fit(TinyModule(), loader(32, 8))
    assert _files(tmp_path) == ["last.ckpt"]
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 8

    quick = ModelCheckpoint(dirpath=tmp_path / "quick", save_last=True)
    quiet_trainer(fast_dev_run=True, callbacks=[quick]).fit(TinyModule(), loader(32, 8))
    assert _files(tmp_path / "quick") == []


def test_restoring_into_another_folder_warns_and_keeps_best_model_path(tmp_path):
    written = {
        "monitor": None,
        "best_model_path": "epoch=10-step=1436.ckpt",
        "best_model_score": torch.tensor(2.246),
        "current_score": None,
        "best_k_models": {"epoch=10-step=1436.ckpt": torch.tensor(2.246)},
        "kth_best_model_path": "epoch=10-step=1436.ckpt",
        "kth_value": torch.tensor(2.246),
        "dirpath": str(tmp_path),
        "last_model_path": "last2245.ckpt",
    }
    restored = ModelCheckpoint(dirpath=tmp_path / "restore", save_top_k=-1, save_last=True)
    with pytest.warns(UserWarning, match="The dirpath has changed from .*only `best_model_path`"):
        restored.load_state_dict(written)
    assert restored.best_model_path == written["best_model_path"]
    # without a monitor there is no ranking to carry over; last.ckpt is written afresh in the new folder
    assert (restored.best_model_score, restored.best_k_models, restored.kth_best_model_path) == (None, {}, "")
    assert restored.last_model_path == "" and restored.dirpath == str(tmp_path / "restore")

    same = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, save_last=True)
    same.load_state_dict(written)  # the same folder: no warning (tandem's warnings are errors in this suite)
    assert same.last_model_path == "last2245.ckpt"


def test_enable_checkpointing_false_with_a_model_checkpoint_names_both(tmp_path):
    with pytest.raises(MisconfigurationException, match="`enable_checkpointing=False` but found `ModelCheckpoint`"):
        quiet_trainer(enable_checkpointing=False, callbacks=[ModelCheckpoint(dirpath=tmp_path)])
