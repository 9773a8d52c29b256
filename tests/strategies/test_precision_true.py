"""Trainer(precision="bf16-true" / "16-true"): parameters, inputs and tensors created in a step in 16 bits
(Lightning's HalfPrecision), on one device and under dp. Under ddp: ``test_ddp_trainer.py`` (scenario
``true_half``). The fits are small: 16-bit arithmetic on the CPU is several times slower than float32."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem
from helpers import TinyModule, loader, quiet_trainer
from tandem.strategies import DataParallelStrategy, Precision, SingleDeviceStrategy
from tandem.strategies.registry import resolve_strategy

pytestmark = pytest.mark.timeout(60)


class Seen(TinyModule):
    """Records the dtypes a training step sees, and logs the loss per epoch."""

    def __init__(self) -> None:
        super().__init__(lr=0.1)
        self.seen: list[tuple[torch.dtype, torch.dtype, torch.dtype, torch.dtype]] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        created = torch.zeros(1)  # a tensor made in the step takes the default dtype
        self.seen.append((x.dtype, y.dtype, created.dtype, torch.get_default_dtype()))
        loss = F.cross_entropy(self(x), y)
        self.log("epoch_loss", loss, on_step=False, on_epoch=True)
        return loss


def _losses_per_epoch(trainer: tandem.Trainer, module: TinyModule, epochs: int) -> list[float]:
    losses = []

    class Record(tandem.Callback):
        def on_train_epoch_end(self, trainer, module):
            losses.append(float(trainer.callback_metrics["epoch_loss"]))

    trainer.callbacks.append(Record())
    trainer.fit(module, loader(n=64, batch_size=16))
    assert len(losses) == epochs
    return losses


def test_bf16_true_fit_trains_in_bfloat16_and_saves_bfloat16_weights(tmp_path):
    tandem.seed_everything(0)
    trainer = quiet_trainer(max_epochs=6, precision="bf16-true", limit_val_batches=0)
    with trainer.init_module():
        module = Seen()
    assert {p.dtype for p in module.parameters()} == {torch.bfloat16}  # built in bfloat16, not cast later
    assert torch.get_default_dtype() == torch.float32
    losses = _losses_per_epoch(trainer, module, 6)
    assert losses[-1] < losses[0] - 0.1, losses
    assert trainer.precision == "bf16-true"
    assert {p.dtype for p in module.parameters()} == {torch.bfloat16}
    # inputs cast (targets stay integers); tensors created in the step are bfloat16; afterwards float32 again
    assert set(module.seen) == {(torch.bfloat16, torch.int64, torch.bfloat16, torch.bfloat16)}
    assert torch.get_default_dtype() == torch.float32
    assert trainer.callback_metrics["epoch_loss"].dtype == torch.float32  # logged values are summed in float32
    path = tmp_path / "half.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["state_dict"]
    assert {v.dtype for v in saved.values() if v.is_floating_point()} == {torch.bfloat16}


def test_a_module_built_in_float32_is_cast_and_predicts_in_16_bits():
    module = TinyModule()
    trainer = quiet_trainer(max_steps=2, precision="16-true", limit_val_batches=0)
    trainer.fit(module, loader())
    assert {p.dtype for p in module.parameters()} == {torch.float16}
    (prediction, *_) = trainer.predict(module, DataLoader(TensorDataset(torch.randn(4, 8)), batch_size=4))
    assert prediction.dtype == torch.float16


def test_logged_16_bit_values_are_summed_in_float32():
    """bfloat16 stops counting at 256 (256 + 1 == 256): an epoch sum of 300 ones must be 300."""

    class Count(TinyModule):
        def validation_step(self, batch, batch_idx):
            self.log("ones", torch.ones((), dtype=torch.bfloat16), reduce_fx="sum")
            self.log("number", 1.0, reduce_fx="sum")  # a Python number, made while the default dtype is 16-bit

    data = DataLoader(TensorDataset(torch.randn(300, 8), torch.zeros(300, dtype=torch.long)), batch_size=1)
    (metrics,) = quiet_trainer(precision="bf16-true").validate(Count(), data)
    assert metrics == {"ones": 300.0, "number": 300.0}


def test_half_precisions_convert_module_inputs_and_default_dtype():
    for name, dtype in (("bf16-true", torch.bfloat16), ("16-true", torch.float16), ("64-true", torch.float64)):
        precision = Precision(name)
        assert precision.parameter_dtype == dtype and precision.autocast_dtype is None and precision.scaler is None
        module = precision.convert_module(nn.BatchNorm1d(3))
        assert module.weight.dtype == dtype and module.running_mean.dtype == dtype
        assert module.num_batches_tracked.dtype == torch.int64  # integer buffers keep their dtype
        batch = precision.convert_input({"x": torch.ones(2), "ids": torch.arange(2), "meta": "keep"})
        assert (batch["x"].dtype, batch["ids"].dtype, batch["meta"]) == (dtype, torch.int64, "keep")
        for context in (precision.tensor_init_context(), precision.module_init_context(), precision.forward_context()):
            with context:
                assert torch.zeros(1).dtype == dtype
            assert torch.get_default_dtype() == torch.float32
    plain = Precision("32-true")
    assert plain.parameter_dtype is None and not plain.has_forward_context
    assert plain.convert_input(x := torch.ones(1)) is x


def test_the_default_dtype_is_restored_when_replica_threads_leave_in_any_order():
    """dp enters the forward context in one thread per replica; torch's default dtype belongs to the process.
    The first replica enters and leaves first: the second must still see bfloat16, and float32 comes back
    only when both have left (a plain save-and-restore would leave bfloat16 behind)."""
    context = Precision("bf16-true").forward_context()
    entered = [threading.Event(), threading.Event()]
    leave = [threading.Event(), threading.Event()]
    seen = []

    def replica(i):
        with context:
            entered[i].set()
            leave[i].wait(5)
            seen.append(torch.get_default_dtype())

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(2)]
    for i, thread in enumerate(threads):
        thread.start()
        entered[i].wait(5)
    for i, thread in enumerate(threads):
        leave[i].set()
        thread.join()
    assert seen == [torch.bfloat16] * 2 and torch.get_default_dtype() == torch.float32


def test_bf16_true_under_dp_replicas():
    module = Seen()
    strategy = DataParallelStrategy(devices=["cpu"] * 2)
    with pytest.warns(UserWarning, match="on CPU devices"):
        trainer = quiet_trainer(max_steps=2, strategy=strategy, precision="bf16-true", limit_val_batches=0)
    trainer.fit(module, loader())
    assert {p.dtype for p in module.parameters()} == {torch.bfloat16}
    assert {s[0] for s in module.seen} == {torch.bfloat16} and torch.get_default_dtype() == torch.float32


def test_true_half_precision_names_and_the_strategy_instances_own():
    assert Precision("bf16-true").precision == "bf16-true"  # no alias: "bf16" stays bf16-mixed, as in Lightning
    strategy = resolve_strategy(SingleDeviceStrategy("cpu", precision="bf16-true"), "cpu", 1, 1, "32-true")
    assert strategy.precision.parameter_dtype == torch.bfloat16
    with pytest.raises(tandem.utilities.exceptions.TandemConfigError, match="'bf16-true', '16-true'"):
        Precision("bf16-full")


def test_a_precision_plugin_sets_the_trainers_precision():
    module = TinyModule()
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0, plugins=[Precision("bf16-true")])
    trainer.fit(module, loader())
    assert trainer.precision == "bf16-true" and {p.dtype for p in module.parameters()} == {torch.bfloat16}
