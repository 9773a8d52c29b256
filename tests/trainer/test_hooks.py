"""The hook dispatcher: one table, the hook running now (what self.log's defaults follow), one stage field."""

from __future__ import annotations

import functools

import pytest

import tandem
from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import Callback
from tandem.trainer.hooks import STEP_HOOKS, HookDispatcher, current_hook
from tandem.trainer.state import TrainerState


def test_per_step_logging_is_declared_with_the_hook():
    assert {"training_step", "on_train_batch_end", "on_before_optimizer_step", "optimizer_step"} <= STEP_HOOKS
    assert not {"on_train_epoch_end", "validation_step", None} & STEP_HOOKS


def test_running_sets_and_restores_the_one_stage_field():
    state = TrainerState()
    hooks = HookDispatcher(state)
    with hooks.running("train"):
        assert state.stage == "train"
        with hooks.running("sanity_check"):
            assert state.stage == "sanity_check"
        assert state.stage == "train"
    assert state.stage is None


def test_a_hook_sees_itself_as_current_and_the_previous_one_after():
    seen = []

    class Watch(Callback):
        def on_train_epoch_start(self, trainer, module):
            seen.append((current_hook(), trainer.state.stage))

        def on_validation_epoch_end(self, trainer, module):
            seen.append((current_hook(), trainer.state.stage, trainer.sanity_checking))

        def on_train_start(self, trainer, module):
            seen.append((current_hook(), trainer.state.stage, trainer.sanity_checking))

    trainer = quiet_trainer(max_epochs=1, num_sanity_val_steps=1, callbacks=[Watch()])
    trainer.fit(TinyModule(), loader(32), loader(16))
    assert seen[0] == ("on_validation_epoch_end", "sanity_check", True)
    assert seen[1] == ("on_train_start", "train", False)  # the sanity check's stage does not leak into training
    assert seen[2] == ("on_train_epoch_start", "train")
    assert seen[3] == ("on_validation_epoch_end", "validate", False)
    assert current_hook() is None and trainer.state.stage is None


def test_call_hook_is_public_and_dispatches_like_the_loop():
    calls = []

    class Watch(Callback):
        def on_before_backward(self, trainer, module, loss):
            calls.append(float(loss.detach()) if hasattr(loss, "detach") else float(loss))

    trainer = quiet_trainer(max_steps=1, callbacks=[Watch()])
    trainer.fit(TinyModule(), loader(16))
    trainer.call_hook("on_before_backward", 2.5)
    assert len(calls) == 2 and calls[-1] == 2.5


