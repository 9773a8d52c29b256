import time
import warnings
from datetime import timedelta

import pytest

from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import ModelCheckpoint, Timer
from tandem.utilities.checkpoint import load_checkpoint_file
from tandem.utilities.exceptions import TandemConfigError

pytestmark = pytest.mark.timeout(60)


class Slow(TinyModule):
    def training_step(self, batch, batch_idx):
        time.sleep(0.05)
        return super().training_step(batch, batch_idx)


def test_step_interval_stops_training_once_the_time_is_used():
    timer = Timer(duration=timedelta(seconds=0.2))
    trainer = quiet_trainer(max_epochs=20, callbacks=[timer])
    trainer.fit(Slow(), loader(64, 8))  # 8 steps an epoch, each at least 0.05 s
    assert 1 <= trainer.global_step <= 4  # 4 steps take at least 0.2 s: it stops there at the latest
    assert timer.time_elapsed("train") >= 0.2 and timer.time_remaining() <= 0
    assert timer.end_time("train") is not None and timer.time_elapsed("validate") == 0.0


def test_epoch_interval_stops_at_the_end_of_the_epoch_and_times_validation():
    timer = Timer(duration={"seconds": 0.01}, interval="epoch")
    trainer = quiet_trainer(max_epochs=5, callbacks=[timer])
    trainer.fit(Slow(), loader(32, 16), loader(16))
    assert trainer.current_epoch == 1 and trainer.global_step == 2
    assert timer.time_elapsed("validate") > 0.0 and timer.start_time("test") is None


def test_training_time_is_kept_in_checkpoints_and_a_resumed_run_counts_it(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)
    first = Timer(duration="00:01:00:00")
    quiet_trainer(max_epochs=1, callbacks=[first, checkpoint], enable_checkpointing=True).fit(Slow(), loader(32, 16))
    used = load_checkpoint_file(tmp_path / "last.ckpt")["callbacks"]["Timer"]["time_elapsed"]["train"]
    assert 0.1 <= used <= first.time_elapsed("train")  # two steps of at least 0.05 s each, saved at the epoch end

    again = Timer(duration=timedelta(seconds=used / 2))  # less than the time already used: no step is taken
    resumed = quiet_trainer(max_epochs=3, callbacks=[again])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".*trained nothing")  # the Timer's stop is not "max_epochs=3 is reached"
        resumed.fit(Slow(), loader(32, 16), ckpt_path=tmp_path / "last.ckpt")
    assert resumed.global_step == 2  # the checkpoint's step: the fit stopped as it started
    assert again.time_elapsed("train") >= used


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"duration": "12:00:00"}, "expected 'DD:HH:MM:SS'"),
        ({"duration": {"fortnights": 1}}, "is not a duration"),
        ({"duration": 5}, "is not a duration"),
        ({"interval": "batch"}, "Timer: interval='batch' is not valid"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, message):
    with pytest.raises(TandemConfigError, match=message):
        Timer(**kwargs)
