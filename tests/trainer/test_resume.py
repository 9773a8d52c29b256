"""Exact resume, each run in a new process: weights bit for bit, same batches, no re-read data."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from helpers import TinyModule, killed_mid_save, loader, max_abs_diff, quiet_trainer, run_python
from tandem import TrainingModule
from tandem.utilities.checkpoint import load_checkpoint_file
from tandem.utilities.exceptions import CheckpointError, TandemWarning

SCRIPT = str(Path(__file__).parent / "scripts" / "resume_run.py")


def _run(tmp_path: Path, root: str, out: str, epochs: int, *extra: str, expect_rc: int = 0) -> dict:
    result = run_python([SCRIPT, str(tmp_path / root), str(tmp_path / out), str(epochs), *extra], timeout=90)
    assert result.returncode == expect_rc, result.stderr[-3000:]
    if expect_rc != 0:
        return {"stderr": result.stderr}
    info = json.loads((tmp_path / f"{out}.json").read_text())
    info["weights"] = torch.load(tmp_path / f"{out}.pt")
    info["stderr"] = result.stderr
    return info


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    return _run(tmp, "root", "full", 4)


@pytest.mark.timeout(120)
def test_two_epochs_then_resume_to_four_equals_four_epochs(tmp_path, uninterrupted):
    first = _run(tmp_path, "root", "first", 2)
    assert first["global_step"] == 14
    assert torch.load(tmp_path / "root" / "checkpoints" / "last.ckpt")["global_step"] == 14  # weights_only=True
    resumed = _run(tmp_path, "root", "resumed", 4, "--resume")
    assert resumed["global_step"] == 28 and resumed["epoch"] == 4
    assert max_abs_diff(resumed["weights"], uninterrupted["weights"]) == 0.0
    assert resumed["fingerprints"] == uninterrupted["fingerprints"][14:]
    assert resumed["metrics"] == uninterrupted["metrics"]


@pytest.mark.timeout(120)
def test_crash_mid_epoch_then_resume_from_last_ckpt_continues_with_the_next_batch(tmp_path, uninterrupted):
    # 7 batches an epoch; a checkpoint every 5 steps; the process dies after step 12 (last.ckpt is step 10).
    _run(tmp_path, "root", "crashed", 4, "--every-n-steps", "5", "--die-at-step", "12", expect_rc=3)
    saved = torch.load(tmp_path / "root" / "checkpoints" / "last.ckpt", weights_only=False)
    assert saved["global_step"] == 10 and saved["loops"]["batches_done"] == 3
    resumed = _run(tmp_path, "root", "resumed", 4, "--every-n-steps", "5", "--resume")
    assert resumed["global_step"] == 28
    assert max_abs_diff(resumed["weights"], uninterrupted["weights"]) == 0.0
    # the same shuffled order from the next batch on, and the done batches were never loaded again
    assert resumed["fingerprints"] == uninterrupted["fingerprints"][10:]
    assert resumed["reads"] == (16 * 3 + 4) + 2 * 100
    # the epoch's partial metric sums came back with the checkpoint
    assert resumed["metrics"] == pytest.approx(uninterrupted["metrics"])


@pytest.mark.timeout(120)
def test_iterable_dataset_mid_epoch_resume_warns_and_reads_ahead(tmp_path):
    _run(tmp_path, "root", "crashed", 2, "--iterable", "--every-n-steps", "3", "--die-at-step", "4", expect_rc=3)
    resumed = _run(tmp_path, "root", "resumed", 2, "--iterable", "--every-n-steps", "3", "--resume")
    assert "cannot skip ahead" in resumed["stderr"] and "reads and discards its first 3 batches" in resumed["stderr"]
    assert resumed["global_step"] == 14
    assert resumed["reads"] == 2 * 100


@pytest.mark.timeout(60)
def test_last_without_any_checkpoint_starts_from_scratch(tmp_path):
    trainer = quiet_trainer(max_epochs=1, default_root_dir=tmp_path)
    with pytest.warns(UserWarning, match="found no last.ckpt yet; training starts from scratch"):
        trainer.fit(TinyModule(), loader(), ckpt_path="last")
    assert trainer.global_step == 4


@pytest.mark.timeout(60)
def test_weights_only_checkpoint_cannot_resume_training(tmp_path):
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(TinyModule(), loader())
    trainer.save_checkpoint(tmp_path / "w.ckpt", weights_only=True)
    (result,) = quiet_trainer().validate(TinyModule(), loader(), ckpt_path=tmp_path / "w.ckpt")
    assert "val_loss" in result
    with pytest.raises(Exception, match="holds weights only"):
        quiet_trainer(max_epochs=2).fit(TinyModule(), loader(), ckpt_path=tmp_path / "w.ckpt")


HALF = np.float32(0.5)


class OddHparams(TinyModule):
    """Hyperparameters torch.load(weights_only=True) refuses: a Path, a numpy number, a module."""

    def __init__(self, data_dir=Path("/data"), scale=HALF, head=None):
        super().__init__()
        self.save_hyperparameters()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def odd_with_a_head() -> OddHparams:
    with pytest.warns(TandemWarning, match="the argument 'head' is an nn.Module"):
        return OddHparams(head=nn.Linear(3, 3))


@pytest.mark.timeout(60)
def test_a_fit_checkpoint_loads_with_plain_torch_load_and_older_ones_only_when_trusted(tmp_path):
    trainer = quiet_trainer(max_epochs=1)
    with pytest.warns(TandemWarning, match=r"The hyperparameter 'head' \(torch.nn.modules.linear.Linear\) is left out"):
        trainer.fit(odd_with_a_head(), loader(shuffle=True))
        trainer.save_checkpoint(tmp_path / "new.ckpt")  # warned once per Trainer, not at every save
    plain = torch.load(tmp_path / "new.ckpt")  # torch's default weights_only=True
    assert plain["global_step"] == 4 and set(plain["state_dict"]) == set(trainer.training_module.state_dict())
    hparams = load_checkpoint_file(tmp_path / "new.ckpt")["hparams"]
    assert hparams["data_dir"] == Path("/data") and type(hparams["scale"]) is np.float32
    assert "head" not in hparams  # a module is no plain data: its weights are in the state_dict already

    # a tandem 0.1 checkpoint (numpy's RNG state as its own tuple, a value pickled into a tensor) resumes only when
    # the user says the file is trusted: reading it means unpickling it
    old = torch.load(tmp_path / "new.ckpt")  # as stored: the plain data of its values
    old["rng_states"]["numpy"] = np.random.get_state()
    old["hparams"]["head"] = {"__tandem_pickled__": torch.frombuffer(bytearray(pickle.dumps(None)), dtype=torch.uint8)}
    del old["tandem_checksum"]  # tandem 0.1 stored none
    torch.save(old, tmp_path / "old.ckpt")
    with pytest.raises(CheckpointError, match=r"holds objects of numpy.*weights_only=False"):
        quiet_trainer(max_epochs=2).fit(OddHparams(), loader(shuffle=True), ckpt_path=tmp_path / "old.ckpt")
    resumed = quiet_trainer(max_epochs=2)
    resumed.fit(OddHparams(), loader(shuffle=True), ckpt_path=tmp_path / "old.ckpt", weights_only=False)
    assert resumed.global_step == 8
    del old["rng_states"]["numpy"]  # without the numpy arrays, the pickled hyperparameter is what is refused
    torch.save(old, tmp_path / "old.ckpt")
    with pytest.raises(
        CheckpointError, match=r"earlier tandem version, which stored checkpoint\['hparams'\]\['head'\] as pickled"
    ):
        OddHparams.load_from_checkpoint(tmp_path / "old.ckpt")
    assert OddHparams.load_from_checkpoint(tmp_path / "old.ckpt", weights_only=False).hparams["head"] is None


@pytest.mark.timeout(60)
def test_the_weights_only_recipe_in_the_error_works(tmp_path):
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(OddHparams(), loader())
    trainer.save_checkpoint(tmp_path / "w.ckpt", weights_only=True)
    with pytest.raises(Exception, match=r"model.load_state_dict\(torch.load\(path\)\['state_dict'\]\)"):
        quiet_trainer(max_epochs=2).fit(OddHparams(), loader(), ckpt_path=tmp_path / "w.ckpt")
    model = OddHparams()
    model.load_state_dict(torch.load(tmp_path / "w.ckpt")["state_dict"])  # the recipe the message gives
    assert max_abs_diff(model.state_dict(), trainer.training_module.state_dict()) == 0.0


@pytest.mark.timeout(120)
def test_a_save_killed_in_version_0_is_removed_when_the_run_resumes_into_version_1(tmp_path):
    """The resumed run writes into version_1, so no later save to version_0 would remove what the killed save
    left there: the resume does (only tandem's temporaries whose writer is gone, never the user's files)."""
    folder = killed_mid_save(tmp_path, "file")
    (stale,) = [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert stale.name.startswith(".last.ckpt.")  # the second save's whole file, never renamed onto last.ckpt
    assert torch.load(stale)["global_step"] > torch.load(folder / "last.ckpt")["global_step"]
    mine = [folder / "notes.tmp", folder / ".draft.tmp", folder / ".last.ckpt.backup.tmp"]  # not tandem's names
    for path in mine:
        path.write_text("the user's")
    trainer = quiet_trainer(default_root_dir=tmp_path, logger=True, enable_checkpointing=True, max_epochs=3)
    trainer.fit(TinyModule(), loader(), ckpt_path="last")
    assert trainer.global_step == 12 and Path(trainer.log_dir).name == "version_1"
    assert not stale.exists()
    assert all(path.read_text() == "the user's" for path in mine)


@pytest.mark.timeout(60)
def test_resuming_past_max_epochs_is_an_error_as_in_lightning(tmp_path):
    """Lightning raises MisconfigurationException when the checkpoint's current_epoch is above max_epochs; at or
    one above it the fit ends at once. Lightning 2.6.6, a checkpoint of epoch 2 (3 epochs of 2 batches): max_epochs=1
    raises "You restored a checkpoint with current_epoch=2, but you have set Trainer(max_epochs=1)."; max_epochs=2 and
    3 end with current_epoch 3, global_step 6; max_epochs=4 trains one more epoch (current_epoch 4, global_step 8)."""
    from tandem.utilities.exceptions import MisconfigurationException

    first = quiet_trainer(max_epochs=3, enable_checkpointing=True, default_root_dir=tmp_path)
    first.fit(TinyModule(), loader(32))
    path = first.checkpoint_callback.best_model_path
    with pytest.raises(MisconfigurationException, match=r"current_epoch=2 .*Trainer\(max_epochs=1\)"):
        quiet_trainer(max_epochs=1).fit(TinyModule(), loader(32), ckpt_path=path)
    for max_epochs, expected in ((2, (3, 6)), (3, (3, 6))):
        trainer = quiet_trainer(max_epochs=max_epochs)
        with pytest.warns(TandemWarning, match="trained nothing"):  # tandem says so; Lightning is silent
            trainer.fit(TinyModule(), loader(32), ckpt_path=path)
        assert (trainer.current_epoch, trainer.global_step) == expected, max_epochs
    trainer = quiet_trainer(max_epochs=4)
    trainer.fit(TinyModule(), loader(32), ckpt_path=path)
    assert (trainer.current_epoch, trainer.global_step) == (4, 8)


class RandomValidation(TinyModule):
    """Builds its validation data when asked for it (Lightning's BoringModel does): the draws fall between the
    training iterator, made with its loader, and the epoch's first batch, where the shuffled order is drawn."""

    def val_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randint(0, 3, (16,)))
        return torch.utils.data.DataLoader(data, batch_size=8)


