"""ModelCheckpoint(save_last="link") as Lightning 2.6, and the atomic link under it (``atomic_link``)."""

import os

import pytest
import torch

from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import ModelCheckpoint
from tandem.utilities import atomic
from tandem.utilities.atomic import atomic_link
from tandem.utilities.cloud_io import remove_file
from tandem.utilities.exceptions import TandemConfigError, TandemWarning


class _ScoredModule(TinyModule):
    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.log("score", float(self.current_epoch))  # rises every epoch: each epoch makes the top k


def _fit(tmp_path, callback, max_epochs=3, ckpt_path=None):
    trainer = quiet_trainer(max_epochs=max_epochs, callbacks=[callback], default_root_dir=tmp_path)
    trainer.fit(_ScoredModule(), loader(32, 8), loader(16, 8), ckpt_path=ckpt_path)
    return trainer


def _listing(folder):
    return {
        name: os.readlink(folder / name) if os.path.islink(folder / name) else "file" for name in os.listdir(folder)
    }


@pytest.mark.parametrize("save_last", [True, "link"])
def test_one_last_file_named_by_its_template_a_link_or_a_copy(tmp_path, monkeypatch, save_last):
    monkeypatch.setattr(ModelCheckpoint, "CHECKPOINT_NAME_LAST", "last-{epoch}")
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="score", mode="max", save_top_k=-1, save_last=save_last)
    _fit(tmp_path, callback)
    ckpts = {f"epoch={e}-step={4 * (e + 1)}.ckpt": "file" for e in range(3)}
    last = "epoch=2-step=12.ckpt" if save_last == "link" else "file"  # relative: the folder can move
    assert _listing(tmp_path) == {**ckpts, "last-epoch=2.ckpt": last}
    assert callback.last_model_path == str(tmp_path / "last-epoch=2.ckpt")
    if save_last == "link":
        assert os.path.realpath(callback.last_model_path) == str(tmp_path / "epoch=2-step=12.ckpt")


def test_a_linked_last_resumes_with_ckpt_path_last(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="score", mode="max", save_last="link")
    _fit(tmp_path, callback, max_epochs=2)
    assert _listing(tmp_path) == {"epoch=1-step=8.ckpt": "file", "last.ckpt": "epoch=1-step=8.ckpt"}
    resumed = ModelCheckpoint(dirpath=tmp_path, monitor="score", mode="max", save_last="link")
    trainer = _fit(tmp_path, resumed, max_epochs=3, ckpt_path="last")
    assert trainer.global_step == 12  # from step 8 on
    # the link moved to the new best; the file it pointed to before was dropped from the top 1
    assert _listing(tmp_path) == {"epoch=2-step=12.ckpt": "file", "last.ckpt": "epoch=2-step=12.ckpt"}


def test_a_last_link_whose_checkpoint_was_deleted_is_skipped_by_ckpt_path_last(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="score", mode="max", save_last="link")
    _fit(tmp_path, callback, max_epochs=2)
    (tmp_path / "epoch=1-step=8.ckpt").unlink()  # by hand: last.ckpt now points nowhere
    resumed = ModelCheckpoint(dirpath=tmp_path, monitor="score", mode="max", save_last="link")
    with pytest.warns(TandemWarning) as got:
        trainer = _fit(tmp_path, resumed, max_epochs=1, ckpt_path="last")
    said = [str(w.message) for w in got]
    assert any("last.ckpt is a link to epoch=1-step=8.ckpt, which no longer exists" in m for m in said), said
    assert any("found no last.ckpt yet" in m for m in said), said
    assert trainer.global_step == 4  # from scratch, no error


def test_link_without_top_k_files_writes_last_as_a_file(tmp_path):
    callback = ModelCheckpoint(dirpath=tmp_path, save_top_k=0, save_last="link", every_n_train_steps=2)
    _fit(tmp_path, callback, max_epochs=1)
    assert _listing(tmp_path) == {"last.ckpt": "file"}
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 4


def test_link_falls_back_to_an_atomic_copy_where_links_cannot_be_made(tmp_path, monkeypatch):
    def no_links(*args, **kwargs):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "symlink", no_links)
    callback = ModelCheckpoint(dirpath=tmp_path, monitor="score", mode="max", save_last="link")
    _fit(tmp_path, callback, max_epochs=2)
    assert _listing(tmp_path) == {"epoch=1-step=8.ckpt": "file", "last.ckpt": "file"}
    assert (tmp_path / "last.ckpt").read_bytes() == (tmp_path / "epoch=1-step=8.ckpt").read_bytes()


def test_link_needs_a_local_folder(tmp_path):
    callback = ModelCheckpoint(dirpath="memory://not-a-local-folder", save_last="link")
    trainer = quiet_trainer(max_epochs=1, callbacks=[callback], default_root_dir=tmp_path)
    with pytest.raises(ValueError, match=r"save_last='link'.* is only supported for local file paths") as err:
        callback.setup(trainer, TinyModule(), "fit")
    assert isinstance(err.value, TandemConfigError) and "Use save_last=True" in str(err.value)
    ModelCheckpoint(dirpath="memory://not-a-local-folder", save_last=True)  # a copy is fine there


def test_save_last_takes_true_false_none_or_link():
    with pytest.raises(TandemConfigError, match=r"save_last='lnk' is not valid; expected one of: None, False, True"):
        ModelCheckpoint(save_last="lnk")


# ---------------------------------------------------------------------- atomic_link
def test_atomic_link_replaces_a_file_a_link_or_a_directory_in_one_rename(tmp_path):
    target = tmp_path / "epoch=1.ckpt"
    target.write_bytes(b"new")
    link = tmp_path / "last.ckpt"
    for previous in ("file", "link", "directory"):
        remove_file(link)
        if previous == "file":
            link.write_bytes(b"old")
        elif previous == "link":
            (tmp_path / "old.ckpt").write_bytes(b"old")
            os.symlink("old.ckpt", link)
        else:
            (link / "shard").mkdir(parents=True)
        atomic_link(target, link)
        assert os.readlink(link) == "epoch=1.ckpt" and link.read_bytes() == b"new"
        assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]  # no temporaries left
    assert (tmp_path / "old.ckpt").read_bytes() == b"old"  # replacing a link never touches what it pointed to


def test_atomic_link_never_leaves_the_path_missing(tmp_path, monkeypatch):
    """The link is made under a temporary name and renamed onto the path: at no moment is there no last.ckpt."""
    target, link = tmp_path / "epoch=1.ckpt", tmp_path / "last.ckpt"
    target.write_bytes(b"new")
    link.write_bytes(b"old")
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append((os.path.islink(src), os.path.exists(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)
    atomic_link(target, link)
    assert seen == [(True, True)]  # one rename of a finished link onto the existing file


def test_removing_a_link_keeps_what_it_points_to(tmp_path):
    shards = tmp_path / "epoch=1.ckpt"
    (shards / "part").mkdir(parents=True)  # a sharded checkpoint is a folder
    atomic_link(shards, tmp_path / "last.ckpt")
    remove_file(tmp_path / "last.ckpt")
    assert sorted(os.listdir(tmp_path)) == ["epoch=1.ckpt"] and (shards / "part").is_dir()
