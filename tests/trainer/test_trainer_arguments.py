"""Lightning's Trainer arguments tandem once refused: max_time, overfit_batches, reload_dataloaders_every_n_epochs,
barebones, max_epochs=-1."""

from __future__ import annotations

import warnings

import pytest
from torch.utils.data import DataLoader

import tandem
from helpers import TinyModule, loader, make_data, quiet_trainer
from tandem.callbacks import Timer
from tandem.utilities.exceptions import TandemConfigError

pytestmark = pytest.mark.timeout(60)


def test_max_time_adds_a_timer_that_stops_the_fit_and_a_given_timer_wins():
    trainer = quiet_trainer(max_time={"microseconds": 1})
    assert trainer.max_epochs == -1  # as Lightning: a time limit, no epoch limit
    trainer.fit(TinyModule(), loader(64, 16))
    assert trainer.global_step == 1  # out of time after the first batch
    assert sum(isinstance(c, Timer) for c in trainer.callbacks) == 1
    mine = Timer(duration="00:01:00:00")
    trainer = quiet_trainer(max_time="00:00:00:01", callbacks=[mine])
    assert [c for c in trainer.callbacks if isinstance(c, Timer)] == [mine]
    with pytest.raises(TandemConfigError, match="DD:HH:MM:SS"):
        quiet_trainer(max_time="ten minutes")


def test_max_epochs_minus_one_trains_until_something_stops_it():
    class StopAfterEpoch3(tandem.Callback):
        def on_train_epoch_end(self, trainer, module):
            trainer.should_stop = trainer.current_epoch == 2

    trainer = quiet_trainer(max_epochs=-1, limit_train_batches=2, callbacks=[StopAfterEpoch3()])
    trainer.fit(TinyModule(), loader(64, 16))
    assert trainer.current_epoch == 3 and trainer.global_step == 6


def test_overfit_batches_trains_and_validates_on_the_same_first_batches_in_order():
    seen: dict[str, list[float]] = {"train": [], "val": []}

    class Records(TinyModule):
        def training_step(self, batch, batch_idx):
            seen["train"].append(float(batch[0][0, 0]))
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            seen["val"].append(float(batch[0][0, 0]))

    data = make_data(64)
    with pytest.warns(UserWarning, match="overfit_batches"):
        trainer = quiet_trainer(max_epochs=2, overfit_batches=2)
        trainer.fit(Records(), DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=8))
    firsts = [float(data[i][0][0]) for i in (0, 8)]
    assert seen["train"] == firsts * 2  # the first two batches, in order, every epoch
    assert seen["val"] == firsts * 2
    assert trainer.overfit_batches == 2 and trainer.num_training_batches == 2 and trainer.num_val_batches == [2]


def test_reload_dataloaders_every_n_epochs_calls_the_hooks_again():
    calls = {"train": 0, "val": 0}

    class Reloading(TinyModule):
        def train_dataloader(self):
            calls["train"] += 1
            return loader(32, 16)

        def val_dataloader(self):
            calls["val"] += 1
            return loader(16, 16)

    quiet_trainer(max_epochs=5, reload_dataloaders_every_n_epochs=2).fit(Reloading())
    assert calls == {"train": 3, "val": 3}  # built for epochs 0, 2 and 4
    calls.update(train=0, val=0)
    quiet_trainer(max_epochs=5).fit(Reloading())
    assert calls == {"train": 1, "val": 1}


def test_barebones_turns_everything_off_and_refuses_what_it_cannot_keep(tmp_path):
    trainer = tandem.Trainer(accelerator="cpu", barebones=True, max_epochs=1, default_root_dir=tmp_path)
    assert trainer.barebones and trainer.loggers == [] and trainer.callbacks == []
    assert trainer.log_every_n_steps == 0 and trainer.num_sanity_val_steps == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(TinyModule(), loader(64, 16), loader(32, 16))
    assert trainer.global_step == 4 and trainer.callback_metrics == {}
    assert sum("barebones" in str(w.message) for w in caught) == 1  # self.log: one warning, nothing logged
    assert not list(tmp_path.iterdir())  # no logs, no checkpoints
    for given in (
        dict(enable_checkpointing=True),
        dict(logger=True),
        dict(log_every_n_steps=10),
        dict(profiler="simple"),
    ):
        with pytest.raises(TandemConfigError, match=f"barebones=True, {next(iter(given))}="):
            tandem.Trainer(accelerator="cpu", barebones=True, **given)
    tandem.Trainer(accelerator="cpu", barebones=True, enable_progress_bar=False)  # asking for "off" is fine


def test_log_every_n_steps_zero_publishes_no_step_values(tmp_path):
    rows: list[dict[str, float]] = []

    class Recording(tandem.loggers.CSVLogger):
        def log_metrics(self, metrics, step=None):
            rows.append(dict(metrics))

    trainer = quiet_trainer(max_epochs=1, log_every_n_steps=0, logger=Recording(tmp_path))
    trainer.fit(TinyModule(), loader(64, 16))
    assert rows == []  # TinyModule logs per step only: nothing reaches the loggers
    assert "train_loss" in trainer.callback_metrics  # still collected for callbacks


def test_lightnings_none_defaults_of_the_limits_and_val_check_interval_mean_all_and_once_an_epoch():
    """Lightning's Trainer defaults limit_*_batches and val_check_interval to None: a ported call that passes them
    explicitly trains on every batch and validates once an epoch, as 1.0 does."""
    limits = dict.fromkeys(
        ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches"), None
    )
    trainer = quiet_trainer(max_epochs=1, val_check_interval=None, **limits)
    trainer.fit(TinyModule(), loader(64, batch_size=16), loader(32, batch_size=16))
    assert trainer.global_step == 4 and trainer.num_val_batches == [2]
    assert trainer.limit_train_batches == 1.0 and trainer.val_check_interval == 1.0
