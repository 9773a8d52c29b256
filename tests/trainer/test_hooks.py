"""The hook dispatcher: one table, the hook running now (what self.log's defaults follow), one stage field."""

from __future__ import annotations

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
