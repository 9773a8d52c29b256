"""Trainer arguments and attributes Lightning programs use: min_epochs / min_steps, verbose results, the
public records (datamodule, interrupted, early_stopping_callback, ...), an assignable
accumulate_grad_batches, and Lightning 1.x arguments answered with their Lightning 2 spelling."""

from __future__ import annotations

import copy

import pytest
import torch

import tandem
from helpers import TinyModule, loader, max_abs_diff, quiet_trainer
from tandem.callbacks import EarlyStopping
from tandem.utilities.exceptions import TandemConfigError

pytestmark = pytest.mark.timeout(60)


class StopsAtOnce(TinyModule):
    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.trainer.should_stop = True


@pytest.mark.parametrize(
    ("settings", "epochs", "steps"),
    [(dict(), 1, 1), (dict(min_epochs=3), 3, 12), (dict(min_steps=6), 2, 6), (dict(min_epochs=2, min_steps=3), 2, 8)],
)
def test_min_epochs_and_min_steps_hold_off_should_stop(settings, epochs, steps):
    trainer = quiet_trainer(max_epochs=10, **settings)
    trainer.fit(StopsAtOnce(), loader(64, 16))
    assert (trainer.current_epoch, trainer.global_step) == (epochs, steps)


def test_early_stopping_waits_for_min_epochs():
    class Flat(TinyModule):
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", 1.0)

    stopping = EarlyStopping("val_loss", patience=1)
    trainer = quiet_trainer(max_epochs=10, min_epochs=5, callbacks=[stopping])
    trainer.fit(Flat(), loader(32, 16), loader(32, 16))
    assert trainer.current_epoch == 5 and trainer.early_stopping_callback is stopping
    assert quiet_trainer().early_stopping_callback is None


def test_test_and_validate_print_a_results_table_when_verbose(capsys):
    trainer = quiet_trainer()
    trainer.test(TinyModule(), loader(32, 16))
    table = capsys.readouterr().out
    assert "Test metric" in table and "DataLoader 0" in table and "test_loss" in table
    trainer.validate(TinyModule(), loader(32, 16), verbose=False)
    assert capsys.readouterr().out == ""


def test_public_records_of_a_run():
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=3)
    assert trainer.num_training_batches == 0 and trainer.train_dataloader is None and not trainer.interrupted
    trainer.fit(TinyModule(), loader(64, 16), loader(32, 16))
    assert trainer.num_training_batches == 3 and trainer.num_val_batches == [2]
    assert trainer.train_dataloader is not None and trainer.val_dataloaders is not None
    assert trainer.state.status == "finished" and not trainer.interrupted

    class Crash(TinyModule):
        def training_step(self, batch, batch_idx):
            raise KeyboardInterrupt

    trainer = quiet_trainer(max_epochs=1)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(Crash(), loader())
    assert trainer.interrupted


def test_accumulate_grad_batches_may_change_between_epochs():
    class Schedule(tandem.Callback):  # what GradientAccumulationScheduler does
        def on_train_epoch_start(self, trainer, module):
            trainer.accumulate_grad_batches = 1 if trainer.current_epoch == 0 else 4

    torch.manual_seed(0)
    model = TinyModule()
    reference = copy.deepcopy(model)
    trainer = quiet_trainer(max_epochs=2, callbacks=[Schedule()])
    trainer.fit(model, loader(64, 16))
    assert trainer.global_step == 4 + 1  # epoch 0: a step per batch; epoch 1: one step for 4 batches
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for x, y in loader(64, 16):  # epoch 0: one step per batch
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    for x, y in loader(64, 64):  # epoch 1: 4 batches of 16 accumulated = one batch of 64
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
    assert max_abs_diff(model.state_dict(), reference.state_dict()) < 1e-6
    with pytest.raises(TandemConfigError, match="accumulate_grad_batches=0 is out of range"):
        trainer.accumulate_grad_batches = 0


