from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

import tandem
from helpers import Nested, quiet_trainer
from tandem.callbacks.model_summary import ModelSummary
from tandem.utilities.exceptions import TandemConfigError

# Recorded from Lightning 2.6.6: what its ModelSummary callback logs at fit start for this module (max_depth=1)
LIGHTNING_LOGGED = """
  | Name    | Type       | Params | Mode  | FLOPs | In sizes | Out sizes
------------------------------------------------------------------------------
0 | encoder | Sequential | 416    | train | 3.1 K | [4, 8]   | [4, 16]  
1 | head    | Linear     | 34     | train | 256   | [4, 16]  | [4, 2]   
------------------------------------------------------------------------------
450       Trainable params
0         Non-trainable params
450       Total params
0.002     Total estimated model params size (MB)
7         Modules in train mode
0         Modules in eval mode
3.3 K     Total Flops"""  # noqa: W291 (the table's cells are padded, as Lightning pads them)


@pytest.fixture
def logged():
    """The messages of the callback's logger."""

    class Records(logging.Handler):
        messages: list[str] = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    handler = Records()
    handler.messages = []
    logger = logging.getLogger("tandem.callbacks.model_summary")
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


def fit(**kwargs):
    trainer = quiet_trainer(max_steps=1, **kwargs)
    trainer.fit(Nested(), DataLoader(torch.zeros(4, 8), batch_size=2))
    return trainer


def test_logs_lightnings_table_once_at_fit_start(logged):
    trainer = fit(enable_model_summary=True)
    assert [type(c) for c in trainer.callbacks if isinstance(c, ModelSummary)] == [ModelSummary]
    assert logged == [LIGHTNING_LOGGED]


def test_max_depth_zero_logs_nothing_and_other_ranks_do_not_log(logged):
    fit(callbacks=[ModelSummary(max_depth=0)])
    ModelSummary().on_fit_start(SimpleNamespace(is_global_zero=False), Nested())  # another DDP rank
    assert logged == []
    fit(callbacks=[ModelSummary(max_depth=2)])
    assert "encoder.2" in logged[0] and "encoder.2.0" not in logged[0]


def test_summarize_override_receives_the_columns_and_totals(logged):
    seen = {}

    class Custom(ModelSummary):
        @staticmethod
        def summarize(summary_data, total_parameters, trainable_parameters, model_size, total_training_modes, **kw):
            seen.update(data=summary_data, totals=(total_parameters, trainable_parameters, model_size), **kw)
            seen["modes"] = total_training_modes

    fit(callbacks=[Custom(header="x")])
    columns = dict(seen["data"])
    assert list(columns) == [" ", "Name", "Type", "Params", "Mode", "FLOPs", "In sizes", "Out sizes"]
    assert columns["Name"] == ["encoder", "head"] and columns["FLOPs"] == ["3.1 K", "256  "]
    assert seen["totals"] == (450, 450, pytest.approx(0.0018)) and seen["modes"] == {"train": 7, "eval": 0}
    assert seen["total_flops"] == 3328 and seen["header"] == "x"
    assert logged == []


def test_invalid_max_depth():
    with pytest.raises(TandemConfigError, match="max_depth"):
        ModelSummary(max_depth=-2)


def test_the_example_input_goes_through_the_datamodules_transfer_hook(logged):
    class Data(tandem.DataModule):
        def train_dataloader(self):
            return DataLoader(torch.zeros(4, 8), batch_size=2)

        def on_before_batch_transfer(self, batch, dataloader_idx):
            return batch[:1]

    quiet_trainer(max_steps=1, enable_model_summary=True).fit(Nested(), datamodule=Data())
    assert "| [1, 8]   | [1, 16]" in logged[0].splitlines()[3]  # as Lightning 2.6.6 does (checked on it)
