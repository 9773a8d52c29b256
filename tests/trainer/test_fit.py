"""Training behaviour on a single device: steps, hooks, accumulation, clipping, parity with plain torch."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler

import tandem
from helpers import TinyModule, float16_mixed, loader, make_data, max_abs_diff, quiet_trainer
from tandem.utilities.exceptions import PossibleUserWarning

pytestmark = pytest.mark.timeout(60)


def test_fit_counts_epochs_and_steps_and_lowers_the_loss():
    tandem.seed_everything(0)
    model = TinyModule(lr=0.1)
    x, y = make_data(64).tensors
    before = F.cross_entropy(model(x), y).item()
    trainer = quiet_trainer(max_epochs=5)
    trainer.fit(model, loader(64, 16, shuffle=True))
    assert trainer.current_epoch == 5
    assert trainer.global_step == 5 * 4
    assert F.cross_entropy(model(x), y).item() < before * 0.8


def test_max_steps_stops_mid_epoch_and_limit_train_batches_caps_each_epoch():
    trainer = quiet_trainer(max_steps=6)
    trainer.fit(TinyModule(), loader(64, 16))
    assert trainer.global_step == 6 and trainer.current_epoch == 2
    trainer = quiet_trainer(max_epochs=3, limit_train_batches=2)
    trainer.fit(TinyModule(), loader(64, 16))
    assert trainer.global_step == 6 and trainer.num_training_batches == 2
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=0.5)
    trainer.fit(TinyModule(), loader(64, 16))
    assert trainer.global_step == 2


@pytest.mark.parametrize("data_order", ["sampler", "global"])
def test_parity_with_a_hand_written_loop_shuffled_dropout_adam_steplr(data_order):
    """The default order is the loader's own (the hand loop iterates the same shuffling loader); the global order is
    the permutation of seed + epoch that N processes would share."""
    tandem.seed_everything(3)
    model = TinyModule(lr=0.01, optimizer="adam", dropout=0.2, scheduler=True)
    reference = copy.deepcopy(model)
    state = torch.get_rng_state()
    quiet_trainer(max_epochs=3, data_order=data_order).fit(model, loader(64, 16, shuffle=True))

    torch.set_rng_state(state)
    opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    dataset = loader(64, 16).dataset
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=3)
    data = (
        DataLoader(dataset, batch_size=16, sampler=sampler) if data_order == "global" else loader(64, 16, shuffle=True)
    )
    reference.train()
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in data:
            loss = F.cross_entropy(reference(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        sched.step()
    assert max_abs_diff(model.state_dict(), reference.state_dict()) == 0.0


def test_accumulating_two_half_batches_equals_one_full_batch():
    tandem.seed_everything(0)
    a = TinyModule(lr=0.1)
    b = copy.deepcopy(a)
    quiet_trainer(max_epochs=2, accumulate_grad_batches=2).fit(a, loader(64, 8))
    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(b, loader(64, 16))
    assert trainer.global_step == 8
    assert max_abs_diff(a.state_dict(), b.state_dict()) < 1e-6


def test_an_epoch_of_unknown_length_steps_its_last_accumulation_window():
    class Stream(torch.utils.data.IterableDataset):  # 5 batches of 8: no __len__
        def __iter__(self):
            data = make_data(40)
            return (data[i] for i in range(40))

    tandem.seed_everything(0)
    a = TinyModule(lr=0.1)
    b = copy.deepcopy(a)
    streamed = quiet_trainer(max_epochs=2, accumulate_grad_batches=3)
    streamed.fit(a, DataLoader(Stream(), batch_size=8))
    sized = quiet_trainer(max_epochs=2, accumulate_grad_batches=3)
    sized.fit(b, loader(40, 8))
    assert streamed.global_step == sized.global_step == 4  # windows of 3 and 2 batches each epoch
    assert all(p.grad is None for p in a.parameters())  # nothing carried into the next epoch
    assert max_abs_diff(a.state_dict(), b.state_dict()) == 0.0


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_gradient_clipping_limits_what_the_optimizer_sees(algorithm):
    seen = []

    class Spy(tandem.Callback):
        def on_before_optimizer_step(self, trainer, module, optimizer):
            seen.append([p.grad.clone() for p in module.parameters()])

    class Clipped(TinyModule):
        def on_before_zero_grad(self, optimizer):
            seen.append([p.grad.clone() for p in self.parameters()])

    quiet_trainer(max_steps=3, gradient_clip_val=0.01, gradient_clip_algorithm=algorithm, callbacks=[Spy()]).fit(
        Clipped(lr=10.0), loader()
    )
    before, after = seen[0], seen[1]
    if algorithm == "norm":
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in after]))
        assert total <= 0.01 + 1e-6
        assert torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in before])) > 0.01
    else:
        assert max(g.abs().max().item() for g in after) <= 0.01 + 1e-7


def test_hooks_run_in_lightnings_order_callbacks_then_the_module_and_checkpoints_last(tmp_path):
    """Lightning's order: each event on the callbacks, in the order given, then on the module; the checkpoint
    callbacks moved after the others; on_train_epoch_end on the monitoring callbacks (EarlyStopping, the
    checkpoint callbacks) after the module's, so that they see what it logged there."""
    from tandem.callbacks import EarlyStopping, ModelCheckpoint

    calls = []

    class Recorder(tandem.Callback):
        def __init__(self, name):
            self.name = name

        @property
        def state_key(self):
            return self.name

        def on_train_epoch_start(self, trainer, module):
            calls.append((self.name, "on_train_epoch_start"))

        def on_validation_end(self, trainer, module):
            calls.append((self.name, "on_validation_end"))

        def on_train_epoch_end(self, trainer, module):
            assert "val_loss" in trainer.callback_metrics  # validation ran before the epoch's end
            assert "from_module" not in trainer.callback_metrics  # the module's hook runs after this one
            calls.append((self.name, "on_train_epoch_end"))

    class Stop(EarlyStopping):
        def on_train_epoch_end(self, trainer, module):
            calls.append(("stop", "on_train_epoch_end"))
            super().on_train_epoch_end(trainer, module)

    class Saver(ModelCheckpoint):
        def on_train_epoch_end(self, trainer, module):
            assert "from_module" in trainer.callback_metrics  # a monitoring callback: after the module's hook
            calls.append(("checkpoint", "on_train_epoch_end"))
            super().on_train_epoch_end(trainer, module)

    class Hooked(TinyModule):
        def on_train_epoch_start(self):
            calls.append(("module", "on_train_epoch_start"))

        def on_train_epoch_end(self):
            self.log("from_module", 1.0)
            calls.append(("module", "on_train_epoch_end"))

    saver, stop = Saver(dirpath=tmp_path, monitor="from_module"), Stop(monitor="val_loss")
    callbacks = [saver, Recorder("b"), stop, Recorder("a")]
    trainer = quiet_trainer(max_epochs=1, callbacks=callbacks)
    assert [getattr(c, "name", c) for c in trainer.callbacks] == ["b", stop, "a", saver]
    trainer.fit(Hooked(), loader(), loader())
    assert calls == [
        ("b", "on_train_epoch_start"),
        ("a", "on_train_epoch_start"),
        ("module", "on_train_epoch_start"),
        ("b", "on_validation_end"),
        ("a", "on_validation_end"),
        ("b", "on_train_epoch_end"),
        ("a", "on_train_epoch_end"),
        ("module", "on_train_epoch_end"),
        ("stop", "on_train_epoch_end"),
        ("checkpoint", "on_train_epoch_end"),
    ]
    assert saver.best_model_score == 1.0  # it read the value the module logged in the same hook


