import pytest

from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import Callback, LambdaCallback
from tandem.callbacks.lambda_function import HOOKS
from tandem.utilities.exceptions import TandemConfigError

pytestmark = pytest.mark.timeout(60)


def test_every_hook_given_is_called_with_the_hooks_arguments_and_the_others_are_not():
    calls = []
    callback = LambdaCallback(
        setup=lambda trainer, module, stage: calls.append(("setup", stage)),
        on_fit_start=lambda trainer, module: calls.append(("fit_start", trainer.global_step)),
        on_train_batch_end=lambda trainer, module, outputs, batch, batch_idx: calls.append(("batch", batch_idx)),
        on_validation_epoch_end=lambda trainer, module: calls.append(("val", trainer.current_epoch)),
        on_train_epoch_end=lambda trainer, module: calls.append(("epoch", trainer.current_epoch)),
        teardown=lambda trainer, module, stage: calls.append(("teardown", stage)),
        on_train_start=None,  # None: not given
    )
    quiet_trainer(max_epochs=2, callbacks=[callback]).fit(TinyModule(), loader(32, 16), loader(16, 16))
    epoch = [("batch", 0), ("batch", 1)]
    assert calls == [
        ("setup", "fit"), ("fit_start", 0), *epoch, ("val", 0), ("epoch", 0), *epoch, ("val", 1), ("epoch", 1),
        ("teardown", "fit"),
    ]  # fmt: skip
    assert "on_train_start" not in vars(callback)


def test_on_exception_gets_the_exception():
    class Fails(TinyModule):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    seen = []
    callback = LambdaCallback(on_exception=lambda trainer, module, exception: seen.append(str(exception)))
    with pytest.raises(RuntimeError, match="boom"):
        quiet_trainer(max_epochs=1, callbacks=[callback]).fit(Fails(), loader(16, 16))
    assert seen == ["boom"]


def test_every_callback_hook_is_a_keyword_and_unknown_names_are_refused():
    assert {"setup", "teardown", "on_exception", "on_save_checkpoint", "on_before_backward"} <= set(HOOKS)
    assert set(HOOKS) == {n for n in dir(Callback) if n in ("setup", "teardown") or n.startswith("on_")}
    LambdaCallback(**dict.fromkeys(HOOKS, print))
    with pytest.raises(
        TandemConfigError, match="'on_train_epoch_ends' is not a callback hook. Did you mean 'on_train_epoch_end'"
    ):
        LambdaCallback(on_train_epoch_ends=print)
    with pytest.raises(TandemConfigError, match="on_fit_end must be a function"):
        LambdaCallback(on_fit_end=3)
