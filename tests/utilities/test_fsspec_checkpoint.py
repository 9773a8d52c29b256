"""Checkpoints written to and read from fsspec URLs (``memory://`` here; ``s3://``, ``gs://`` the same way)."""

from __future__ import annotations

import pytest
import torch

from helpers import TinyModule, loader, quiet_trainer
from tandem.utilities.checkpoint import atomic_save, load_checkpoint_file
from tandem.utilities.cloud_io import is_url
from tandem.utilities.exceptions import CheckpointError

fsspec = pytest.importorskip("fsspec")


@pytest.fixture
def memory():
    fs = fsspec.filesystem("memory")
    yield fs
    if fs.exists("/tandem-test"):
        fs.rm("/tandem-test", recursive=True)


def test_is_url() -> None:
    assert is_url("memory://a/b.ckpt") and is_url("s3://bucket/b.ckpt")
    assert not is_url("runs/b.ckpt") and not is_url("file:///tmp/b.ckpt")


def test_save_to_a_url_leaves_only_the_file(memory) -> None:
    atomic_save({"tandem_version": "0", "w": torch.ones(2)}, "memory://tandem-test/x/a.ckpt")
    assert [entry.rsplit("/", 1)[-1] for entry in memory.ls("/tandem-test/x", detail=False)] == ["a.ckpt"]
    assert torch.equal(load_checkpoint_file("memory://tandem-test/x/a.ckpt")["w"], torch.ones(2))


def test_missing_url_is_named(memory) -> None:
    with pytest.raises(CheckpointError, match="memory://tandem-test/none.ckpt"):
        load_checkpoint_file("memory://tandem-test/none.ckpt")


def test_fit_resumes_from_a_checkpoint_saved_to_a_url(memory) -> None:
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(TinyModule(), loader())
    trainer.save_checkpoint("memory://tandem-test/run/epoch1.ckpt")
    resumed = quiet_trainer(max_epochs=2)
    resumed.fit(TinyModule(), loader(), ckpt_path="memory://tandem-test/run/epoch1.ckpt")
    assert resumed.global_step == 2 * trainer.global_step


def test_model_checkpoint_keeps_top_k_at_a_url_and_last_resumes(memory) -> None:
    from tandem.callbacks import Callback, ModelCheckpoint

    starts = []

    class StartStep(Callback):
        def on_train_start(self, trainer, module) -> None:
            starts.append(trainer.global_step)

    def trainer(epochs: int) -> object:
        callback = ModelCheckpoint(dirpath="memory://tandem-test/mc", save_last=True, save_top_k=1)
        return quiet_trainer(max_epochs=epochs, enable_checkpointing=True, callbacks=[callback, StartStep()])

    first = trainer(2)
    first.fit(TinyModule(), loader())
    names = sorted(entry.rsplit("/", 1)[-1] for entry in memory.ls("/tandem-test/mc", detail=False))
    assert names == ["epoch=1-step=8.ckpt", "last.ckpt"]  # epoch 0's file was removed from the URL
    resumed = trainer(3)
    resumed.fit(TinyModule(), loader(), ckpt_path="last")  # found at the URL
    assert starts == [0, 8] and resumed.global_step == 12


def test_default_root_dir_url_holds_last_and_resumes(memory) -> None:
    from tandem.callbacks import Callback, ModelCheckpoint

    starts = []

    class StartStep(Callback):
        def on_train_start(self, trainer, module) -> None:
            starts.append(trainer.global_step)

    def trainer(epochs: int) -> object:
        root = "memory://tandem-test/root"
        return quiet_trainer(
            max_epochs=epochs,
            default_root_dir=root,
            callbacks=[StartStep(), ModelCheckpoint(save_last=True, save_top_k=0)],
        )

    trainer(1).fit(TinyModule(), loader())
    assert memory.isfile("/tandem-test/root/checkpoints/last.ckpt")
    trainer(2).fit(TinyModule(), loader(), ckpt_path="last")
    assert starts == [0, 4]
