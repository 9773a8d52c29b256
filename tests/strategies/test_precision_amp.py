"""Mixed precision and gradient clipping: bf16 accuracy, float16 loss scaling (skipped steps, unscale before
clipping, checkpoints), and clipping by norm and by value on a single device and under dp.

float16 loss scaling runs on CPU too (``torch.amp.GradScaler("cpu")``); the same tests run on CUDA when
a GPU is present.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem
from helpers import TinyModule, float16_mixed, loader, max_abs_diff, quiet_trainer
from tandem.strategies import DataParallelStrategy, SingleDeviceStrategy
from tandem.utilities.exceptions import TandemUserCodeError

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


# ====================================================================== bf16-mixed on the digits data
class DigitsMLP(tandem.TrainingModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def digits_accuracy(precision: str) -> float:
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32) / 16.0
    y = torch.tensor(labels)
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=g)
    train, test = order[:1400], order[1400:]
    tandem.seed_everything(0)
    module = DigitsMLP()
    trainer = quiet_trainer(precision=precision, max_epochs=4)
    trainer.fit(module, DataLoader(TensorDataset(x[train], y[train]), batch_size=64, shuffle=True))
    return trainer.test(module, DataLoader(TensorDataset(x[test], y[test]), batch_size=256))[0]["test_acc"]


def test_bf16_mixed_trains_digits_to_the_accuracy_of_32_true():
    """The band: bf16-mixed within 3 points of 32-true, both above 90%, after 4 epochs."""
    full, bf16 = digits_accuracy("32-true"), digits_accuracy("bf16-mixed")
    assert full > 0.9 and bf16 > 0.9
    assert abs(full - bf16) <= 0.03, (full, bf16)


# ====================================================================== 16-mixed: skipped steps
class InfAt(TinyModule):
    """Makes one gradient inf on the given training batch; records what the optimizer and scheduler saw."""

    def __init__(self, inf_batch: int = -1):
        super().__init__()
        self.inf_batch = inf_batch
        self.batch = -1
        self.before_step_weights = []
        self.after_step_weights = []

    def training_step(self, batch, batch_idx):
        self.batch = batch_idx
        self.before_step_weights.append(self.net[0].weight.detach().clone())
        return super().training_step(batch, batch_idx)

    def on_after_backward(self):
        if self.batch == self.inf_batch:
            self.net[0].weight.grad[0, 0] = math.inf

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.after_step_weights.append(self.net[0].weight.detach().clone())

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


@pytest.mark.parametrize("accelerator", DEVICES)
def test_16_mixed_skips_a_step_with_inf_gradients_and_does_not_step_the_scheduler(accelerator):
    module = InfAt(inf_batch=1)
    trainer = quiet_trainer(**float16_mixed(accelerator), max_steps=3)
    trainer.fit(module, loader(48, batch_size=16))
    scaler = trainer.strategy.precision.scaler
    assert scaler is not None and scaler.get_scale() == 2.0**15  # halved once, from 2**16
    # The skipped step left the weights alone; the others moved them.
    assert torch.equal(module.after_step_weights[1], module.before_step_weights[1])
    assert not torch.equal(module.after_step_weights[0], module.before_step_weights[0])
    assert not torch.equal(module.after_step_weights[2], module.before_step_weights[2])
    # global_step counts every optimizer step attempted, skipped ones included (as in Lightning) ...
    assert trainer.global_step == 3
    # ... but a step-interval scheduler steps only for steps that were taken.
    (config,) = trainer.lr_scheduler_configs
    assert config.scheduler.last_epoch == 2
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)


def test_precision_optimizer_step_reports_the_skip():
    from tandem.strategies.precision import Precision

    precision = Precision("16-mixed")
    layer = nn.Linear(2, 1)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    for grad, expected in ((1.0, True), (math.inf, False), (math.nan, False), (1.0, True)):
        with precision.forward_context():
            loss = layer(torch.ones(1, 2)).float().sum()
        precision.backward(loss)
        for param in layer.parameters():  # the scaled grads themselves may overflow float16: set them all
            param.grad.fill_(grad)
        precision.unscale_gradients(opt)
        assert precision.optimizer_step(opt) is expected
        opt.zero_grad()


# ====================================================================== clipping sees unscaled gradients
class RecordingSGD(torch.optim.SGD):
    """Records the gradients' total norm and largest magnitude when it steps (after clipping)."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.norms, self.maxima = [], []

    @torch.no_grad()
    def step(self, closure=None):
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        self.norms.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item())
        self.maxima.append(max(g.abs().max().item() for g in grads))
        return super().step(closure)


class ClipProbe(TinyModule):
    def __init__(self):
        super().__init__()
        self.norms_before_clip = []

    def on_before_optimizer_step(self, optimizer):  # after unscaling, before clipping
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        self.norms_before_clip.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())

    def configure_optimizers(self):
        return RecordingSGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("accelerator", DEVICES)
