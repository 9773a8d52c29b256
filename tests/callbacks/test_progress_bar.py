import types

import pytest
import torch

import tandem.callbacks.progress_bar as progress_bar_module
from callbacks._fake import fake_trainer, metrics
from tandem.callbacks import ProgressBar
from tandem.utilities.exceptions import TandemConfigError


def _train_epoch(bar, trainer, epoch=0, loss=0.5, validate=False):
    trainer.current_epoch = epoch
    bar.on_train_epoch_start(trainer, None)
    for batch_idx in range(trainer.num_training_batches):
        bar.on_train_batch_end(trainer, None, {"loss": torch.tensor(loss)}, None, batch_idx)
    if validate:
        _evaluate(bar, trainer, "validation", trainer.num_val_batches)
    bar.on_train_epoch_end(trainer, None)


def _evaluate(bar, trainer, kind, n):
    getattr(bar, f"on_{kind}_start")(trainer, None)
    for batch_idx in range(n):
        getattr(bar, f"on_{kind}_batch_end")(trainer, None, None, None, batch_idx)
    getattr(bar, f"on_{kind}_end")(trainer, None)


def _whole_run(bar, trainer):
    trainer.sanity_checking = True
    bar.on_sanity_check_start(trainer, None)
    _evaluate(bar, trainer, "validation", 2)
    bar.on_sanity_check_end(trainer, None)
    trainer.sanity_checking = False
    for epoch in range(2):
        _train_epoch(bar, trainer, epoch, validate=True)
    bar.on_train_end(trainer, None)
    _evaluate(bar, trainer, "test", trainer.num_test_batches)
    _evaluate(bar, trainer, "predict", trainer.num_predict_batches)


def test_rank_zero_shows_epoch_loss_and_progress_bar_metrics(capsys):
    bar = ProgressBar()
    trainer = fake_trainer(".")
    trainer.progress_bar_metrics = metrics(val_acc=0.75)
    _train_epoch(bar, trainer, epoch=3, loss=0.25)
    bar.on_train_end(trainer, None)
    err = capsys.readouterr().err
    assert "Epoch 3" in err and "10/10" in err and "it/s" in err
    assert "loss=0.25" in err and "val_acc=0.75" in err


def test_other_ranks_draw_and_print_nothing(capsys):
    bar = ProgressBar()
    _whole_run(bar, fake_trainer(".", rank=1))
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


@pytest.fixture
def terminal(monkeypatch):
    """stderr counts as a terminal: bars are drawn in place (under pytest it is a capture buffer)."""
    monkeypatch.setattr(progress_bar_module, "_is_terminal", lambda file: True)


def test_sanity_validation_test_and_predict_bars_open_and_close(capsys, terminal):
    bar = ProgressBar()
    trainer = fake_trainer(".")
    _whole_run(bar, trainer)
    err = capsys.readouterr().err
    for text in ("Sanity Checking", "Validation", "Epoch 1", "Testing", "3/3", "Predicting", "4/4"):
        assert text in err
    assert err.count("Epoch 0") >= 1
    assert bar._bars == {}  # every bar closed by its end hook


def test_on_exception_closes_open_bars(capsys):
    bar = ProgressBar()
    trainer = fake_trainer(".")
    bar.on_train_epoch_start(trainer, None)
    bar.on_validation_start(trainer, None)
    bar.on_exception(trainer, None, RuntimeError("boom"))
    assert bar._bars == {}


