"""Lightning's contract for self.log in the training loop: reduce_fx spellings, self.log from callbacks, the
progress bar callback, torchmetrics objects the module must own, and the loggers' calls."""

from __future__ import annotations

import pytest
import torch

import tandem
from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import ProgressBar, TQDMProgressBar
from tandem.loggers.logger import Logger
from tandem.utilities.exceptions import LogCallError, MisconfigurationException

pytestmark = pytest.mark.timeout(30)


class KeywordLogger(Logger):
    """Records how ``log_metrics`` was called: its positional and keyword arguments."""

    def __init__(self):
        super().__init__(".", name="keywords", version=0)
        self.calls: list[tuple[tuple, dict]] = []

    def log_metrics(self, *args, **kwargs):
        self.calls.append((args, kwargs))

    def log_hyperparams(self, params):
        pass


# ---------------------------------------------------------------------- reduce_fx


@pytest.mark.parametrize(
    ("fx", "expected"),
    [
        (min, 0.0),
        (torch.min, 0.0),
        ("MIN", 0.0),
        (max, 3.0),
        (torch.max, 3.0),
        ("Max", 3.0),
        (sum, 6.0),
        (torch.sum, 6.0),
        ("SUM", 6.0),
        ("avg", 1.5),
        ("AVG", 1.5),
        (torch.mean, 1.5),
        ("Mean", 1.5),
    ],
)
def test_reduce_fx_accepts_lightnings_spellings(fx, expected):
    """As Lightning: reduce_fx names in any case ("avg" is "mean"), torch's reductions and the builtins."""

    class Logs(TinyModule):
        def training_step(self, batch, batch_idx):
            self.log("idx", float(batch_idx), on_step=False, on_epoch=True, reduce_fx=fx)
            return super().training_step(batch, batch_idx)

    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(Logs(), loader(64, 16))  # batch_idx 0..3
    assert float(trainer.callback_metrics["idx"]) == expected


@pytest.mark.parametrize("fx", [torch.argmax, "median", lambda x: x, ["max"]])
def test_reduce_fx_refuses_other_reductions_with_lightnings_sentence(fx):
    class Logs(TinyModule):
        def training_step(self, batch, batch_idx):
            self.log("x", 1.0, reduce_fx=fx)
            return super().training_step(batch, batch_idx)

    with pytest.raises(MisconfigurationException, match=r"reduce_fx=\{min,max,mean,sum\}\)` are supported") as info:
        quiet_trainer(max_epochs=1, limit_train_batches=1).fit(Logs(), loader(64, 16))
    assert "torchmetrics.Metric" in str(info.value)  # the fix for a custom reduction


# ---------------------------------------------------------------------- progress bar callback


def test_progress_bar_callback_is_the_bar_in_use_or_none():
    assert isinstance(tandem.Trainer(logger=False, enable_checkpointing=False).progress_bar_callback, TQDMProgressBar)
    assert quiet_trainer().progress_bar_callback is None  # enable_progress_bar=False
    bar = ProgressBar(refresh_rate=5)
    assert quiet_trainer(enable_progress_bar=True, callbacks=[bar]).progress_bar_callback is bar


def test_progress_bar_knows_its_trainer_from_setup(capsys):
    seen = {}

    class Bar(TQDMProgressBar):
        def on_train_end(self, trainer, module):
            seen["trainer"] = self.trainer
            seen["metrics"] = self.get_metrics(self.trainer, module)
            super().on_train_end(trainer, module)

    bar = Bar()
    with pytest.raises(TypeError, match=r"`Bar.trainer` is not set yet"):
        bar.trainer  # noqa: B018 (the property raises)
    trainer = quiet_trainer(max_epochs=1, enable_progress_bar=True, callbacks=[bar])
    trainer.fit(TinyModule(), loader(32, 16))
    assert seen["trainer"] is trainer and "train_loss" in seen["metrics"]


# ---------------------------------------------------------------------- self.log from a callback


def test_callback_self_log_logs_through_the_running_module():
    class Logs(tandem.Callback):
        def on_train_start(self, trainer, pl_module):
            self.log("at_start", 1.0)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.log("per_batch", float(batch_idx), prog_bar=True)  # a step hook: on_step by default

        def on_train_epoch_end(self, trainer, pl_module):
            self.log_dict({"at_end": 5.0, "also": 6.0})

    trainer = quiet_trainer(max_epochs=1, limit_val_batches=0, callbacks=[Logs()])
    trainer.fit(TinyModule(), loader(32, 16))
    metrics = trainer.callback_metrics
    assert {k: float(v) for k, v in metrics.items() if k != "train_loss"} == {
        "at_start": 1.0,
        "per_batch": 1.0,
        "at_end": 5.0,
        "also": 6.0,
    }
    assert "per_batch" in trainer.progress_bar_metrics