# ---------------------------------------------------------------------------------------------- when loaders are asked for
class Recorded(TinyModule):
    """Records the hooks around the loader requests of Lightning 2.6.5's tests/tests_pytorch/models/test_hooks.py."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def configure_optimizers(self):
        self.calls.append("configure_optimizers")
        return super().configure_optimizers()

    def on_fit_start(self):
        self.calls.append("on_fit_start")

    def on_validation_start(self):
        self.calls.append("on_validation_start")

    def on_train_start(self):
        self.calls.append("on_train_start")

    def train_dataloader(self):
        self.calls.append("train_dataloader")
        return loader(32, 16)

    def val_dataloader(self):
        self.calls.append(f"val_dataloader sanity_checking={self.trainer.sanity_checking}")
        return loader(32, 16)


class SanityMarks(Callback):
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def on_sanity_check_start(self, trainer, module):
        self.calls.append("on_sanity_check_start")

    def on_sanity_check_end(self, trainer, module):
        self.calls.append("on_sanity_check_end")


def test_a_fit_asks_for_its_loaders_where_lightning_does():
    model = Recorded()
    quiet_trainer(max_epochs=1, num_sanity_val_steps=1, callbacks=[SanityMarks(model.calls)]).fit(model)
    assert model.calls == [
        "configure_optimizers",
        "on_fit_start",
        "on_sanity_check_start",
        "val_dataloader sanity_checking=True",  # inside the sanity check, before the module's evaluation mode
        "on_validation_start",
        "on_sanity_check_end",
        "train_dataloader",
        "on_train_start",
        "on_validation_start",  # the epoch's validation: the sanity check's loaders, not asked for again
    ]


def test_without_a_sanity_check_the_validation_loaders_come_after_the_training_loader():
    model = Recorded()
    quiet_trainer(max_epochs=1, num_sanity_val_steps=0).fit(model)
    assert model.calls == [
        "configure_optimizers",
        "on_fit_start",
        "train_dataloader",
        "val_dataloader sanity_checking=False",
        "on_train_start",
        "on_validation_start",
    ]


def test_validate_asks_for_its_loader_as_it_starts():
    model = Recorded()
    quiet_trainer().validate(model, verbose=False)
    assert model.calls == ["val_dataloader sanity_checking=False", "on_validation_start"]


# Lightning 2.6.5's test_dataloaders_load_every_n_epochs_infrequent_val, a few of its cases: (num_sanity_val_steps,
# check_val_every_n_epoch, reload_dataloaders_every_n_epochs) -> the epochs train_dataloader() and (outside the sanity
# check) val_dataloader() are called in, over 10 epochs
@pytest.mark.parametrize(
    ("sanity", "check_every", "reload_every", "train_epochs", "val_epochs"),
    [
        (0, 1, 1, list(range(10)), list(range(10))),
        (1, 1, 2, [0, 2, 4, 6, 8], [2, 4, 6, 8]),
        (0, 3, 4, [0, 4, 8], [2, 8]),
        (1, 3, 4, [0, 4, 8], [2, 8]),
        (1, 2, 1, list(range(10)), [1, 3, 5, 7, 9]),
        (0, 5, 2, [0, 2, 4, 6, 8], [4, 9]),
        (1, 2, 2, [0, 2, 4, 6, 8], [1, 3, 5, 7, 9]),
    ],
)
def test_reload_dataloaders_every_n_epochs_asks_again_in_lightnings_epochs(
    sanity, check_every, reload_every, train_epochs, val_epochs
):
    asked: dict[str, list[int]] = {"train": [], "val": [], "sanity": []}

    class Reloaded(TinyModule):
        def train_dataloader(self):
            asked["train"].append(self.current_epoch)
            return loader(16, 16)

        def val_dataloader(self):
            asked["sanity" if self.trainer.sanity_checking else "val"].append(self.current_epoch)
            return loader(16, 16)

    trainer = quiet_trainer(
        max_epochs=10,
        num_sanity_val_steps=sanity,
        check_val_every_n_epoch=check_every,
        reload_dataloaders_every_n_epochs=reload_every,
    )
    trainer.fit(Reloaded())
    assert asked == {"train": train_epochs, "val": val_epochs, "sanity": [0] if sanity else []}


def test_hooks_set_on_the_instance_are_called_and_none_is_skipped():
    """Lightning calls what ``getattr`` finds: a function set on the module or a callback instance runs; a hook set
    to None does not (and does not crash)."""
    seen = []
    model = TinyModule()
    model.on_train_start = lambda: seen.append("module.on_train_start")
    model.on_train_epoch_end = None
    callback = Callback()
    callback.on_train_end = lambda trainer, module: seen.append("callback.on_train_end")
    callback.on_train_epoch_start = None
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, callbacks=[callback])
    trainer.fit(model, loader(32))
    assert seen == ["module.on_train_start", "callback.on_train_end"]


# ====================================================================== Lightning's order, where a user sees it
class _Recorded(TinyModule):
    """Records the hooks (and ``zero_grad``) the Trainer calls on it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.calls.append("zero_grad")
        super().zero_grad(set_to_none)

    def configure_optimizers(self):
        self.calls.append("configure_optimizers")
        return super().configure_optimizers()

    def on_fit_start(self):
        self.calls.append("on_fit_start")

    def val_dataloader(self):
        self.calls.append("val_dataloader")
        return loader(16)

    def test_dataloader(self):
        self.calls.append("test_dataloader")
        return loader(16)

    def on_validation_start(self):
        self.calls.append("on_validation_start")

    def on_test_start(self):
        self.calls.append("on_test_start")