def test_sync_batchnorm_reaches_the_strategy_and_is_refused_on_the_cpu():
    assert quiet_trainer(sync_batchnorm=True).strategy.sync_batchnorm  # one process: ignored
    # It reaches the strategy while the Trainer is built (one phase), so the refusal comes there, before any run.
    with pytest.raises(TandemConfigError, match="sync_batchnorm=True needs CUDA"):
        tandem.Trainer(strategy="ddp", accelerator="cpu", devices=2, sync_batchnorm=True)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(gpus=2), r"Trainer\(gpus=2\) is a Lightning 1.x argument.*accelerator='gpu', devices=N"),
        (dict(progress_bar_refresh_rate=5), r"progress_bar_refresh_rate=5\).*ProgressBar\(refresh_rate=N\)"),
        (dict(resume_from_checkpoint="a.ckpt"), r"resume_from_checkpoint='a.ckpt'\).*fit\(model, \.\.\., ckpt_path"),
        (dict(replace_sampler_ddp=False), r"use_distributed_sampler"),
        (dict(model_registry="hub"), r"model_registry=\.\.\.\) is not supported by tandem"),
        (dict(max_epoch=3), r"unknown argument max_epoch=3. Did you mean max_epochs="),
        (dict(min_epochs=-1), r"min_epochs=-1 is out of range"),
    ],
)
def test_lightning_1x_and_unknown_arguments_name_the_fix(kwargs, match):
    with pytest.raises(TandemConfigError, match=match):
        tandem.Trainer(accelerator="cpu", **kwargs)


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled", "ignore:Error detected in")
def test_benchmark_and_detect_anomaly():
    before = torch.backends.cudnn.benchmark
    try:
        trainer = quiet_trainer(max_steps=1, benchmark=True, detect_anomaly=True)
        trainer.fit(TinyModule(), loader())
        assert torch.backends.cudnn.benchmark is True
    finally:
        torch.backends.cudnn.benchmark = before

    class NaN(TinyModule):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch, batch_idx) * torch.sqrt(torch.tensor(-1.0, requires_grad=True))

    with pytest.raises(RuntimeError, match="returned nan"):
        quiet_trainer(max_steps=1, detect_anomaly=True).fit(NaN(), loader())


def test_configure_callbacks_adds_and_replaces_trainer_callbacks():
    class Count(tandem.Callback):
        epochs = 0

        def on_train_epoch_end(self, trainer, module):
            Count.epochs += 1

    class WithCallbacks(TinyModule):
        def configure_callbacks(self):
            return [EarlyStopping("val_loss", patience=7), Count()]

    trainer = quiet_trainer(max_epochs=2, callbacks=[EarlyStopping("val_loss", patience=1)])
    trainer.fit(WithCallbacks(), loader(32, 16), loader(32, 16))
    assert trainer.early_stopping_callback.patience == 7 and len(trainer.early_stopping_callbacks) == 1
    assert Count.epochs == 2 and sum(isinstance(c, Count) for c in trainer.callbacks) == 1


def test_state_fn_stage_and_status_are_lightnings_string_enums():
    from tandem.trainer.state import RunningStage, TrainerFn, TrainerStatus

    seen = []

    class Records(TinyModule):
        def training_step(self, batch, batch_idx):
            seen.append((self.trainer.state.fn, self.trainer.state.stage, self.trainer.state.status))
            return super().training_step(batch, batch_idx)

        def validation_step(self, batch, batch_idx):
            seen.append((self.trainer.state.fn, self.trainer.state.stage, self.trainer.state.status))

    trainer = quiet_trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=1)
    trainer.fit(Records(), loader(), loader(16))
    trainer.validate(Records(), loader(16), verbose=False)
    assert seen == [
        (TrainerFn.FITTING, RunningStage.SANITY_CHECKING, TrainerStatus.RUNNING),
        (TrainerFn.FITTING, RunningStage.TRAINING, TrainerStatus.RUNNING),
        (TrainerFn.FITTING, RunningStage.VALIDATING, TrainerStatus.RUNNING),
        (TrainerFn.VALIDATING, RunningStage.VALIDATING, TrainerStatus.RUNNING),
    ]
    fn, stage, status = seen[-1]
    assert isinstance(fn, TrainerFn) and fn.value == "validate" and fn == "validate" and f"{fn}" == "validate"
    assert stage.evaluating and not RunningStage.TRAINING.evaluating and {"validate": 1}[stage] == 1
    assert trainer.state.status is TrainerStatus.FINISHED and trainer.state.status.stopped and trainer.state.stopped
    assert status == "running" and str(status) == "running"
