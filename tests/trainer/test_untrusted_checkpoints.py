"""Loading a checkpoint never runs what the file holds unless the user says it is trusted (``weights_only=False``).

Each payload file holds an object whose unpickling writes a file (``exec``); the tests pass it through every entry
point that reads a checkpoint and assert the file is absent and the error names the checkpoint, what it holds and
``weights_only=False``. Three kinds: a plain ``torch.save`` of the object, one carrying tandem's marker key, and one
holding the object pickled into a tensor under the key earlier tandem versions used (which weights-only loading
reads without complaint: tandem must refuse to unpickle it). Then the other two ways in: ``ckpt_path="last"``
never takes another run's file, and tandem's own checkpoints of every kind load with ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import enum
import pickle
from pathlib import Path

import fsspec
import pytest
import torch

import tandem
from helpers import Payload, TinyModule, loader, max_abs_diff, quiet_trainer
from tandem.callbacks import ModelCheckpoint
from tandem.cli import CLI
from tandem.loggers import CSVLogger
from tandem.utilities.checkpoint import CHECKPOINT_MARKER, load_checkpoint_file
from tandem.utilities.exceptions import CheckpointError

pytestmark = pytest.mark.timeout(120)


class Data(tandem.DataModule):
    def train_dataloader(self):
        return loader()


def payload_files(folder: Path) -> tuple[Path, dict[str, Path]]:
    """The marker the payloads would write, and the three payload-carrying checkpoints."""
    marker = folder / "payload-ran"
    weights = TinyModule().state_dict()
    files = {"plain": folder / "plain.ckpt", "marked": folder / "marked.ckpt", "encoded": folder / "encoded.ckpt"}
    torch.save({"state_dict": weights, "x": Payload(marker)}, files["plain"])
    torch.save({CHECKPOINT_MARKER: "0.1.0", "state_dict": weights, "hparams": {"x": Payload(marker)}}, files["marked"])
    pickled = torch.frombuffer(bytearray(pickle.dumps(Payload(marker))), dtype=torch.uint8)
    encoded = {CHECKPOINT_MARKER: "0.1.0", "state_dict": weights, "hparams": {"x": {"__tandem_pickled__": pickled}}}
    torch.save(encoded, files["encoded"])
    return marker, files


def entry_points(tmp_path: Path):
    """Every way a user hands tandem a checkpoint path: (name, call)."""
    return [
        ("load_from_checkpoint", lambda p: TinyModule.load_from_checkpoint(p)),
        ("DataModule.load_from_checkpoint", lambda p: Data.load_from_checkpoint(p)),
        ("fit", lambda p: quiet_trainer(max_epochs=1).fit(TinyModule(), loader(), ckpt_path=p)),
        ("validate", lambda p: quiet_trainer().validate(TinyModule(), loader(), ckpt_path=p)),
        ("test", lambda p: quiet_trainer().test(TinyModule(), loader(), ckpt_path=p)),
        ("predict", lambda p: quiet_trainer().predict(TinyModule(), loader(), ckpt_path=p)),
        ("cli", lambda p: CLI(TinyModule, Data, args=["fit", "--ckpt_path", str(p), *_quiet_cli(tmp_path)])),
    ]


def _quiet_cli(root: Path) -> list[str]:
    return ["--trainer.max_epochs=1", "--trainer.enable_progress_bar=false", "--trainer.logger=false",
            "--trainer.enable_checkpointing=false", "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={root}"]  # fmt: skip


@pytest.mark.parametrize("kind", ["plain", "marked", "encoded"])
def test_no_entry_point_runs_what_a_checkpoint_holds(tmp_path, kind):
    marker, files = payload_files(tmp_path)
    path = files[kind]
    memory = f"memory://untrusted-{kind}-{id(tmp_path)}/model.ckpt"
    with fsspec.open(memory, "wb") as f:
        f.write(path.read_bytes())
    for name, call in entry_points(tmp_path):
        for where in (path, memory) if name in ("load_from_checkpoint", "fit") else (path,):
            with pytest.raises(CheckpointError) as caught:
                call(where)
            message = str(caught.value)
            assert not marker.exists(), f"{name} ran the payload of the {kind} file"
            assert str(where) in message and "weights_only=False" in message, (name, message)
            held = "pickled bytes" if kind == "encoded" else "holds objects of builtins.exec"
            assert held in message, (name, message)
    # the payload is live: the same file, trusted, runs it (so the assertions above could fail)
    with contextlib.suppress(CheckpointError):  # the plain file is no tandem checkpoint, once unpickled
        load_checkpoint_file(path, weights_only=False)
    assert marker.read_text() == "ran"


def test_a_value_made_to_look_like_tandems_encoding_builds_nothing_but_what_it_names(tmp_path):
    """The plain-data tags rebuild a fixed set of types: a tag naming a function, a class that is no enum, or a
    module that is not imported is an error naming the value, and nothing is imported or called."""
    weights = TinyModule().state_dict()
    for forged, says in (
        ({"__tandem_value__": "enum", "cls": "os:system", "name": "x"}, "not a member of an enum"),
        ({"__tandem_value__": "enum", "cls": "antigravity:Fly", "name": "x"}, "`import antigravity` before"),
        ({"__tandem_value__": "path", "cls": "Popen", "path": "/bin/sh"}, "does not decode"),
        ({"__tandem_value__": "numpy", "dtype": "O", "shape": [1], "data": b"x"}, "numpy array of Python objects"),
        ({"__tandem_value__": "exec", "code": "1"}, "unknown kind 'exec'"),
    ):
        path = tmp_path / "forged.ckpt"
        torch.save({CHECKPOINT_MARKER: "0.1.0", "state_dict": weights, "hparams": {"x": forged}}, path)
        with pytest.raises(CheckpointError, match=says):
            TinyModule.load_from_checkpoint(path)
    assert "antigravity" not in __import__("sys").modules


def test_every_torch_load_tandem_makes_reads_weights_only(tmp_path, monkeypatch):
    """Resume, ``ckpt_path="last"``, ``load_from_checkpoint`` and the tuner's restores (the LR finder and the
    batch-size finder save a trial checkpoint and restore it) all read with ``weights_only=True``."""
    from tandem.tuner import Tuner

    calls = []
    real = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    trainer = quiet_trainer(
        max_epochs=1, default_root_dir=tmp_path, callbacks=[ModelCheckpoint(save_last=True, save_top_k=0)]
    )
    trainer.fit(TinyModule(), loader())
    quiet_trainer(
        max_epochs=2, default_root_dir=tmp_path, callbacks=[ModelCheckpoint(save_last=True, save_top_k=0)]
    ).fit(TinyModule(), loader(), ckpt_path="last")
    TinyModule.load_from_checkpoint(trainer.checkpoint_callback.last_model_path)

    class Tunable(TinyModule):
        def __init__(self, batch_size: int = 4, lr: float = 0.1):
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self):
            return loader(batch_size=self.hparams.batch_size)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    tuner = Tuner(quiet_trainer(max_epochs=1, default_root_dir=tmp_path / "tune"))
    tuner.lr_find(Tunable(), num_training=20, early_stop_threshold=None)
    tuner.scale_batch_size(Tunable(), max_trials=2, steps_per_trial=1)
    assert len(calls) >= 4 and set(calls) == {True}, calls


# ---------------------------------------------------------------------------------------------- "last"


def test_last_never_resumes_a_sibling_runs_file(tmp_path):
    """Another experiment's ``last.ckpt`` beside this run's folder, newer than this run's own, is not resumed: not
    in the working directory when there is no logger, not another experiment, not another named version."""
    mine = quiet_trainer(max_epochs=1, default_root_dir=tmp_path, logger=CSVLogger(tmp_path, name="exp"))
    mine.fit(TinyModule(), loader(), ckpt_path=None)
    mine.save_checkpoint(Path(mine.log_dir) / "checkpoints" / "last.ckpt")  # step 4, version_0
    other = quiet_trainer(max_epochs=3, default_root_dir=tmp_path, logger=CSVLogger(tmp_path, name="exp", version="b"))
    other.fit(TinyModule(), loader())
    for sibling in ("exp/b", "exp/not_a_version", "other_experiment/version_0", "project"):
        folder = tmp_path / sibling / "checkpoints"
        folder.mkdir(parents=True, exist_ok=True)
        other.save_checkpoint(folder / "last.ckpt")  # step 12, newer
    resumed = quiet_trainer(max_epochs=2, default_root_dir=tmp_path, logger=CSVLogger(tmp_path, name="exp"))
    resumed.fit(TinyModule(), loader(), ckpt_path="last")
    assert resumed.ckpt_path == str(tmp_path / "exp" / "version_0" / "checkpoints" / "last.ckpt")
    assert resumed.global_step == 8  # 4 resumed + 4: not 12 from a sibling
    named = quiet_trainer(max_epochs=4, default_root_dir=tmp_path, logger=CSVLogger(tmp_path, name="exp", version="b"))
    named.fit(TinyModule(), loader(), ckpt_path="last")  # a named version resumes its own folder only
    assert named.ckpt_path == str(tmp_path / "exp" / "b" / "checkpoints" / "last.ckpt") and named.global_step == 16
    bare = quiet_trainer(max_epochs=1, default_root_dir=tmp_path / "project" / "..", logger=False)
    with pytest.warns(UserWarning, match="found no last.ckpt yet"):
        bare.fit(TinyModule(), loader(), ckpt_path="last")  # the working directory's project/checkpoints is not its


# ---------------------------------------------------------------------------------------------- own checkpoints


class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


class Rich(TinyModule):
    """Hyperparameters of every plain-data kind, nested."""

    def __init__(self, root: Path = Path("/data"), mode: Mode = Mode.FAST, nested: dict | None = None):
        super().__init__()
        self.save_hyperparameters()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class Manual(TinyModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss


@pytest.mark.parametrize("module", ["rich", "manual"])
def test_tandems_own_checkpoints_load_weights_only_and_resume_bit_for_bit(tmp_path, module):
    nested = {"a": {"b": [1, (2.5, "x")], "when": Mode.SLOW}, "paths": [Path("/x"), Path("y")]}
    make = (lambda: Rich(Path("/data/train"), Mode.SLOW, nested)) if module == "rich" else Manual
    callbacks = lambda name: [ModelCheckpoint(dirpath=tmp_path / name, save_last=True, every_n_train_steps=2)]  # noqa: E731
    tandem.seed_everything(3)
    whole = quiet_trainer(max_epochs=2, callbacks=callbacks("whole"))
    whole.fit(make(), loader(shuffle=True))
    tandem.seed_everything(3)
    first = quiet_trainer(max_epochs=1, callbacks=callbacks("ckpt"))
    first.fit(make(), loader(shuffle=True))
    path = tmp_path / "ckpt" / "last.ckpt"
    plain = torch.load(path)  # torch's default: weights_only=True
    assert plain["callbacks"] and plain["optimizer_states"] and plain["rng_states"]
    resumed = quiet_trainer(max_epochs=2, callbacks=callbacks("ckpt"))
    resumed.fit(make(), loader(shuffle=True), ckpt_path=path)
    assert max_abs_diff(resumed.training_module.state_dict(), whole.training_module.state_dict()) == 0.0
    if module == "rich":
        back = Rich.load_from_checkpoint(path)
        assert back.hparams["root"] == Path("/data/train") and back.hparams["mode"] is Mode.SLOW
        assert back.hparams["nested"] == nested
        assert max_abs_diff(back.state_dict(), resumed.training_module.state_dict()) == 0.0  # its last.ckpt
