"""A sharded checkpoint (torch.distributed.checkpoint's directory) is read without running what it holds: its
``.metadata`` and its non-tensor items hold plain data or are refused, naming what they hold; trusted
(``weights_only=False``), torch's own reader runs them (so these tests can fail)."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from helpers import Payload
from tandem.strategies.sharded_reader import Refused, readers, refusal, refused_message

pytestmark = pytest.mark.timeout(60)


def _save(state: dict, path: Path) -> None:
    with warnings.catch_warnings():  # torch warns that no process group is initialised: one process saves it all
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(path))


def _load(target: dict, path: Path, trusted: bool) -> Refused | None:
    """Load ``path`` into ``target``; what tandem's reader refused (the error raised is dcp's own)."""
    arguments = readers(path, trusted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            dcp.load(target, **arguments)
        except CheckpointException:  # a BaseException: dcp's error of every rank
            if refusal(arguments) is None:
                raise
    return refusal(arguments)


def test_plain_sharded_state_loads_as_torch_would(tmp_path):
    state = {"w": torch.randn(3, 2), "groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": ["0"], "name": "x"}]}
    _save(state, tmp_path / "c")
    target = {"w": torch.zeros(3, 2), "groups": [{"lr": 0.0, "betas": (0, 0), "params": [""], "name": ""}]}
    _load(target, tmp_path / "c", trusted=False)
    assert torch.equal(target["w"], state["w"]) and target["groups"] == state["groups"]


def test_a_non_tensor_item_holding_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    _save({"w": torch.ones(2), "x": Payload(marker)}, tmp_path / "c")
    refused = _load({"w": torch.zeros(2), "x": None}, tmp_path / "c", trusted=False)
    assert isinstance(refused, Refused) and refused.what == "the item 'x' (exec)"
    assert not marker.exists()
    message = refused_message(tmp_path / "c", refused)
    assert str(tmp_path / "c") in message and "weights_only=False" in message
    _load({"w": torch.zeros(2), "x": None}, tmp_path / "c", trusted=True)  # torch's planner unpickles it
    assert marker.read_text() == "ran"


def test_a_metadata_file_holding_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    _save({"w": torch.ones(2)}, tmp_path / "c")
    (tmp_path / "c" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    refused = _load({"w": torch.zeros(2)}, tmp_path / "c", trusted=False)
    assert refused is not None and refused.what == "builtins.exec" and not marker.exists()
    with pytest.raises(CheckpointException):  # the payload returns None, which is no Metadata
        _load({"w": torch.zeros(2)}, tmp_path / "c", trusted=True)
    assert marker.read_text() == "ran"
