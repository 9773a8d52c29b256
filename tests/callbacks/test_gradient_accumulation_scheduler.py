import inspect

import pytest

from callbacks._fake import fake_trainer
from helpers import TinyModule, loader, quiet_trainer
from tandem import Trainer
from tandem.callbacks import GradientAccumulationScheduler
from tandem.utilities.exceptions import TandemConfigError

_ATTRIBUTE = inspect.getattr_static(Trainer, "accumulate_grad_batches")
ASSIGNABLE = not (isinstance(_ATTRIBUTE, property) and _ATTRIBUTE.fset is None)


def test_the_factor_of_each_epoch_and_the_trainer_attribute_it_sets():
    callback = GradientAccumulationScheduler({2: 4, 5: 2})
    assert [callback.get_accumulate_grad_batches(e) for e in range(7)] == [1, 1, 4, 4, 4, 2, 2]
    assert callback.going_to_accumulate_grad_batches()
    trainer = fake_trainer(".")
    callback.on_train_start(trainer, TinyModule())
    for epoch, expected in ((0, 1), (3, 4), (6, 2)):
        trainer.current_epoch = epoch
        callback.on_train_epoch_start(trainer, None)
        assert trainer.accumulate_grad_batches == expected
    callback.on_train_start(trainer, TinyModule())  # its own value from an earlier fit is no conflict


def test_conflicts_and_bad_schedules_name_the_fix():
    with pytest.raises(
        TandemConfigError, match="Remove accumulate_grad_batches from the Trainer or remove the callback"
    ):
        GradientAccumulationScheduler({0: 2}).on_train_start(fake_trainer(".", accumulate_grad_batches=4), TinyModule())
    manual = TinyModule()
    manual.automatic_optimization = False
    with pytest.raises(TandemConfigError, match="manual optimization"):
        GradientAccumulationScheduler({0: 2}).on_train_start(fake_trainer("."), manual)
    for scheduling, message in (({}, "non-empty dict"), ({-1: 2}, r"epochs \[-1\]"), ({0: 0}, r"factors \[0\]")):
        with pytest.raises(TandemConfigError, match=message):
            GradientAccumulationScheduler(scheduling)


@pytest.mark.timeout(60)
@pytest.mark.skipif(not ASSIGNABLE, reason="needs an assignable Trainer.accumulate_grad_batches (the core branch)")
def test_a_real_fit_accumulates_as_scheduled():
    trainer = quiet_trainer(max_epochs=3, callbacks=[GradientAccumulationScheduler({1: 2, 2: 4})])
    trainer.fit(TinyModule(), loader(64, 8))  # 8 batches an epoch
    assert trainer.global_step == 8 + 4 + 2
