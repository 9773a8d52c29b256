"""The TrainingModule's Lightning surface: load_from_checkpoint, all_gather, logger(s), freeze / unfreeze,
save_hyperparameters(logger=False), self.log(rank_zero_only=...)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import tandem
from helpers import TinyModule, loader, max_abs_diff, quiet_trainer
from tandem.loggers import CSVLogger
from tandem.utilities.exceptions import TandemConfigError, TandemUserCodeError

pytestmark = pytest.mark.timeout(60)


class WithEncoder(tandem.TrainingModule):
    def __init__(self, encoder: nn.Module, hidden: int = 16, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["encoder"])
        self.encoder = encoder
        self.head = nn.Linear(hidden, 3)

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.head(self.encoder(batch[0])), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def test_load_from_checkpoint_rebuilds_the_module_from_its_hyperparameters(tmp_path):
    model = TinyModule(lr=0.05, optimizer="adam", dropout=0.1)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model, loader(32, 16))
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    loaded = TinyModule.load_from_checkpoint(tmp_path / "model.ckpt")
    assert isinstance(loaded, TinyModule) and loaded is not model
    assert loaded.hparams == model.hparams and loaded.net[1].p == 0.1
    assert max_abs_diff(loaded.state_dict(), model.state_dict()) == 0.0
    overridden = TinyModule.load_from_checkpoint(tmp_path / "model.ckpt", dropout=0.5, map_location="cpu")
    assert overridden.net[1].p == 0.5 and overridden.hparams.dropout == 0.5
    torch.save({"plain": 1}, tmp_path / "plain.pt")  # a file tandem did not write
    with pytest.raises(Exception, match="not a tandem checkpoint"):
        TinyModule.load_from_checkpoint(tmp_path / "plain.pt")


def test_load_from_checkpoint_on_an_instance_is_a_type_error_naming_the_fix(tmp_path):
    import inspect

    model = TinyModule(lr=0.05)
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(model, loader())
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    fresh = TinyModule()
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(TypeError, match=r"model = TinyModule.load_from_checkpoint\(path\).*model.load_state_dict"):
        fresh.load_from_checkpoint(tmp_path / "model.ckpt")
    assert max_abs_diff(fresh.state_dict(), before) == 0.0
    assert "checkpoint_path" in inspect.signature(fresh.load_from_checkpoint).parameters  # still inspectable
    data = tandem.DataModule()
    with pytest.raises(TypeError, match=r"an instance.*`datamodule = DataModule.load_from_checkpoint\(path\)`"):
        data.load_from_checkpoint(tmp_path / "model.ckpt")
    assert isinstance(tandem.DataModule.load_from_checkpoint(tmp_path / "model.ckpt"), tandem.DataModule)


def test_save_hyperparameters_warns_for_module_arguments():
    with pytest.warns(UserWarning, match=r"'encoder' is an nn.Module.*save_hyperparameters\(ignore=\['encoder'\]\)"):
        model = Unignored(nn.Linear(8, 16))
    assert set(model.hparams) == {"encoder", "hidden"}  # warned, not changed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        WithEncoder(nn.Linear(8, 16))  # the fix: ignored, no warning


class Unignored(WithEncoder):
    def __init__(self, encoder: nn.Module, hidden: int = 16) -> None:
        tandem.TrainingModule.__init__(self)
        self.save_hyperparameters()
        self.encoder = encoder
        self.head = nn.Linear(hidden, 3)


def test_load_from_checkpoint_names_arguments_that_were_not_saved(tmp_path):
    model = WithEncoder(nn.Linear(8, 16), hidden=16)
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(model, loader())
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    with pytest.raises(TandemConfigError, match=r"lack \['encoder'\].*load_from_checkpoint\(path, encoder=\.\.\.\)"):
        WithEncoder.load_from_checkpoint(tmp_path / "model.ckpt")
    loaded = WithEncoder.load_from_checkpoint(tmp_path / "model.ckpt", encoder=nn.Linear(8, 16))
    assert max_abs_diff(loaded.state_dict(), model.state_dict()) == 0.0
    with pytest.raises(TandemUserCodeError, match=r"(?s)does not fit WithEncoder.*size mismatch.*strict=False"):
        WithEncoder.load_from_checkpoint(tmp_path / "model.ckpt", encoder=nn.Linear(8, 32), hidden=32)
    partial = WithEncoder.load_from_checkpoint(tmp_path / "model.ckpt", encoder=nn.Identity(), strict=False)
    assert torch.equal(partial.head.weight, model.head.weight)  # the encoder's saved weights are skipped


class Sized(tandem.TrainingModule):
    """A classifier whose ``__init__`` arguments later versions rename, add or extend."""

    def __init__(self, hidden: int = 16, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.build(hidden)

    def build(self, hidden: int) -> None:
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 3))

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def _saved(model: tandem.TrainingModule, path) -> tandem.TrainingModule:
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(model, loader())
    trainer.save_checkpoint(path)
    return model


def test_load_from_checkpoint_refuses_a_saved_hyperparameter_renamed_since(tmp_path):
    saved = _saved(Sized(hidden=32), tmp_path / "model.ckpt")

    class Renamed(Sized):  # `hidden` is now `hidden_dim`: loading must not build the default 16
        def __init__(self, hidden_dim: int = 16, lr: float = 0.1) -> None:
            tandem.TrainingModule.__init__(self)
            self.save_hyperparameters()
            self.build(hidden_dim)

    with pytest.raises(
        TandemConfigError,
        match=r"(?s)saved hyperparameters include 'hidden' \(saved as 32\), which Renamed.__init__ does not take "
        r"\(it takes: hidden_dim, lr\), while 'hidden_dim' \(default 16\) is neither saved nor passed.*"
        r"Renamed.load_from_checkpoint\(path, hidden_dim=32\).*rename the argument back to 'hidden'",
    ):
        Renamed.load_from_checkpoint(tmp_path / "model.ckpt")
    loaded = Renamed.load_from_checkpoint(tmp_path / "model.ckpt", hidden_dim=32)  # the fix: the old name left out
    assert dict(loaded.hparams) == {"hidden_dim": 32, "lr": 0.1}
    assert max_abs_diff(loaded.state_dict(), saved.state_dict()) == 0.0

    class RenamedRequired(Renamed):
        def __init__(self, hidden_dim: int, lr: float = 0.1) -> None:
            super().__init__(hidden_dim, lr)

    with pytest.raises(TandemConfigError, match=r"'hidden_dim' \(required\) is neither saved nor passed"):
        RenamedRequired.load_from_checkpoint(tmp_path / "model.ckpt")

    class Open(Sized):  # takes any keyword: gets the saved names as they are
        def __init__(self, hidden_dim: int = 16, **kwargs) -> None:
            tandem.TrainingModule.__init__(self)
            self.build(kwargs.get("hidden", hidden_dim))

    assert max_abs_diff(Open.load_from_checkpoint(tmp_path / "model.ckpt").state_dict(), saved.state_dict()) == 0.0

    class Fixed(Sized):  # `lr` removed; every argument left is saved: nothing falls back to a default
        def __init__(self, hidden: int = 16) -> None:
            tandem.TrainingModule.__init__(self)
            self.build(hidden)

    assert max_abs_diff(Fixed.load_from_checkpoint(tmp_path / "model.ckpt").state_dict(), saved.state_dict()) == 0.0


def test_load_from_checkpoint_names_a_required_argument_added_since_the_checkpoint(tmp_path):
    saved = _saved(Sized(hidden=32), tmp_path / "model.ckpt")

    class WithHeads(Sized):
        def __init__(self, hidden: int, lr: float, heads: int) -> None:
            tandem.TrainingModule.__init__(self)
            self.save_hyperparameters()
            self.build(hidden)

    with pytest.raises(TandemConfigError) as raised:
        WithHeads.load_from_checkpoint(tmp_path / "model.ckpt")
    message = str(raised.value)
    assert "saved hyperparameters ['hidden', 'lr'] lack ['heads'], which WithHeads.__init__ requires" in message
    assert "added to __init__ after the checkpoint was saved" in message
    assert "WithHeads.load_from_checkpoint(path, heads=...); or give the argument a default" in message
    assert "save_hyperparameters() was not called" not in message  # it was
    loaded = WithHeads.load_from_checkpoint(tmp_path / "model.ckpt", heads=2)
    assert loaded.hparams.heads == 2 and max_abs_diff(loaded.state_dict(), saved.state_dict()) == 0.0

    class Unsaved(Sized):  # never calls save_hyperparameters: its checkpoints hold none
        def __init__(self, hidden: int) -> None:
            tandem.TrainingModule.__init__(self)
            self.build(hidden)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    _saved(Unsaved(32), tmp_path / "unsaved.ckpt")
    with pytest.raises(
        TandemConfigError,
        match=r"holds no saved hyperparameters \(save_hyperparameters\(\) was not called in __init__\), so it lacks "
        r"\['hidden'\].*Unsaved.load_from_checkpoint\(path, hidden=\.\.\.\)",
    ):
        Unsaved.load_from_checkpoint(tmp_path / "unsaved.ckpt")


def test_all_gather_logger_freeze_and_hyperparameters_kept_from_loggers(tmp_path):
    seen = {}

    class Surface(TinyModule):
        def __init__(self, secret: str = "x") -> None:
            super().__init__()
            self.save_hyperparameters(logger=False)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def on_train_start(self):
            seen["gathered"] = self.all_gather({"a": torch.tensor([1.0, 2.0]), "n": 3})
            seen["logger"] = self.logger
            seen["loggers"] = self.loggers

    logger = CSVLogger(tmp_path)
    trainer = quiet_trainer(max_steps=1, logger=logger)
    model = Surface()
    trainer.fit(model, loader())
    assert torch.equal(seen["gathered"]["a"], torch.tensor([1.0, 2.0])) and seen["gathered"]["n"].item() == 3
    assert seen["logger"] is logger and seen["loggers"] == [logger]
    assert not (tmp_path / "tandem_logs" / "version_0" / "hparams.yaml").exists()  # logger=False: nothing logged
    model.freeze()
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    model.unfreeze()
    assert model.training and all(p.requires_grad for p in model.parameters())
    assert TinyModule().logger is None and TinyModule().loggers == []


def test_rank_zero_only_values_are_logged_without_a_collective():
    class RankZero(TinyModule):
        def on_train_epoch_end(self):
            if self.trainer.is_global_zero:
                self.log("only_here", 1.0, rank_zero_only=True, sync_dist=True)

    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(RankZero(), loader())
    assert trainer.callback_metrics["only_here"].item() == 1.0
    assert not trainer.metric_collector._stores["train"]["only_here"].sync_dist


def test_is_overridden_reads_the_instance_as_lightning_does():
    import functools
    from unittest import mock

    from tandem.module import is_overridden

    model = TinyModule()
    assert is_overridden(model, "training_step") and not is_overridden(model, "on_train_start")
    model.on_train_start = lambda: None  # a function set on the instance
    assert is_overridden(model, "on_train_start")
    model.validation_step = None  # the idiom that turns a stage off
    assert not is_overridden(model, "validation_step")
    # a wrapper counts as what it wraps: the base's own method wrapped is not an override
    base = model.on_train_end
    model.on_train_end = functools.partial(base)
    assert not is_overridden(model, "on_train_end")
    model.on_train_end = mock.Mock(wraps=base)
    assert not is_overridden(model, "on_train_end")
    model.on_fit_end = functools.wraps(model.on_fit_end)(lambda: None)
    assert not is_overridden(model, "on_fit_end")
    model.on_fit_end = mock.Mock(wraps=lambda: None)
    assert is_overridden(model, "on_fit_end")
