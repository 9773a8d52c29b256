"""Mistakes in how a module, its data and the Trainer fit together get an error or a one-time warning naming the
fix (Lightning's configuration validator and fit-loop messages), instead of passing silently."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

import tandem
from helpers import TinyModule, loader, quiet_trainer
from tandem.utilities import PossibleUserWarning
from tandem.utilities.exceptions import TandemUserCodeError

pytestmark = pytest.mark.timeout(60)


class NoValidationStep(TinyModule):
    validation_step = tandem.TrainingModule.validation_step  # the base's: not overridden


class OwnValData(NoValidationStep):
    def val_dataloader(self):
        return loader(16)


def _messages(caught) -> str:
    return "\n".join(str(w.message) for w in caught)


# ====================================================================== validation_step and validation data
@pytest.mark.parametrize("source", ["argument", "module"])
def test_validation_data_without_validation_step_warns_and_skips_validation(source):
    module = NoValidationStep() if source == "argument" else OwnValData()
    val = loader(16) if source == "argument" else None
    trainer = quiet_trainer(max_epochs=1)
    with pytest.warns(
        UserWarning, match=r"validation data .* but \w+ has no validation_step: the validation loop is skipped"
    ):
        trainer.fit(module, loader(), val)
    assert trainer.num_val_batches == []


def test_validation_step_without_validation_data_warns():
    trainer = quiet_trainer(max_epochs=1)
    with pytest.warns(PossibleUserWarning, match=r"TinyModule defines validation_step but the fit got no validation"):
        trainer.fit(TinyModule(), loader())


def test_no_warning_when_validation_is_turned_off_or_both_are_there():
    for kwargs, val in ((dict(limit_val_batches=0), None), ({}, loader(16))):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            quiet_trainer(max_epochs=1, **kwargs).fit(TinyModule(), loader(), val)
        assert "validation" not in _messages(caught)


def test_test_data_without_test_step_is_an_error():
    class NoTestStep(TinyModule):
        test_step = tandem.TrainingModule.test_step

    with pytest.raises(TandemUserCodeError, match=r"Trainer.test needs NoTestStep.test_step\(\) to be defined"):
        quiet_trainer().test(NoTestStep(), loader())


# ====================================================================== what a module must define
def test_fit_without_training_step_fails_before_any_work():
    ran = []

    class NoTrainingStep(tandem.TrainingModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 3)

        def validation_step(self, batch, batch_idx):
            ran.append(batch_idx)  # the sanity check must not run first

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(TandemUserCodeError, match=r"NoTrainingStep has no training_step\(\). Trainer.fit needs"):
        quiet_trainer(num_sanity_val_steps=2).fit(NoTrainingStep(), loader(), loader(16))
    assert ran == []


def test_predict_without_predict_step_or_forward_is_an_error():
    class NoForward(tandem.TrainingModule):
        pass

    with pytest.raises(TandemUserCodeError, match=r"Trainer.predict needs NoForward.predict_step\(\) or .*forward"):
        quiet_trainer().predict(NoForward(), loader())


@pytest.mark.parametrize(
    ("hook", "fn", "instead"),
    [
        ("training_epoch_end", "fit", "on_train_epoch_end"),
        ("validation_epoch_end", "fit", "on_validation_epoch_end"),
        ("validation_epoch_end", "validate", "on_validation_epoch_end"),
        ("test_epoch_end", "test", "on_test_epoch_end"),
        ("training_step_end", "fit", "the end of training_step"),
    ],
)
def test_lightning_1x_hooks_that_would_never_run_are_an_error(hook, fn, instead):
    Legacy = type("Legacy", (TinyModule,), {hook: lambda self, outputs: None})
    trainer = quiet_trainer(max_epochs=1)
    call = {"fit": lambda: trainer.fit(Legacy(), loader(), loader(16))}.get(
        fn, lambda: getattr(trainer, fn)(Legacy(), loader(16))
    )
    with pytest.raises(TandemUserCodeError, match=rf"Legacy defines {hook}\(\), a Lightning 1.x hook .*{instead}"):
        call()


# ====================================================================== val_check_interval
def test_val_check_interval_longer_than_the_epoch_is_an_error():
    trainer = quiet_trainer(max_epochs=2, val_check_interval=6)
    with pytest.raises(
        ValueError, match=r"val_check_interval \(6\) must be less than or equal to the number of the training batches"
    ) as caught:
        trainer.fit(TinyModule(), loader(64, 16), loader(16))
    assert "limit_val_batches=0" in str(caught.value) and "check_val_every_n_epoch=None" in str(caught.value)
    quiet_trainer(max_epochs=1, val_check_interval=6, limit_val_batches=0).fit(TinyModule(), loader(64, 16))


class _ValidationSteps(tandem.Callback):
    def __init__(self):
        self.steps = []

    def on_validation_end(self, trainer, module):
        if not trainer.sanity_checking:
            self.steps.append(trainer.global_step)


@pytest.mark.parametrize(("interval", "expected"), [(6, [6, 12]), (3, [3, 6, 9, 12])])
def test_check_val_every_n_epoch_none_counts_batches_over_epochs(interval, expected):
    # Lightning's rule: validate after every `interval` training batches of the fit (4 per epoch here), and at an
    # epoch's end only when the count falls there
    seen = _ValidationSteps()
    trainer = quiet_trainer(max_epochs=3, check_val_every_n_epoch=None, val_check_interval=interval, callbacks=[seen])
    trainer.fit(TinyModule(), loader(64, 16), loader(16))
    assert seen.steps == expected


def test_check_val_every_n_epoch_none_counts_on_after_a_resume(tmp_path):
    seen = _ValidationSteps()
    first = quiet_trainer(max_epochs=1, check_val_every_n_epoch=None, val_check_interval=6)
    first.fit(TinyModule(), loader(64, 16), loader(16))
    first.save_checkpoint(tmp_path / "epoch0.ckpt")
    resumed = quiet_trainer(max_epochs=3, check_val_every_n_epoch=None, val_check_interval=6, callbacks=[seen])
    resumed.fit(TinyModule(), loader(64, 16), loader(16), ckpt_path=tmp_path / "epoch0.ckpt")
    assert seen.steps == [6, 12]


# ====================================================================== why fit stopped
@pytest.fixture
def info_lines(caplog):
    """The rank-zero info messages (the logger tandem's rank_zero_info writes to does not propagate)."""
    logger = logging.getLogger("lightning_utilities.core.rank_zero")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger.name)
    yield lambda: [r.getMessage() for r in caplog.records if r.name == logger.name]
    logger.removeHandler(caplog.handler)


