"""The evaluation loop and the module's mode: each submodule keeps the mode the user gave it (Lightning 2.6's
``_ModuleMode``), and the mode switch is the module's hooks, in Lightning's order."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import Callback
from tandem.utilities.exceptions import PossibleUserWarning

EVAL_MODE_WARNING = "module\\(s\\) in eval mode at the start of training"


class FrozenNorm(TinyModule):
    """A frozen BatchNorm in eval mode: its running statistics must not move, in training or evaluation."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(8)
        self.norm.eval()
        self.norm.requires_grad_(False)
        self.modes: list[tuple[str, bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(self.norm(x))

    def training_step(self, batch, batch_idx):
        self.modes.append(("train", self.net.training, self.norm.training))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.modes.append(("validate", self.net.training, self.norm.training))
        return super().validation_step(batch, batch_idx)

    def test_step(self, batch, batch_idx):
        self.modes.append(("test", self.net.training, self.norm.training))
        return super().test_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        self.modes.append(("predict", self.net.training, self.norm.training))
        return self(batch[0])


def test_a_frozen_submodule_stays_in_eval_mode_through_fit_and_evaluation():
    model = FrozenNorm()
    mean = model.norm.running_mean.clone()
    trainer = quiet_trainer(max_epochs=2, val_check_interval=2, limit_train_batches=4, num_sanity_val_steps=1)
    with pytest.warns(PossibleUserWarning, match=EVAL_MODE_WARNING):  # Lightning warns too: it may be a mistake
        trainer.fit(model, loader(64), loader(32))
    trainer.validate(model, loader(16), verbose=False)
    trainer.test(model, loader(16), verbose=False)
    trainer.predict(model, loader(16))
    stages = {stage for stage, _, _ in model.modes}
    assert stages == {"train", "validate", "test", "predict"}
    # training: the rest trains, the frozen norm does not; evaluation: all in eval mode
    assert all(net == (stage == "train") and not norm for stage, net, norm in model.modes)
    assert torch.equal(model.norm.running_mean, mean)  # its statistics never moved
    assert model.net.training and not model.norm.training  # each gets its own mode back at the end


def test_no_warning_when_every_module_trains():
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2)
    trainer.fit(TinyModule(), loader(32), loader(16))  # tandem's warnings are errors here


class Recorder(Callback):
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def on_sanity_check_start(self, trainer, module):
        self.calls.append("Callback.on_sanity_check_start")

    def on_sanity_check_end(self, trainer, module):
        self.calls.append("Callback.on_sanity_check_end")

    def on_validation_start(self, trainer, module):
        self.calls.append("Callback.on_validation_start")

    def on_validation_end(self, trainer, module):
        self.calls.append("Callback.on_validation_end")

    def on_test_start(self, trainer, module):
        self.calls.append("Callback.on_test_start")

    def on_test_end(self, trainer, module):
        self.calls.append("Callback.on_test_end")

    def on_predict_start(self, trainer, module):
        self.calls.append("Callback.on_predict_start")

    def on_predict_end(self, trainer, module):
        self.calls.append("Callback.on_predict_end")

    def on_train_epoch_end(self, trainer, module):
        self.calls.append("Callback.on_train_epoch_end")


class ModeHooks(TinyModule):
    """Records the mode hooks (calling Lightning's defaults through super())."""

    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    def on_validation_model_zero_grad(self):
        self.calls.append("on_validation_model_zero_grad")
        super().on_validation_model_zero_grad()
        assert all(p.grad is None for p in self.parameters())

    def on_validation_model_eval(self):
        self.calls.append("on_validation_model_eval")
        super().on_validation_model_eval()

    def on_validation_model_train(self):
        self.calls.append("on_validation_model_train")
        super().on_validation_model_train()

    def on_test_model_eval(self):
        self.calls.append("on_test_model_eval")
        super().on_test_model_eval()

    def on_test_model_train(self):
        self.calls.append("on_test_model_train")
        super().on_test_model_train()

    def on_predict_model_eval(self):
        self.calls.append("on_predict_model_eval")
        super().on_predict_model_eval()

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0])


def _validation(zero_grad: bool) -> list[str]:
    return [
        *(["on_validation_model_zero_grad"] if zero_grad else []),
        "on_validation_model_eval",
        "Callback.on_validation_start",
        "Callback.on_validation_end",
        "on_validation_model_train",
    ]


def test_the_mode_hooks_run_in_lightnings_order():
    """As Lightning's ``models/test_hooks.py`` orders them: the zero_grad hook before a validation inside the fit (not
    the sanity check's), eval before ``on_<stage>_start``, train after ``on_<stage>_end``."""
    calls: list[str] = []
    model = ModeHooks(calls)
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, num_sanity_val_steps=1, callbacks=[Recorder(calls)])
    trainer.fit(model, loader(32), loader(16))
    assert calls == [
        "Callback.on_sanity_check_start",
        *_validation(zero_grad=False),
        "Callback.on_sanity_check_end",
        *_validation(zero_grad=True),
        "Callback.on_train_epoch_end",
    ]
    del calls[:]
    trainer.test(model, loader(16), verbose=False)
    trainer.predict(model, loader(16))
    assert calls == [
        "on_test_model_eval",
        "Callback.on_test_start",
        "Callback.on_test_end",
        "on_test_model_train",
        "on_predict_model_eval",
        "Callback.on_predict_start",
        "Callback.on_predict_end",
    ]


