"""Atomic checkpoint writes: a save that dies half-way leaves the previous file intact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tandem.utilities.checkpoint import CHECKPOINT_MARKER, atomic_save, load_checkpoint_file

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