class OwnShuffle(torch.utils.data.Sampler):
    """A sampler of the user's: a resume draws its order again from the RNG state it was drawn from, at the epoch's
    first batch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n).tolist())


def _first_epoch(root: Path, ckpt_path: Path | None = None) -> TrainingModule:
    from tandem import seed_everything
    from tandem.callbacks import ModelCheckpoint

    seed_everything(5)
    model = RandomValidation(dropout=0.3)
    saves = ModelCheckpoint(dirpath=root, every_n_train_steps=2, save_top_k=-1)
    trainer = quiet_trainer(max_epochs=1, callbacks=[saves])
    train = loader(64, batch_size=16, sampler=OwnShuffle(64))
    trainer.fit(model, train, ckpt_path=ckpt_path)
    return model


@pytest.mark.timeout(120)
def test_a_resume_inside_the_first_epoch_replays_its_order_drawn_after_the_validation_loader(tmp_path):
    full = _first_epoch(tmp_path / "full")
    (mid,) = (tmp_path / "full").glob("*step=2.ckpt")
    with pytest.warns(TandemWarning, match="dirpath has changed"):  # Lightning's warning: saved elsewhere
        resumed = _first_epoch(tmp_path / "resumed", ckpt_path=mid)
    assert max_abs_diff(resumed.state_dict(), full.state_dict()) == 0.0