def test_no_zero_grad_hook_inside_an_accumulation_window():
    calls: list[str] = []
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=4, val_check_interval=1, accumulate_grad_batches=2)
    trainer.fit(ModeHooks(calls), loader(64), loader(16))
    # a validation after each of the 4 batches; the gradients are released only after the 2 optimizer steps
    assert calls.count("on_validation_model_eval") == 4
    assert calls.count("on_validation_model_zero_grad") == 2


def test_an_overridden_model_train_hook_takes_over_from_the_recorded_modes():
    """Lightning's rule: an override of ``on_validation_model_train`` is called instead of giving the modes back."""

    class StaysInEval(TinyModule):
        def __init__(self) -> None:
            super().__init__()
            self.modes: list[bool] = []

        def training_step(self, batch, batch_idx):
            self.modes.append(self.training)
            return super().training_step(batch, batch_idx)

        def on_validation_model_train(self):
            pass  # leaves the model in eval mode

    model = StaysInEval()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, val_check_interval=1)
    trainer.fit(model, loader(32), loader(16))
    assert model.modes == [True, False]


def test_a_mode_hook_set_to_none_gives_the_recorded_modes_back():
    model = FrozenNorm()
    model.on_validation_model_train = None  # not overridden: the loop gives each submodule its mode back
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, val_check_interval=1)
    with pytest.warns(PossibleUserWarning, match=EVAL_MODE_WARNING):
        trainer.fit(model, loader(32), loader(16))
    assert [(net, norm) for stage, net, norm in model.modes if stage == "train"] == [(True, False)] * 2


class CountedLoader(torch.utils.data.DataLoader):
    """A DataLoader that records each iterator it makes (when a DataLoader's iterator is made, it draws its base seed
    from torch's RNG: the point decides every later draw)."""

    def __init__(self, calls: list[str], name: str, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls, self.name = calls, name

    def __iter__(self):
        self.calls.append(f"iter({self.name})")
        return super().__iter__()


def test_an_evaluation_loaders_iterator_is_made_before_its_hooks_as_in_lightning():
    """Lightning makes the first evaluation loader's iterator before ``on_<stage>_model_eval`` and
    ``on_<stage>_start``, the next ones as their turn comes; so random data built in those hooks, and the loaders'
    worker seeds, follow Lightning's sequence."""

    class TwoLoaders(ModeHooks):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            return super().validation_step(batch, batch_idx)

    calls: list[str] = []
    model = TwoLoaders(calls)
    data = loader(16).dataset
    val = [CountedLoader(calls, f"val{i}", data, batch_size=8) for i in range(2)]
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=1, callbacks=[Recorder(calls)])
    trainer.validate(model, val, verbose=False)
    assert calls == [
        "iter(val0)",
        "on_validation_model_eval",
        "Callback.on_validation_start",
        "iter(val1)",
        "Callback.on_validation_end",
        "on_validation_model_train",
    ]
    del calls[:]
    trainer.test(model, CountedLoader(calls, "test", data), verbose=False)
    trainer.predict(model, CountedLoader(calls, "predict", data))
    assert calls == [
        "iter(test)",
        "on_test_model_eval",
        "Callback.on_test_start",
        "Callback.on_test_end",
        "on_test_model_train",
        "iter(predict)",
        "on_predict_model_eval",
        "Callback.on_predict_start",
        "Callback.on_predict_end",
    ]


def test_testing_a_module_never_fitted_nor_loaded_says_so_once(tmp_path, capsys):
    """trainer.test(model) without ckpt_path on a module with the weights it was built with tests them, as Lightning
    does; one info line says so. A fitted module, one loaded with load_state_dict or load_from_checkpoint, and a test
    given a checkpoint are tested without it."""
    line = "Testing TinyModule with the weights it was built with: it was neither fitted nor loaded from a checkpoint"
    trainer = quiet_trainer(max_epochs=1, enable_checkpointing=True, default_root_dir=tmp_path)
    trainer.test(TinyModule(), loader(32), verbose=False)
    said = capsys.readouterr().err
    assert said.count(line) == 1 and "TinyModule.load_from_checkpoint(path)" in said, said
    fitted = TinyModule()
    trainer.fit(fitted, loader(32))
    trainer.test(fitted, loader(32), verbose=False)
    loaded = TinyModule()
    loaded.load_state_dict(fitted.state_dict())
    trainer.test(loaded, loader(32), verbose=False)
    path = trainer.checkpoint_callback.best_model_path
    trainer.test(TinyModule.load_from_checkpoint(path), loader(32), verbose=False)
    trainer.test(TinyModule(), loader(32), ckpt_path=path, verbose=False)
    assert line not in capsys.readouterr().err