def test_the_modules_on_train_batch_start_decides_whatever_the_callbacks_return():
    class Returns(tandem.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            return -1  # ignored: a callback's return value says nothing (Lightning's rule)

    class EndsAtSecond(TinyModule):
        def on_train_batch_start(self, batch, batch_idx):
            return -1 if batch_idx == 1 else None

    trainer = quiet_trainer(max_epochs=1, callbacks=[Returns()])
    trainer.fit(EndsAtSecond(), loader(64, 16))
    assert trainer.global_step == 1  # the module's -1 at batch 1 ends the epoch; the callback's -1 did not


def test_training_step_returning_none_skips_the_batch_and_still_counts_its_step_as_lightning():
    """Lightning takes the optimizer step of a batch whose training_step returned None (it finds no gradient, so
    nothing moves) and counts it: global_step, max_steps and the per-step schedulers advance alike."""

    class Skipper(TinyModule):
        def training_step(self, batch, batch_idx):
            self.steps_seen.append(self.trainer.global_step)
            return None if batch_idx % 2 else super().training_step(batch, batch_idx)

        def configure_optimizers(self):
            sgd = torch.optim.SGD(self.parameters(), lr=0.1)
            return {
                "optimizer": sgd,
                "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(sgd, 1, 0.5), "interval": "step"},
            }

    model = Skipper()
    model.steps_seen = []
    trainer = quiet_trainer(max_epochs=1)
    with pytest.warns(PossibleUserWarning, match=r"`training_step` returned `None`") as got:
        trainer.fit(model, loader(64, 16))
    assert len([w for w in got if "returned `None`" in str(w.message)]) == 1  # once per fit
    assert trainer.global_step == 4 and model.steps_seen == [0, 1, 2, 3]
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**4)


def test_validation_interval_sanity_check_and_check_every_n_epochs():
    counts = {"val_batches": 0, "sanity": 0}

    class Count(tandem.Callback):
        def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx):
            counts["val_batches"] += 1
            counts["sanity"] += trainer.sanity_checking

    trainer = quiet_trainer(max_epochs=2, val_check_interval=0.5, num_sanity_val_steps=2, callbacks=[Count()])
    trainer.fit(TinyModule(), loader(64, 16), loader(48, 16))
    assert counts == {"sanity": 2, "val_batches": 2 + 2 * 2 * 3}
    assert "val_loss" in trainer.callback_metrics
    counts.update(val_batches=0, sanity=0)
    quiet_trainer(max_epochs=4, check_val_every_n_epoch=2, callbacks=[Count()]).fit(
        TinyModule(), loader(64, 16), loader(48, 16)
    )
    assert counts["val_batches"] == 2 * 3