class _StopAt(tandem.Callback):
    def on_train_epoch_end(self, trainer, module):
        trainer.should_stop = trainer.current_epoch >= 1


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        (dict(max_epochs=2), "`Trainer.fit` stopped: `max_epochs=2` reached."),
        (dict(max_steps=3), "`Trainer.fit` stopped: `max_steps=3` reached."),
        (dict(max_epochs=5, callbacks=[_StopAt()]), "`Trainer.fit` stopped: `trainer.should_stop` was set"),
    ],
)
def test_every_fit_says_once_why_it_stopped(info_lines, kwargs, reason):
    quiet_trainer(limit_val_batches=0, **kwargs).fit(TinyModule(), loader())
    stopped = [line for line in info_lines() if "`Trainer.fit` stopped" in line]
    assert len(stopped) == 1 and stopped[0].startswith(reason), stopped


def test_fit_again_on_a_finished_trainer_says_so_and_the_fix(info_lines):
    trainer = quiet_trainer(max_epochs=1, limit_val_batches=0)
    trainer.fit(TinyModule(), loader())
    module = TinyModule()
    before = [p.clone() for p in module.parameters()]
    with pytest.warns(
        UserWarning, match=r"trained nothing: training is already at epoch 1, global step 4, so max_epochs=1 is reached"
    ) as caught:
        trainer.fit(module, loader())
    assert "use a new Trainer" in str(caught[0].message) and "ckpt_path=" in str(caught[0].message)
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))


def test_max_epochs_zero_says_that_nothing_is_trained():
    with pytest.warns(UserWarning, match=r"trained nothing: max_epochs=0 leaves nothing to train. Set max_epochs"):
        quiet_trainer(max_epochs=0, limit_val_batches=0).fit(TinyModule(), loader())
