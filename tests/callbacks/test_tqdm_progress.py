import pytest
import torch

import tandem.callbacks.progress_bar as progress_bar_module
from callbacks._fake import fake_trainer
from helpers import quiet_trainer
from tandem.callbacks import ProgressBar, RichProgressBar, TQDMProgressBar
from tandem.utilities.exceptions import TandemConfigError


def test_lightnings_positional_arguments_and_the_old_name_both_work():
    bar = TQDMProgressBar(5, 2, True)  # refresh_rate, process_position, leave: Lightning's order
    assert (bar.refresh_rate, bar.process_position, bar.leave) == (5, 2, True)
    assert isinstance(bar, ProgressBar) and not issubclass(RichProgressBar, TQDMProgressBar)  # as Lightning's tree
    assert ProgressBar(3).refresh_rate == 3
    with pytest.raises(TandemConfigError, match="process_position=-1 is out of range"):
        TQDMProgressBar(process_position=-1)


def test_the_trainers_default_bar_is_a_tqdm_progress_bar_and_a_given_one_is_kept():
    (default,) = [c for c in quiet_trainer(enable_progress_bar=True).callbacks if isinstance(c, ProgressBar)]
    assert type(default) is TQDMProgressBar
    old = ProgressBar()
    assert [
        c for c in quiet_trainer(enable_progress_bar=True, callbacks=[old]).callbacks if isinstance(c, ProgressBar)
    ] == [old]


def test_process_position_moves_the_bars_down(capsys, monkeypatch):
    monkeypatch.setattr(progress_bar_module, "_is_terminal", lambda file: True)  # bars drawn in place
    bar = TQDMProgressBar(process_position=2)
    trainer = fake_trainer(".")
    bar.on_train_epoch_start(trainer, None)
    bar.on_validation_start(trainer, None)
    assert abs(bar._bars["train"].pos) == 2 and abs(bar._bars["eval"].pos) == 3  # tqdm keeps -position
    bar.on_validation_end(trainer, None)
    bar.on_train_batch_end(trainer, None, {"loss": torch.tensor(1.0)}, None, 0)
    bar.on_train_end(trainer, None)