@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-mixed"])
def test_clip_by_norm_and_value_after_unscaling(accelerator, precision):
    for algorithm, limit in (("norm", 0.05), ("value", 0.002)):
        torch.manual_seed(0)
        module = ClipProbe()
        setting = (
            float16_mixed(accelerator)
            if precision == "16-mixed"
            else dict(accelerator=accelerator, precision=precision)
        )
        trainer = quiet_trainer(
            **setting,
            max_steps=3,
            gradient_clip_val=limit,
            gradient_clip_algorithm=algorithm,
        )
        trainer.fit(module, loader(48, batch_size=16))
        opt = trainer.optimizers[0]
        # Hooks saw true gradients (a scaled norm would be ~65536 times larger) ...
        assert all(0.05 < n < 20 for n in module.norms_before_clip), module.norms_before_clip
        # ... and the step saw them clipped to the limit, not to limit / scale.
        if algorithm == "norm":
            assert all(n == pytest.approx(limit, rel=1e-3) for n in opt.norms), opt.norms
        else:
            assert all(m == pytest.approx(limit, rel=1e-6) for m in opt.maxima), opt.maxima


@pytest.mark.filterwarnings("ignore:DataParallelStrategy on CPU devices")
@pytest.mark.parametrize(("algorithm", "limit"), [("norm", 0.05), ("value", 0.002)])
def test_clipping_under_dp_matches_single_device(algorithm, limit):
    def params(strategy):
        torch.manual_seed(0)
        module = TinyModule()
        trainer = quiet_trainer(
            strategy=strategy, max_steps=4, gradient_clip_val=limit, gradient_clip_algorithm=algorithm
        )
        trainer.fit(module, loader(64, batch_size=10))  # 10 on 4 devices: 3, 3, 2, 2
        return module.state_dict()

    single, dp = params(SingleDeviceStrategy("cpu")), params(DataParallelStrategy(devices=["cpu"] * 4))
    for k in single:
        torch.testing.assert_close(dp[k], single[k], atol=1e-6, rtol=0)


# ====================================================================== the scaler in checkpoints
class ScalerProbe(tandem.Callback):
    def __init__(self):
        self.at_fit_start = None

    def on_fit_start(self, trainer, module):
        self.at_fit_start = trainer.strategy.precision.state_dict()["scaler"]


@pytest.mark.parametrize("accelerator", DEVICES)
def test_16_mixed_checkpoint_round_trip_restores_the_scaler(accelerator, tmp_path):
    trainer = quiet_trainer(**float16_mixed(accelerator), max_steps=3)
    trainer.fit(InfAt(inf_batch=0), loader(48, batch_size=16))
    saved = trainer.strategy.precision.state_dict()["scaler"]
    assert saved["scale"] == 2.0**15 and saved["_growth_tracker"] == 2
    trainer.save_checkpoint(tmp_path / "amp.ckpt")

    probe = ScalerProbe()
    resumed = quiet_trainer(**float16_mixed(accelerator), max_steps=4, callbacks=[probe])
    assert resumed.strategy.precision.state_dict()["scaler"]["scale"] == 2.0**16  # a fresh scaler
    resumed.fit(InfAt(), loader(48, batch_size=16), ckpt_path=tmp_path / "amp.ckpt")
    assert probe.at_fit_start == saved
    assert resumed.strategy.precision.state_dict()["scaler"]["_growth_tracker"] == 3  # went on from there


def test_a_fused_optimizer_skips_on_the_device_and_its_step_counts_as_taken():
    """An optimizer that unscales in its own step decides on the device; the host does not wait to find out."""
    from tandem.strategies.precision import Precision

    precision = Precision("16-mixed")
    layer = nn.Linear(2, 1)
    opt = torch.optim.Adam(layer.parameters(), lr=0.1, fused=True)
    for grad, moves in ((1.0, True), (math.inf, False), (1.0, True)):
        with precision.forward_context():
            loss = layer(torch.ones(1, 2)).float().sum()
        precision.backward(loss)
        for param in layer.parameters():
            param.grad.fill_(grad)
        before = layer.weight.detach().clone()
        precision.unscale_gradients(opt)
        assert precision.optimizer_step(opt) is True
        assert torch.equal(before, layer.weight) is not moves
        opt.zero_grad()
    assert precision.scaler.get_scale() == 2.0**15


def test_a_float16_precision_pickles_after_steps():
    """ddp_spawn sends the strategy, its precision included, to its processes."""
    import pickle

    from tandem.strategies.precision import Precision

    precision = Precision("16-mixed")
    layer = nn.Linear(2, 1)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    precision.backward(layer(torch.ones(1, 2)).sum())
    precision.unscale_gradients(opt)
    precision.optimizer_step(opt)
    assert pickle.loads(pickle.dumps(precision)).scaler.get_scale() == 2.0**16


