"""RichProgressBar and RichModelSummary (rich is in the test extra; its absence is simulated)."""

import importlib.util
import pickle

import pytest

from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import ModelSummary, ProgressBar, RichModelSummary, RichProgressBar
from tandem.utilities.exceptions import TandemConfigError

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


def test_without_rich_the_error_names_the_install_command(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "rich" else find_spec(name, *a))
    for callback in (RichProgressBar, RichModelSummary):
        with pytest.raises(TandemConfigError, match="rich package, which is not installed: pip install rich"):
            callback()