def test_each_run_zeroes_the_gradients_after_on_fit_start_as_lightning():
    module = _Recorded()
    quiet_trainer(max_steps=1, limit_val_batches=0).fit(module, loader())
    assert module.calls[:3] == ["configure_optimizers", "on_fit_start", "zero_grad"]  # Lightning's test_hooks order


@pytest.mark.parametrize(("stage", "hook"), [("validate", "validation"), ("test", "test")])
def test_an_evaluation_limited_to_zero_batches_asks_for_no_loader_and_runs_no_hook(stage, hook):
    module = _Recorded()
    trainer = quiet_trainer(**{f"limit_{'val' if stage == 'validate' else stage}_batches": 0})
    assert getattr(trainer, stage)(module) == []
    assert module.calls == ["zero_grad"]  # no {stage}_dataloader(), no on_{hook}_start (Lightning skips the stage)


def test_a_datamodule_transfer_hook_that_only_wraps_the_base_is_not_called():
    # Lightning picks the DataModule's batch-transfer hooks only where it overrides them (is_overridden sees
    # through functools wrappers): a wrapper of the base's no-op set on the instance is not an override
    called = []

    class Data(tandem.DataModule):
        def train_dataloader(self):
            return loader(32)

    data = Data()
    for name in ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer"):
        method = getattr(data, name)
        wrapper = functools.partial(lambda name, method, *args: called.append(name) or method(*args), name, method)
        setattr(data, name, functools.update_wrapper(wrapper, method))
    quiet_trainer(max_steps=2, limit_val_batches=0).fit(TinyModule(), datamodule=data)
    assert called == []


def test_trainer_state_finished_and_enable_validation_are_lightnings():
    trainer = quiet_trainer(max_steps=1)
    assert not trainer.state.finished and not trainer.state.stopped and not trainer.enable_validation
    trainer.fit(TinyModule(), loader(), loader(16))
    assert trainer.state.finished and trainer.state.stopped and trainer.enable_validation
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0)
    trainer.fit(TinyModule(), loader(), loader(16))
    assert not trainer.enable_validation  # limit_val_batches=0: the fit does not validate

    class Fails(TinyModule):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    trainer = quiet_trainer(max_steps=1)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Fails(), loader())
    assert trainer.state.stopped and not trainer.state.finished


def test_a_run_failing_before_the_module_is_set_up_tears_down_its_own_module():
    """The teardown hooks get the run's module even when the run fails before the strategy took it (in ``setup``):
    not None on a first run, not the previous run's module on a later one."""

    class Record(Callback):
        def __init__(self) -> None:
            self.torn_down: list[object] = []

        def teardown(self, trainer, pl_module, stage):
            self.torn_down.append(pl_module)

    class FailsInSetup(TinyModule):
        def __init__(self) -> None:
            super().__init__()
            self.teardowns: list[str] = []

        def setup(self, stage):
            raise ValueError("no data today")

        def teardown(self, stage):
            self.teardowns.append(stage)

    record = Record()
    trainer = quiet_trainer(max_steps=1, callbacks=[record])
    first = FailsInSetup()
    with pytest.raises(ValueError, match="no data today"):
        trainer.fit(first, loader())
    assert record.torn_down == [first] and first.teardowns == ["fit"]

    trained = TinyModule()
    trainer.fit(trained, loader())  # the strategy now holds this one
    failing = FailsInSetup()
    with pytest.raises(ValueError, match="no data today"):
        trainer.fit(failing, loader())
    assert record.torn_down == [first, trained, failing] and failing.teardowns == ["fit"]
