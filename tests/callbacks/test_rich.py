"""RichProgressBar and RichModelSummary (rich is in the test extra; its absence is simulated)."""

import importlib.util
import io
import pickle

import pytest
import torch

from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import ModelSummary, ProgressBar, RichModelSummary, RichProgressBar
from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.model_summary import summarize

pytestmark = pytest.mark.timeout(60)


def test_rich_bars_replace_the_tqdm_bar_for_every_stage(capsys):
    bar = RichProgressBar(leave=True)
    trainer = quiet_trainer(max_epochs=2, callbacks=[bar], enable_progress_bar=True, num_sanity_val_steps=1)
    assert [type(c) for c in trainer.callbacks if isinstance(c, ProgressBar)] == [RichProgressBar]
    model = TinyModule()
    trainer.fit(model, loader(32, 16), loader(16))
    trainer.test(model, loader(16))
    trainer.predict(model, loader(16))
    err = capsys.readouterr().err
    assert "Epoch 0" in err and "Epoch 1" in err and "Testing" in err and "Predicting" in err
    assert "train_loss:" in err and "2/2" in err  # the prog_bar metric, and batches done / total
    assert "it/s]" not in err  # no tqdm bar
    assert bar._progress is None and bar._bars == {}  # everything closed
    pickle.loads(pickle.dumps(bar))  # ddp_spawn pickles callbacks


def test_rich_model_summary_prints_one_table(capsys):
    trainer = quiet_trainer(max_epochs=1, callbacks=[RichModelSummary(max_depth=2)], enable_model_summary=True)
    assert [type(c) for c in trainer.callbacks if isinstance(c, ModelSummary)] == [RichModelSummary]
    trainer.fit(TinyModule(), loader(16))
    out = capsys.readouterr().out
    assert out.count("Total params") == 1 and "net.0" in out and "Linear" in out and "Trainable params" in out
    assert "Mode" in out and "FLOPs" in out and "Modules in train mode: 5" in out and "Total FLOPs: 0" in out


def test_a_rich_progress_bar_brings_the_rich_summary():
    trainer = quiet_trainer(callbacks=[RichProgressBar()], enable_progress_bar=True, enable_model_summary=True)
    assert [type(c) for c in trainer.callbacks if isinstance(c, ModelSummary)] == [RichModelSummary]


def test_rich_summary_rows_and_totals_as_lightning_prints_them():
    """Lightning's test_rich_summary_tuples and _model_size_formatting, through console_kwargs."""

    class Example(TinyModule):
        def __init__(self):
            super().__init__()
            self.example_input_array = torch.zeros(4, 8)

    out = io.StringIO()
    summary = summarize(Example())
    RichModelSummary.summarize(
        summary.summary_data, 1, 1, 5500.0, summary.total_training_modes, 1, console_kwargs={"file": out, "width": 200}
    )
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.getvalue().splitlines() if "│" in line]
    assert rows == [["0", "net", "Sequential", "195", "train", "1.4 K", "[4, 8]", "[4, 3]"]]
    assert all(name in out.getvalue() for name in ("Params", "Mode", "FLOPs", "In sizes", "Out sizes"))
    assert "Total estimated model params size (MB): 5,500.000" in out.getvalue() and "5.5 K" not in out.getvalue()


def test_without_rich_the_error_names_the_install_command(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rich" else find_spec(name, *a))
    for callback in (RichProgressBar, RichModelSummary):
        with pytest.raises(TandemConfigError, match="rich package, which is not installed: pip install rich"):
            callback()