def test_metrics_are_read_from_the_device_at_most_every_half_second(monkeypatch):
    clock = types.SimpleNamespace(now=100.0)
    monkeypatch.setattr(progress_bar_module, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    reads = []
    real_to_float = progress_bar_module.to_float

    def counting_to_float(values):
        reads.append(1)
        return real_to_float(values)

    monkeypatch.setattr(progress_bar_module, "to_float", counting_to_float)

    bar = ProgressBar()
    trainer = fake_trainer(".", num_training_batches=50)
    bar.on_train_epoch_start(trainer, None)
    for batch_idx in range(20):
        bar.on_train_batch_end(trainer, None, {"loss": torch.tensor(1.0)}, None, batch_idx)
    assert reads == []  # no host sync per step
    clock.now += 0.6
    for batch_idx in range(20, 30):
        bar.on_train_batch_end(trainer, None, {"loss": torch.tensor(1.0)}, None, batch_idx)
    assert len(reads) == 1
    bar.on_train_epoch_end(trainer, None)
    assert len(reads) == 2
    bar.on_train_end(trainer, None)


def test_loss_is_kept_without_its_graph():
    bar = ProgressBar()
    trainer = fake_trainer(".")
    bar.on_train_epoch_start(trainer, None)
    loss = (torch.ones(2, requires_grad=True) * 2).sum()
    bar.on_train_batch_end(trainer, None, {"loss": loss}, None, 0)
    assert not bar._loss.requires_grad
    bar.on_train_end(trainer, None)


def test_refresh_rate_zero_disables_and_negative_is_rejected(capsys):
    _whole_run(ProgressBar(refresh_rate=0), fake_trainer("."))
    assert capsys.readouterr().err == ""
    with pytest.raises(TandemConfigError, match="ProgressBar: refresh_rate=-1 is out of range"):
        ProgressBar(refresh_rate=-1)


def _last_line(err: str) -> str:
    return [line for line in err.replace("\r", "\n").splitlines() if line.strip()][-1]


@pytest.mark.parametrize("columns", [80, 100, 140])
def test_each_metric_shows_once_and_the_bar_stays_readable_in_a_narrow_terminal(monkeypatch, capsys, terminal, columns):
    import tqdm.std

    monkeypatch.setattr(tqdm.std, "_screen_shape_wrapper", lambda: lambda fp: (columns - 1, 24))  # a terminal
    bar = ProgressBar()
    trainer = fake_trainer(".", num_training_batches=100)
    trainer.progress_bar_metrics = metrics(train_loss=0.123456, val_loss=0.456789, val_acc=0.98125)
    _train_epoch(bar, trainer, epoch=12, loss=0.123456)  # train_loss is the loss: shown once, under its name
    bar.on_train_end(trainer, None)
    line = _last_line(capsys.readouterr().err)
    assert len(line) <= columns - 1
    assert line.endswith(("train_loss=0.123, val_loss=0.457, val_acc=0.981", "val_acc=0.981]"))
    assert "loss=0.123" in line and line.count("0.123") == 1 and " loss=" not in line
    assert line.startswith("Epoch 12: 100%|") and line.count("█") >= 10  # the bar keeps 10 columns, not one
    if columns >= 100:
        assert "100/100" in line  # at 80 columns the counts give way to the bar and the metrics
    if columns >= 140:
        assert "it/s" in line  # room for everything: tqdm's own layout


def test_the_loss_shows_when_no_progress_bar_metric_holds_it(capsys):
    bar = ProgressBar()
    trainer = fake_trainer(".")
    trainer.progress_bar_metrics = metrics(val_acc=0.5)
    _train_epoch(bar, trainer, loss=0.75)
    bar.on_train_end(trainer, None)
    assert "loss=0.75, val_acc=0.5" in capsys.readouterr().err


# ---------------------------------------------------------------------- a file or a pipe; messages between frames
def test_without_a_terminal_plain_lines_replace_the_frames(capsys):
    bar = ProgressBar()
    trainer = fake_trainer(".")
    trainer.progress_bar_metrics = metrics(val_acc=0.75)
    _whole_run(bar, trainer)
    err = capsys.readouterr().err
    assert "\r" not in err  # no frames
    lines = err.splitlines()
    assert [line.split(":")[0] for line in lines] == ["Epoch 0", "Epoch 1", "Testing", "Predicting"]
    assert lines[0].startswith("Epoch 0: 10/10 [") and lines[0].endswith("loss=0.5, val_acc=0.75]")
    assert lines[2].startswith("Testing: 3/3 [") and lines[3].startswith("Predicting: 4/4 [")


def test_without_a_terminal_a_long_epoch_prints_a_line_every_30_seconds(monkeypatch, capsys):
    clock = types.SimpleNamespace(now=100.0)
    monkeypatch.setattr(progress_bar_module, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    bar = ProgressBar()
    trainer = fake_trainer(".", num_training_batches=100)
    bar.on_train_epoch_start(trainer, None)
    for batch_idx in range(100):
        clock.now += 1.0  # 100 s in all: lines at 30, 60 and 90 s, then the epoch's end
        bar.on_train_batch_end(trainer, None, {"loss": torch.tensor(1.0)}, None, batch_idx)
    bar.on_train_epoch_end(trainer, None)
    bar.on_train_end(trainer, None)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" [")[0] for line in lines] == [f"Epoch 0: {n}/100" for n in (30, 60, 90, 100)]


def test_info_messages_start_on_their_own_line_while_bars_are_drawn(capsys, terminal):
    from tandem.utilities.rank_zero import rank_zero_info, rank_zero_print

    bar = ProgressBar()
    trainer = fake_trainer(".")
    bar.on_train_epoch_start(trainer, None)
    for batch_idx in range(5):
        bar.on_train_batch_end(trainer, None, {"loss": torch.tensor(1.0)}, None, batch_idx)
    rank_zero_info("EarlyStopping: val_loss did not improve")
    rank_zero_print("printed by the module")
    bar.on_train_end(trainer, None)
    captured = capsys.readouterr()
    before = captured.err.split("EarlyStopping:")[0]
    assert "Epoch 0" in before and before[-1] in "\r\n"  # the frame was cleared first, not written after
    assert "printed by the module\n" in captured.out