def test_callback_self_log_follows_the_hooks_rules():
    class StepValueAtEpochEnd(tandem.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            self.log("x", 1.0, on_step=True)

    trainer = quiet_trainer(max_epochs=1, callbacks=[StepValueAtEpochEnd()])
    with pytest.raises(LogCallError, match="logs epoch values only"):
        trainer.fit(TinyModule(), loader(32, 16))


def test_callback_self_log_outside_a_run_is_an_error():
    with pytest.raises(LogCallError, match=r"self.log\('x', ...\) outside a run"):
        tandem.Callback().log("x", 1.0)


# ---------------------------------------------------------------------- torchmetrics objects


def test_a_metric_the_module_does_not_own_is_refused():
    torchmetrics = pytest.importorskip("torchmetrics")

    class Loose(TinyModule):
        def training_step(self, batch, batch_idx):
            self.log("acc", torchmetrics.classification.MulticlassAccuracy(num_classes=3))
            return super().training_step(batch, batch_idx)

    with pytest.raises(MisconfigurationException, match="fix this by setting an attribute for the metric in your"):
        quiet_trainer(max_epochs=1, limit_train_batches=1).fit(Loose(), loader(32, 16))


def test_a_metric_beside_the_modules_own_names_them():
    torchmetrics = pytest.importorskip("torchmetrics")

    class Beside(TinyModule):
        def __init__(self):
            super().__init__()
            self.bar = torchmetrics.classification.MulticlassAccuracy(num_classes=3)

        def training_step(self, batch, batch_idx):
            self.log("foo", torchmetrics.classification.MulticlassAccuracy(num_classes=3))
            return super().training_step(batch, batch_idx)

    match = r"`self.log\(foo, ..., metric_attribute=name\)` where `name` is one of \['bar'\]"
    with pytest.raises(MisconfigurationException, match=match):
        quiet_trainer(max_epochs=1, limit_train_batches=1).fit(Beside(), loader(32, 16))


def test_a_metric_named_by_metric_attribute_is_logged():
    torchmetrics = pytest.importorskip("torchmetrics")

    class Named(TinyModule):
        def __init__(self):
            super().__init__()
            self.metrics = [torchmetrics.classification.MulticlassAccuracy(num_classes=3)]  # not a submodule

        def training_step(self, batch, batch_idx):
            x, y = batch
            metric = self.metrics[0]
            metric(self(x), y)
            self.log("acc", metric, metric_attribute="metrics", on_epoch=True)
            return super().training_step(batch, batch_idx)

    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2)
    trainer.fit(Named(), loader(32, 16))
    assert 0.0 <= float(trainer.callback_metrics["acc_epoch"]) <= 1.0


# ---------------------------------------------------------------------- a name logged again at the epoch's end


def test_an_epoch_end_value_takes_over_a_name_the_steps_logged():
    """As Lightning (tests_pytorch/models/test_hooks.py::test_on_train_epoch_end_metrics_collection): the name shows
    the later hook's value, in the progress bar too, and the steps' values stay."""

    class Logs(TinyModule):
        def training_step(self, batch, batch_idx):
            self.log_dict({"step_only": torch.tensor(-1), "shared": 100}, logger=False, prog_bar=True)
            return super().training_step(batch, batch_idx)

        def on_train_epoch_end(self):
            self.log_dict({f"end_{self.current_epoch}": self.current_epoch, "shared": 111}, prog_bar=True)

    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(Logs(), loader(32, 16))
    bar = trainer.progress_bar_metrics
    assert bar["step_only"] == -1 and bar["shared"] == 111 and bar["end_0"] == 0 and bar["end_1"] == 1
    assert float(trainer.callback_metrics["shared"]) == 111


# ---------------------------------------------------------------------- loggers and values


def test_loggers_get_log_metrics_with_keywords():
    """As Lightning: ``logger.log_metrics(metrics=..., step=...)`` (a mocked logger's calls compare equal)."""
    logger = KeywordLogger()

    class Logs(TinyModule):
        def training_step(self, batch, batch_idx):
            self.log("foo", 0.0, on_step=True, on_epoch=True)
            return super().training_step(batch, batch_idx)

    trainer = quiet_trainer(max_epochs=2, logger=logger, log_every_n_steps=1, limit_val_batches=0)
    trainer.fit(Logs(), loader(32, 16))
    assert all(args == () and set(kwargs) == {"metrics", "step"} for args, kwargs in logger.calls)
    rows = [(kw["step"], {k: v for k, v in kw["metrics"].items() if k != "train_loss"}) for _, kw in logger.calls]
    assert rows == [
        (0, {"foo_step": 0.0, "epoch": 0}),
        (1, {"foo_step": 0.0, "epoch": 0}),
        (1, {"foo_epoch": 0.0, "epoch": 0}),
        (2, {"foo_step": 0.0, "epoch": 1}),
        (3, {"foo_step": 0.0, "epoch": 1}),
        (3, {"foo_epoch": 0.0, "epoch": 1}),
    ]


def test_a_one_element_tensor_is_kept_as_a_number():
    """Lightning's test_unsqueezed_tensor_logging, through a run: ``Tensor([1.2])`` is stored 0-d."""

    class Logs(TinyModule):
        def training_step(self, batch, batch_idx):
            self.log("foo", torch.tensor([1.2]), on_epoch=True)
            self.log("bar", torch.tensor([[2.0]]))
            return super().training_step(batch, batch_idx)

    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2)
    trainer.fit(Logs(), loader(32, 16))
    metrics = trainer.callback_metrics
    assert metrics["foo_epoch"].ndim == 0 and metrics["foo_step"].ndim == 0 and metrics["bar"].ndim == 0
    assert float(metrics["foo_epoch"]) == pytest.approx(1.2)
