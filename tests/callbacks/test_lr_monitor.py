import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from callbacks._fake import RecordingLogger, fake_trainer
from tandem.callbacks import LearningRateMonitor
from tandem.utilities.exceptions import TandemConfigError


def _params(n=1):
    return [torch.nn.Parameter(torch.zeros(1)) for _ in range(n)]


def _trainer(optimizers, schedulers=(), rank=0, **attrs):
    logger = RecordingLogger()
    trainer = fake_trainer(
        ".",
        rank=rank,
        loggers=[logger],
        optimizers=list(optimizers),
        lr_scheduler_configs=list(schedulers),
        **attrs,
    )
    return trainer, logger


def _scheduler(optimizer, interval, name=None):
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    return SimpleNamespace(scheduler=scheduler, interval=interval, frequency=1, monitor=None, name=name)


def _start(callback, trainer):
    callback.setup(trainer, None, "fit")
    callback.on_train_start(trainer, None)


def test_keys_follow_lightnings_names():
    sgd = torch.optim.SGD(_params(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    adam = torch.optim.Adam([{"params": _params()}, {"params": _params(), "lr": 0.01}], lr=0.001)
    named = torch.optim.SGD([{"params": _params(), "name": "head"}, {"params": _params()}], lr=0.5)
    trainer, logger = _trainer([sgd, adam, named])
    callback = LearningRateMonitor(logging_interval="epoch", log_momentum=True, log_weight_decay=True)
    _start(callback, trainer)
    callback.on_train_epoch_start(trainer, None)

    ((logged, step),) = logger.calls
    assert step == 0
    assert logged == pytest.approx(
        {
            "lr-SGD": 0.1,
            "lr-SGD-momentum": 0.9,
            "lr-SGD-weight_decay": 1e-4,
            "lr-Adam/pg1": 0.001,
            "lr-Adam/pg1-momentum": 0.9,
            "lr-Adam/pg1-weight_decay": 0.0,
            "lr-Adam/pg2": 0.01,
            "lr-Adam/pg2-momentum": 0.9,
            "lr-Adam/pg2-weight_decay": 0.0,
            "lr-SGD-1/head": 0.5,
            "lr-SGD-1/head-momentum": 0.0,
            "lr-SGD-1/head-weight_decay": 0.0,
            "lr-SGD-1/pg2": 0.5,
            "lr-SGD-1/pg2-momentum": 0.0,
            "lr-SGD-1/pg2-weight_decay": 0.0,
        }
    )


def test_step_interval_logs_every_log_every_n_steps_once_per_step():
    optimizer = torch.optim.SGD(_params(), lr=0.1)
    trainer, logger = _trainer([optimizer], log_every_n_steps=2)
    callback = LearningRateMonitor(logging_interval="step")
    _start(callback, trainer)
    callback.on_train_epoch_start(trainer, None)
    for batch_idx, step in enumerate([0, 0, 1, 1, 2, 2, 3, 3, 4]):  # two micro-batches per step
        trainer.global_step = step
        optimizer.param_groups[0]["lr"] = 0.1 * (step + 1)
        trainer.is_log_step = batch_idx in (3, 7)  # the loop's plan: steps 2 and 4 publish (batches 3 and 7)
        callback.on_train_batch_start(trainer, None, None, batch_idx)
        callback.on_train_batch_end(trainer, None, None, None, batch_idx)
    # as Lightning: at the start of each publishing batch (3 and 7), the rate that batch trains with
    assert [(step, round(m["lr-SGD"], 6)) for m, step in logger.calls] == [(1, 0.2), (3, 0.4)]


def test_epoch_interval_logs_at_epoch_start_only():
    trainer, logger = _trainer([torch.optim.SGD(_params(), lr=0.1)], log_every_n_steps=1)
    callback = LearningRateMonitor(logging_interval="epoch")
    _start(callback, trainer)
    for epoch in range(2):
        trainer.global_step = epoch * 5
        callback.on_train_epoch_start(trainer, None)
        callback.on_train_batch_start(trainer, None, None, 0)
    assert [step for _, step in logger.calls] == [0, 5]


def test_default_interval_follows_each_scheduler():
    stepped = torch.optim.SGD(_params(), lr=0.1)
    epoched = torch.optim.Adam(_params(), lr=0.2)
    plain = torch.optim.RMSprop(_params(), lr=0.3)
    schedulers = [_scheduler(stepped, "step"), _scheduler(epoched, "epoch")]
    trainer, logger = _trainer([stepped, epoched, plain], schedulers, log_every_n_steps=1)
    callback = LearningRateMonitor()
    _start(callback, trainer)
    callback.on_train_epoch_start(trainer, None)
    trainer.is_log_step = True
    callback.on_train_batch_start(trainer, None, None, 0)
    (at_epoch, _), (at_step, _) = logger.calls
    # as Lightning: an optimizer without a scheduler logs at both moments
    assert set(at_epoch) == {"lr-Adam", "lr-RMSprop"}
    assert set(at_step) == {"lr-SGD", "lr-RMSprop"}


def test_names_follow_lightnings_order_scheduler_names_and_single_named_groups():
    """Optimizers with a scheduler are named first (the second SGD below is lr-SGD-1 although it comes first), a
    scheduler's name replaces lr-{Class}, a lone group with a name gets /{name}; duplicate group names are refused."""
    unscheduled = torch.optim.SGD([{"params": _params(), "name": "bias"}], lr=0.3)
    scheduled = torch.optim.SGD(_params(), lr=0.1)
    adam = torch.optim.Adam(_params(), lr=0.01)
    schedulers = [_scheduler(scheduled, "epoch"), _scheduler(adam, "epoch", name="head_rate")]
    trainer, logger = _trainer([unscheduled, scheduled, adam], schedulers)
    callback = LearningRateMonitor(logging_interval="epoch")
    _start(callback, trainer)
    callback.on_train_epoch_start(trainer, None)
    ((logged, _),) = logger.calls
    assert logged == {"lr-SGD": 0.1, "head_rate": 0.01, "lr-SGD-1/bias": 0.3}

    twins = torch.optim.SGD([{"params": _params(), "name": "x"}, {"params": _params(), "name": "x"}], lr=0.1)
    trainer, _ = _trainer([twins])
    with pytest.raises(TandemConfigError, match=r"lr-SGD has parameter groups with the same name \['x'\]"):
        _start(LearningRateMonitor(), trainer)


def test_values_reach_callback_metrics_as_tensors_on_every_rank():
    """Issue 29, item 5: as Lightning, every value logged is also in trainer.callback_metrics, a tensor on the
    strategy's device, on every rank (rank 1 sends nothing to the loggers), at the moments it is logged."""
    for rank in (0, 1):
        sgd = torch.optim.SGD(_params(), lr=0.1, momentum=0.9)
        adamw = torch.optim.AdamW([{"params": _params()}, {"params": _params(), "lr": 0.01}], lr=0.001)
        trainer, logger = _trainer([sgd, adamw], rank=rank)
        callback = LearningRateMonitor(logging_interval="step", log_momentum=True)
        _start(callback, trainer)
        callback.on_train_epoch_start(trainer, None)
        callback.on_train_batch_start(trainer, None, None, 0)
        assert trainer.callback_metrics == {}  # "step": neither at the epoch's start nor on a batch that does not log
        trainer.is_log_step = True
        sgd.param_groups[0]["lr"] = 0.05
        callback.on_train_batch_start(trainer, None, None, 1)
        metrics = trainer.callback_metrics
        assert set(metrics) == {
            "lr-SGD",
            "lr-SGD-momentum",
            "lr-AdamW/pg1",
            "lr-AdamW/pg1-momentum",
            "lr-AdamW/pg2",
            "lr-AdamW/pg2-momentum",
        }
        assert all(isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.ndim == 0 for v in metrics.values())
        assert metrics["lr-SGD"] == torch.tensor(0.05) and metrics["lr-AdamW/pg2"] == torch.tensor(0.01)
        assert len(logger.calls) == (1 if rank == 0 else 0)


def test_callback_metrics_of_a_fit_are_lightnings_batch_by_batch(tmp_path, monkeypatch):
    """A real fit (scripts/lr_monitor_parity.py: four optimizers under manual optimization, a per-step scheduler and
    a named per-epoch one, a lone named group; logging_interval None, "step" with momentum, "epoch" with weight
    decay): trainer.callback_metrics after every batch, names, values and dtypes, as under Lightning. Lightning's,
    in scripts/lr_monitor_lightning.json, were written by
        /tmp/lvenv/bin/python tests/callbacks/scripts/lr_monitor_parity.py --lightning > tests/callbacks/scripts/lr_monitor_lightning.json
    (Lightning 2.6.6, torch 2.13, CPU). Before the fix tandem's callback_metrics held none of them."""
    monkeypatch.chdir(tmp_path)
    scripts = Path(__file__).parent / "scripts"
    spec = importlib.util.spec_from_file_location("lr_monitor_parity", scripts / "lr_monitor_parity.py")
    parity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(parity)
    lightning = json.loads((scripts / "lr_monitor_lightning.json").read_text())
    assert [name for name, _, _ in lightning["none"][-1]] == [
        "head_rate",
        "lr-AdamW/pg1",
        "lr-AdamW/pg2",
        "lr-SGD",
        "lr-SGD-1/bias",
    ]
    assert parity.run() == lightning


def test_every_logger_gets_the_values_on_rank_zero_only():
    second = RecordingLogger()
    trainer, first = _trainer([torch.optim.SGD(_params(), lr=0.1)])
    trainer.loggers.append(second)
    callback = LearningRateMonitor(logging_interval="epoch")
    _start(callback, trainer)
    callback.on_train_epoch_start(trainer, None)
    assert first.calls == second.calls == [({"lr-SGD": 0.1}, 0)]

    trainer1, logger1 = _trainer([torch.optim.SGD(_params(), lr=0.1)], rank=1)
    _start(callback, trainer1)
    callback.on_train_epoch_start(trainer1, None)
    assert logger1.calls == []


def test_no_logger_is_a_clear_error_at_setup():
    trainer = fake_trainer(".")
    with pytest.raises(TandemConfigError, match=r"LearningRateMonitor: .*has none\. Enable a logger"):
        LearningRateMonitor().setup(trainer, None, "fit")
    LearningRateMonitor().setup(trainer, None, "test")  # nothing is logged outside fit


def test_bad_interval_is_rejected_at_construction():
    with pytest.raises(TandemConfigError, match="logging_interval='batch' is not valid; expected one of"):
        LearningRateMonitor(logging_interval="batch")