def test_sanity_check_metrics_are_not_kept():
    trainer = quiet_trainer(max_epochs=1, num_sanity_val_steps=1, limit_train_batches=0)
    with pytest.warns(UserWarning, match="No training batches"):
        trainer.fit(TinyModule(), loader(), loader())
    # no training batches, but the end-of-epoch validation ran for real
    assert "val_loss" in trainer.callback_metrics


def test_validate_test_and_predict_return_values():
    tandem.seed_everything(0)
    model = TinyModule()
    trainer = quiet_trainer()
    data = loader(50, 16)
    (val,) = trainer.validate(model, data)
    (test,) = trainer.test(model, data)
    x, y = make_data(50).tensors
    with torch.no_grad():
        expected = F.cross_entropy(model(x), y).item()
    assert val["val_loss"] == pytest.approx(expected, rel=1e-5)  # batch-size weighted epoch mean
    assert test["test_loss"] == pytest.approx(expected, rel=1e-5)
    predictions = trainer.predict(model, DataLoader(make_data(50), batch_size=16))
    assert [p.shape[0] for p in predictions] == [16, 16, 16, 2]
    with torch.no_grad():
        assert torch.allclose(torch.cat(predictions), model(x))


def test_fast_dev_run_runs_one_batch_of_each_and_writes_nothing(tmp_path):
    trainer = tandem.Trainer(fast_dev_run=True, accelerator="cpu", enable_progress_bar=False, default_root_dir=tmp_path)
    trainer.fit(TinyModule(), loader(), loader())
    assert trainer.global_step == 1
    assert [type(logger).__name__ for logger in trainer.loggers] == ["DummyLogger"]  # Lightning's: writes nothing
    assert not any(tmp_path.rglob("*.ckpt")) and not any(tmp_path.rglob("events.out.*"))


def test_datamodule_prepare_setup_and_loaders():
    events = []

    class DM(tandem.DataModule):
        def prepare_data(self):
            events.append("prepare")

        def setup(self, stage):
            events.append(f"setup:{stage}")

        def train_dataloader(self):
            return loader()

        def val_dataloader(self):
            return loader(32)

    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(TinyModule(), datamodule=DM())
    assert events == ["prepare", "setup:fit"]
    assert "val_loss" in trainer.callback_metrics


def test_precisions_on_cpu():
    for precision, dtype in (("64-true", torch.float64), ("bf16-mixed", torch.float32), ("32-true", torch.float32)):
        model = TinyModule()
        trainer = quiet_trainer(max_steps=2, precision=precision)
        trainer.fit(model, loader())
        assert next(model.parameters()).dtype == dtype
        assert trainer.precision == precision


def test_float16_mixed_scaler_state_is_checkpointed(tmp_path):
    model = TinyModule()
    trainer = quiet_trainer(max_steps=3, **float16_mixed())
    trainer.fit(model, loader())
    path = tmp_path / "amp.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)
    assert saved["precision"]["scaler"]["scale"] == trainer.strategy.precision.scaler.get_scale()
    resumed = quiet_trainer(max_steps=4, **float16_mixed())
    resumed.fit(TinyModule(), loader(), ckpt_path=path)
    assert resumed.global_step == 4


def test_deterministic_flag_turns_on_deterministic_algorithms():
    try:
        quiet_trainer(max_steps=1, deterministic=True).fit(TinyModule(), loader())
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_module_properties_inside_a_run():
    seen = {}

    class Props(TinyModule):
        def on_train_epoch_end(self):
            seen.update(
                epoch=self.current_epoch,
                step=self.global_step,
                rank=self.global_rank,
                device=self.device,
                trainer=self.trainer,
            )

    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(Props(), loader())
    assert seen == {"epoch": 0, "step": 4, "rank": 0, "device": torch.device("cpu"), "trainer": trainer}


def test_the_sanity_check_does_not_change_the_training_order():
    """As Lightning (isolate_rng): adding a validation loader leaves the first epoch's shuffled order alone."""

    class Records(TinyModule):
        def __init__(self):
            super().__init__()
            self.seen: list[list[float]] = []

        def training_step(self, batch, batch_idx):
            self.seen.append(batch[0][:, 0].tolist())
            return super().training_step(batch, batch_idx)

    def first_epoch(val: Any) -> list[list[float]]:
        tandem.seed_everything(7)
        model = Records()
        quiet_trainer(max_epochs=1, num_sanity_val_steps=2).fit(model, loader(64, 16, shuffle=True), val)
        return model.seen

    assert first_epoch(None) == first_epoch(loader(32, 16))


def test_a_stop_asked_on_one_rank_or_by_max_time_stops_every_rank_at_the_same_step(core_ddp):
    for rank in core_ddp["stopping"]:  # before: each epoch's end (global_step 8), and only from there
        assert rank["one_rank"] == (4, 1)  # the publishing step after rank 1 asked (batch 3 of 8)
        assert rank["max_time"] == 2  # out of time after batch 0: the first publishing step, batch 1
