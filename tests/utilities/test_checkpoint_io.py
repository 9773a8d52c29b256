"""Atomic checkpoint writes: a save that dies half-way leaves the previous file intact."""

from __future__ import annotations

import argparse
import collections
import enum
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from torch import nn

from tandem.utilities.checkpoint import (
    CHECKPOINT_MARKER,
    PICKLED_KEY,
    atomic_save,
    load_checkpoint_file,
    to_weights_only,
)
from tandem.utilities.exceptions import CheckpointError

pytestmark = pytest.mark.timeout(60)


def test_failed_save_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_save({CHECKPOINT_MARKER: "x", "value": 1}, path)

    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        atomic_save({CHECKPOINT_MARKER: "x", "value": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint_file(path)["value"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_process_killed_while_saving_leaves_a_loadable_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    code = f"""
import torch
from tandem.utilities.checkpoint import atomic_save
big = torch.randn(4_000_000)
i = 0
print("ready", flush=True)
while True:
    i += 1
    atomic_save({{"tandem_version": "x", "i": i, "big": big}}, {str(path)!r})
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # let it be in the middle of another save
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    checkpoint = load_checkpoint_file(path)
    assert checkpoint["i"] >= 1 and checkpoint["big"].numel() == 4_000_000


# ---------------------------------------------------------------------- plain torch.load(path) reads every checkpoint
class Color(enum.Enum):
    RED = 1


Point = collections.namedtuple("Point", "x y")


def test_values_torch_refuses_are_pickled_into_tensors_and_come_back(tmp_path):
    odd = {
        "path": pathlib.Path("/data/train"),
        "color": Color.RED,
        "numpy": np.float64(0.5),
        "array": np.arange(3),
        "namespace": argparse.Namespace(lr=0.1),
        "point": Point(1, 2),
        "layer": nn.Linear(2, 2),
        "by_tuple": {(1, "a"): [1.5, None, {"deep": Color.RED}]},
        "by_enum": {Color.RED: 1},  # a key torch refuses: the whole dict is pickled
        "plain": {"lr": 0.1, "betas": (0.9, 0.99), "names": {"a", "b"}, "t": torch.ones(2), "dtype": torch.float16},
    }
    path = tmp_path / "c.ckpt"
    atomic_save({CHECKPOINT_MARKER: "x", "hparams": to_weights_only(odd)}, path)
    raw = torch.load(path)  # torch's default: weights_only=True
    assert raw["hparams"]["plain"]["betas"] == (0.9, 0.99)  # safe values are stored as they are
    assert set(raw["hparams"]["path"]) == {PICKLED_KEY}
    back = load_checkpoint_file(path)["hparams"]
    assert back["path"] == odd["path"] and back["color"] is Color.RED and back["point"] == Point(1, 2)
    assert back["numpy"] == 0.5 and type(back["numpy"]) is np.float64 and back["array"].tolist() == [0, 1, 2]
    assert back["namespace"] == odd["namespace"] and back["by_enum"] == {Color.RED: 1}
    assert back["by_tuple"] == {(1, "a"): [1.5, None, {"deep": Color.RED}]}
    assert torch.equal(back["layer"].weight, odd["layer"].weight)
    assert back["plain"]["names"] == {"a", "b"} and back["plain"]["dtype"] is torch.float16


def test_a_value_that_cannot_be_pickled_names_where_it_is():
    with pytest.raises(CheckpointError, match=r"checkpoint\['hparams'\]\['fn'\] holds a function that cannot be"):
        to_weights_only({"hparams": {"fn": lambda x: x}})


def test_a_state_dict_or_lightning_file_gets_a_load_recipe_that_works(tmp_path):
    bare = tmp_path / "bare.pt"
    torch.save(nn.Linear(2, 2).state_dict(), bare)
    with pytest.raises(CheckpointError, match=r"bare weights .*module.load_state_dict\(torch.load\(path\)\)"):
        load_checkpoint_file(bare)
    nn.Linear(2, 2).load_state_dict(torch.load(bare))  # the recipe works

    lightning = tmp_path / "lightning.ckpt"
    torch.save(
        {"state_dict": nn.Linear(2, 2).state_dict(), "pytorch-lightning_version": "2.6.0", "x": Color.RED}, lightning
    )
    with pytest.raises(CheckpointError, match=r"torch.load\(path, weights_only=False\)\['state_dict'\]"):
        load_checkpoint_file(lightning)
    nn.Linear(2, 2).load_state_dict(torch.load(lightning, weights_only=False)["state_dict"])
