"""AsyncCheckpointIO: checkpoints written in a background thread, atomically, one at a time, errors reported."""

from __future__ import annotations

import os
import pickle
import signal
import stat
import threading
import time
from pathlib import Path

import pytest
import torch

import tandem
from helpers import TinyModule, clear_launch_variables, killed_mid_save, loader, quiet_trainer
from tandem.callbacks import ModelCheckpoint
from tandem.strategies import AsyncCheckpointIO
from tandem.strategies import checkpoint_io as checkpoint_io_module
from tandem.utilities.checkpoint import CHECKPOINT_MARKER, atomic_save, load_checkpoint_file
from tandem.utilities.exceptions import Preempted


def _checkpoint(value: float) -> dict:
    return {CHECKPOINT_MARKER: "test", "state_dict": {"w": torch.full((4,), value)}, "nested": [{"n": 1}]}


class _GatedWrites:
    """``atomic_save`` that records each write and holds it until the test opens the gate."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []
        self.gate = threading.Event()

    def __call__(self, obj, path) -> None:
        self.started.append(os.path.basename(path))
        assert self.gate.wait(30)
        atomic_save(obj, path)
        self.finished.append(os.path.basename(path))


def test_the_save_returns_after_the_copy_and_one_write_is_in_flight(tmp_path, monkeypatch):
    writes = _GatedWrites()
    monkeypatch.setattr(checkpoint_io_module, "atomic_save", writes)
    writer = AsyncCheckpointIO()
    state = _checkpoint(1.0)
    writer.save_checkpoint(state, tmp_path / "a.ckpt")  # returns while the write is held
    assert writer.pending_path == str(tmp_path / "a.ckpt") and writes.finished == []
    state["state_dict"]["w"].fill_(9.0)  # the next steps change the parameters in place
    state["nested"][0]["n"] = 9
    second = threading.Thread(target=writer.save_checkpoint, args=(_checkpoint(2.0), tmp_path / "b.ckpt"))
    second.start()
    second.join(0.3)
    assert second.is_alive() and writes.started == ["a.ckpt"]  # the second save waits for the first write
    writes.gate.set()
    second.join(10)
    writer.wait()
    assert writes.finished == ["a.ckpt", "b.ckpt"] and writer.pending_path is None
    first = load_checkpoint_file(tmp_path / "a.ckpt")  # checksum verified: written whole
    assert torch.equal(first["state_dict"]["w"], torch.ones(4)) and first["nested"] == [{"n": 1}]  # as at the save
    writer.teardown()


def test_a_failed_write_is_raised_once_by_the_next_save_naming_the_file(tmp_path, monkeypatch):
    def failing(obj, path):
        raise RuntimeError("the disk is on fire")

    monkeypatch.setattr(checkpoint_io_module, "atomic_save", failing)
    writer = AsyncCheckpointIO()
    writer.save_checkpoint(_checkpoint(1.0), tmp_path / "a.ckpt")  # no error yet: it is in the background
    monkeypatch.setattr(checkpoint_io_module, "atomic_save", atomic_save)
    with pytest.raises(RuntimeError, match="the disk is on fire") as caught:
        writer.save_checkpoint(_checkpoint(2.0), tmp_path / "b.ckpt")
    assert str(tmp_path / "a.ckpt") in "".join(caught.value.__notes__)
    assert not (tmp_path / "b.ckpt").exists()  # the failed save started no write
    writer.save_checkpoint(_checkpoint(2.0), tmp_path / "b.ckpt")  # reported once; the writer goes on
    writer.teardown()
    assert load_checkpoint_file(tmp_path / "b.ckpt")["state_dict"]["w"][0] == 2.0


class _NoNotes(RuntimeError):
    """An exception as on Python 3.10, which has no ``add_note``."""

    def __getattribute__(self, name: str):
        if name == "add_note":
            raise AttributeError(name)
        return super().__getattribute__(name)


def test_a_failed_write_names_the_file_where_exceptions_have_no_notes(tmp_path, monkeypatch):
    def failing(obj, path):
        raise _NoNotes("the disk is on fire")

    monkeypatch.setattr(checkpoint_io_module, "atomic_save", failing)
    writer = AsyncCheckpointIO()
    writer.save_checkpoint(_checkpoint(1.0), tmp_path / "a.ckpt")
    with pytest.raises(_NoNotes, match="the disk is on fire") as caught:  # the write's own error, not AttributeError
        writer.wait()
    assert str(tmp_path / "a.ckpt") in str(caught.value)  # the note joins the message
    writer.teardown()


def test_a_real_write_error_names_the_file(tmp_path):
    (tmp_path / "blocker").write_text("a file where a folder should be")
    writer = AsyncCheckpointIO()
    writer.save_checkpoint(_checkpoint(1.0), tmp_path / "blocker" / "a.ckpt")
    with pytest.raises(OSError, match="blocker") as caught:
        writer.wait()
    assert "background write of checkpoint" in "".join(caught.value.__notes__)
    writer.wait()  # raised once


def test_fit_waits_for_the_last_write_and_reports_its_failure(tmp_path, monkeypatch):
    done: list[float] = []

    def slow(obj, path):
        time.sleep(0.3)
        atomic_save(obj, path)
        done.append(time.monotonic())

    monkeypatch.setattr(checkpoint_io_module, "atomic_save", slow)
    trainer = quiet_trainer(
        max_epochs=2, default_root_dir=tmp_path, plugins=[AsyncCheckpointIO()], callbacks=[ModelCheckpoint(tmp_path)]
    )
    trainer.fit(TinyModule(), loader())
    returned = time.monotonic()
    assert len(done) == 2 and done[-1] <= returned  # the last file was on the disk before fit returned
    assert load_checkpoint_file(tmp_path / "epoch=1-step=8.ckpt")["global_step"] == 8
    assert not (tmp_path / "epoch=0-step=4.ckpt").exists()  # save_top_k=1 removed the first (after its write)

    def failing(obj, path):
        raise RuntimeError("no space left")

    monkeypatch.setattr(checkpoint_io_module, "atomic_save", failing)
    trainer = quiet_trainer(max_epochs=1, plugins=[AsyncCheckpointIO()], callbacks=[ModelCheckpoint(tmp_path / "b")])
    with pytest.raises(RuntimeError, match="no space left") as caught:
        trainer.fit(TinyModule(), loader())  # the only write fails in the background: fit raises it
    assert "epoch=0-step=4.ckpt" in "".join(caught.value.__notes__) and trainer.state.status == "interrupted"


def test_save_checkpoint_outside_a_run_waits_for_its_file(tmp_path, monkeypatch):
    def slow(obj, path):
        time.sleep(0.3)
        atomic_save(obj, path)

    monkeypatch.setattr(checkpoint_io_module, "atomic_save", slow)
    trainer = quiet_trainer(max_steps=1, plugins=[AsyncCheckpointIO()])
    trainer.fit(TinyModule(), loader())
    trainer.save_checkpoint(tmp_path / "after.ckpt")
    assert trainer.strategy.checkpoint_io.pending_path is None
    assert load_checkpoint_file(tmp_path / "after.ckpt")["global_step"] == 1


class _SignalInEpoch1(tandem.Callback):
    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if (trainer.current_epoch, batch_idx) == (1, 0):
            os.kill(os.getpid(), signal.SIGUSR1)


def test_a_preemption_stop_writes_last_ckpt_before_the_job_is_requeued(tmp_path, monkeypatch):
    """The requeue (scontrol) runs only once last.ckpt is on the disk: the next job resumes from it."""
    clear_launch_variables(monkeypatch)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    last = tmp_path / "checkpoints" / "last.ckpt"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\ntest -f {last} && echo present >> {tmp_path / 'scontrol.txt'}\n")
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")

    def slow(obj, path):
        time.sleep(0.3)
        atomic_save(obj, path)

    monkeypatch.setattr(checkpoint_io_module, "atomic_save", slow)
    trainer = quiet_trainer(
        max_epochs=3,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        plugins=[AsyncCheckpointIO()],
        callbacks=[_SignalInEpoch1()],
    )
    with pytest.raises(Preempted):
        trainer.fit(TinyModule(), loader())
    assert (tmp_path / "scontrol.txt").read_text().split() == ["present"]
    assert load_checkpoint_file(last)["global_step"] == 5


@pytest.mark.timeout(120)
def test_a_process_killed_during_a_background_write_keeps_the_previous_file(tmp_path):
    """SIGKILL while the background thread writes the second checkpoint: the first is intact (its checksum
    holds), and the next save into the folder (a resumed run, writing in the background too) removes the
    temporary the killed write left."""
    folder = killed_mid_save(tmp_path, "async")  # the script checks that the write runs off the main thread
    (stale,) = [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    (kept,) = [p for p in folder.iterdir() if p.suffix == ".ckpt"]
    assert load_checkpoint_file(kept)["global_step"] == 4  # the first epoch's file, whole
    trainer = quiet_trainer(
        default_root_dir=tmp_path, logger=True, enable_checkpointing=True, max_epochs=3, plugins=[AsyncCheckpointIO()]
    )
    trainer.fit(TinyModule(), loader(), ckpt_path=str(kept))
    assert trainer.global_step == 12 and not stale.exists()
    assert not [p for p in Path(trainer.log_dir).rglob("*.tmp")]


def test_the_plugin_travels_to_a_spawned_process_without_its_thread(tmp_path):
    """ddp_spawn pickles the strategy: the copy gets its own thread when it first saves."""
    writer = AsyncCheckpointIO()
    writer.save_checkpoint(_checkpoint(1.0), tmp_path / "a.ckpt")
    copy = pickle.loads(pickle.dumps(writer))
    assert copy.pending_path is None
    copy.save_checkpoint(_checkpoint(2.0), tmp_path / "b.ckpt")
    copy.teardown()
    writer.teardown()
    assert [load_checkpoint_file(tmp_path / n)["state_dict"]["w"][0] for n in ("a.ckpt", "b.ckpt")] == [1.0, 2.0]