# ====================================================================== manual optimization under float16: the recipe
INF_BATCH = 3


class TwoSteps(tandem.TrainingModule):
    """Two optimizers over the same weights, each with its own loss: manual_backward and step, one after the
    other in one training_step (the second forward must see the weights the first step left). The first loss of
    batch INF_BATCH is inf under float16."""

    def __init__(self, precision: str):
        super().__init__()
        self.automatic_optimization = False
        self.precision_name = precision
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 3)

    def loss(self, x, y, which, batch_idx):
        loss = F.cross_entropy(self.b(torch.relu(self.a(x))).float(), y) * (1.0 if which == 0 else 0.5)
        if which == 0 and batch_idx == INF_BATCH and self.precision_name == "16-mixed":
            loss = loss * math.inf
        return loss

    def training_step(self, batch, batch_idx):
        x, y = batch
        for which, opt in enumerate(self.optimizers()):
            opt.zero_grad()
            self.manual_backward(self.loss(x, y, which, batch_idx))
            opt.step()

    def configure_optimizers(self):
        return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)]


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_manual_optimization_under_mixed_precision_is_the_hand_written_recipe_bitwise(precision):
    """Lightning's MixedPrecision.optimizer_step per opt.step(): the hand loop below, autocast around each forward
    and, for float16, scale / step / update per step. tandem once kept autocast's cast cache over the whole
    training_step, so the second forward ran on the weights of before the first step (7e-3 off after 8 batches
    here, 3.9e-3 on an H200)."""
    dtype = torch.float16 if precision == "16-mixed" else torch.bfloat16
    torch.manual_seed(0)
    module = TwoSteps(precision)
    strategy = SingleDeviceStrategy("cpu", precision=precision)
    trainer = quiet_trainer(strategy=strategy, max_epochs=1)
    trainer.fit(module, loader(128, batch_size=16))

    torch.manual_seed(0)
    hand = TwoSteps(precision)
    opts = hand.configure_optimizers()
    scaler = torch.amp.GradScaler("cpu") if precision == "16-mixed" else None
    for batch_idx, (x, y) in enumerate(loader(128, batch_size=16)):
        for which, opt in enumerate(opts):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=dtype):
                loss = hand.loss(x, y, which, batch_idx)
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()

    assert trainer.global_step == 16
    if scaler is not None:
        assert scaler.get_scale() == trainer.strategy.precision.scaler.get_scale() == 2.0**15  # one skipped step
    ours, theirs = module.state_dict(), hand.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), max_abs_diff(ours, theirs)


# ====================================================================== float16: a backward that skips the scaler
class OwnBackward(TinyModule):
    """Calls loss.backward() itself (from batch ``from_batch`` on; self.manual_backward before)."""

    def __init__(self, automatic: bool, from_batch: int = 0):
        super().__init__()
        self.automatic_optimization = automatic
        self.from_batch = from_batch

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        opt.zero_grad()
        loss = F.cross_entropy(self(x), y)
        if batch_idx >= self.from_batch:
            loss.backward()
        else:
            self.manual_backward(loss)
        opt.step()
        return None


@pytest.mark.parametrize(
    ("automatic", "from_batch"), [(False, 0), (False, 2), (True, 0)], ids=["manual", "manual-later", "automatic"]
)
def test_a_backward_of_the_users_own_under_float16_names_manual_backward(automatic, from_batch):
    """torch said "Attempted unscale_ but _scale is None" at the first step; after a manual_backward the unscaling
    silently divided unscaled gradients by the scale."""
    trainer = quiet_trainer(**float16_mixed(), max_steps=4, limit_val_batches=0)
    with pytest.raises(TandemUserCodeError, match=r"self\.manual_backward\(loss\)") as info:
        trainer.fit(OwnBackward(automatic, from_batch), loader(64))
    assert "instead of loss.backward()" in str(info.value)
    assert trainer.global_step == from_batch


def test_an_optimizer_step_override_whose_step_returned_none_skips_under_float16_as_in_fp32():
    """Lightning's rule: a closure that ran no backward (training_step returned None) is neither unscaled nor
    stepped by the scaler; the batch counts as in full precision (before: an unscale error)."""

    class Skips(TinyModule):
        def training_step(self, batch, batch_idx):
            return None if batch_idx % 2 else super().training_step(batch, batch_idx)

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
            optimizer.step(closure=optimizer_closure)

    steps = {}
    for name, kwargs in (("32-true", {}), ("16-mixed", float16_mixed())):
        trainer = quiet_trainer(max_epochs=1, limit_val_batches=0, **kwargs)
        trainer.fit(Skips(), loader())
        steps[name] = trainer.global_step
    assert steps == {"32-true": 4, "16-mixed": 4}
