from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks.model_summary import ModelSummary, summarize
from tandem.utilities.exceptions import TandemConfigError


class Frozen(TinyModule):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)  # 40 parameters, frozen
        self.embed.weight.requires_grad_(False)
        self.head = nn.Linear(3, 3)
        self.tied = self.head  # the same module twice: counted once

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)


def test_table_lists_children_with_counts_and_totals():
    text = summarize(Frozen())
    lines = text.splitlines()
    assert lines[0].split() == ["|", "Name", "|", "Type", "|", "Params", "|", "Trainable"]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")] for line in lines[2:5]}
    assert rows["net"][2:] == ["Sequential", "195", "195"]
    assert rows["embed"][2:] == ["Embedding", "40", "0"]
    assert rows["head"][2:] == ["Linear", "12", "12"]
    assert "net.0" not in text and "tied" not in text
    assert "207        Trainable params" in text
    assert "40         Non-trainable params" in text
    assert "247        Total params" in text
    assert f"{247 * 4 / 1e6:<10.3f} Total estimated model params size (MB)" in text


def test_depth():
    assert "net.0" in summarize(TinyModule(), max_depth=2)
    assert "net.3" in summarize(TinyModule(), max_depth=-1)
    totals_only = summarize(TinyModule(), max_depth=0)
    assert "Name" not in totals_only and "195        Total params" in totals_only
    assert "1.2 K" in summarize(nn.Linear(100, 12))
    with pytest.raises(TandemConfigError, match="max_depth"):
        ModelSummary(max_depth=-2)


def test_printed_once_at_fit_start_on_rank_zero_only(capsys):
    trainer = quiet_trainer(enable_model_summary=True, max_steps=2)
    assert any(isinstance(c, ModelSummary) for c in trainer.callbacks)
    trainer.fit(TinyModule(), loader(32, batch_size=16))
    out = capsys.readouterr().out
    assert out.count("Total params") == 1 and "Sequential" in out

    ModelSummary().on_fit_start(SimpleNamespace(is_global_zero=False), TinyModule())  # another DDP rank
    assert capsys.readouterr().out == ""
