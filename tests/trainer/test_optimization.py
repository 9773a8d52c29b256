"""The module's optimization overrides (``optimizer_step``, ``optimizer_zero_grad``,
``configure_gradient_clipping``, ``lr_scheduler_step``) and the shapes ``configure_optimizers`` may return."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import tandem
from helpers import TinyModule, loader, max_abs_diff, quiet_trainer
from tandem.utilities.checkpoint import load_checkpoint_file
from tandem.utilities.exceptions import MisconfigurationException, TandemUserCodeError

pytestmark = pytest.mark.timeout(60)


class WarmUp(TinyModule):
    """Lightning's documented warm-up: the LR starts at 0 and rises inside ``optimizer_step``."""

    def __init__(self, lr: float = 0.1, warmup: int = 4) -> None:
        super().__init__(lr=lr)
        self.warmup = warmup
        self.lrs: list[float] = []

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, step / self.warmup))
        return optimizer

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        optimizer.step(closure=optimizer_closure)
        self.lrs.append(optimizer.param_groups[0]["lr"])
        self.schedule.step()


def test_optimizer_step_override_runs_the_closure_and_its_warm_up_takes_effect():
    torch.manual_seed(0)
    model = WarmUp()
    before = copy.deepcopy(model.state_dict())
    trainer = quiet_trainer(max_steps=6)
    trainer.fit(model, loader(64, 8))
    assert trainer.global_step == 6
    assert model.lrs == pytest.approx([0.0, 0.025, 0.05, 0.075, 0.1, 0.1])
    assert max_abs_diff(model.state_dict(), before) > 1e-3  # it trained (not with LR 0 throughout)

    torch.manual_seed(0)
    reference = WarmUp()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, step / 4))
    for (x, y), _ in zip(loader(64, 8), range(6)):
        F.cross_entropy(reference(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
    assert max_abs_diff(model.state_dict(), reference.state_dict()) == 0.0


def test_optimizer_step_override_with_accumulation_and_lbfgs():
    class Accumulating(WarmUp):
        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
            self.lrs.append(batch_idx)
            optimizer.step(closure=optimizer_closure)

    model = Accumulating()
    trainer = quiet_trainer(max_epochs=1, accumulate_grad_batches=2)
    trainer.fit(model, loader(64, 8))
    assert model.lrs == [1, 3, 5, 7] and trainer.global_step == 4

    class LBFGS(TinyModule):
        closures = 0

        def training_step(self, batch, batch_idx):
            LBFGS.closures += 1
            return super().training_step(batch, batch_idx)

        def configure_optimizers(self):
            return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=3)

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
            optimizer.step(closure=optimizer_closure)

    trainer = quiet_trainer(max_steps=2)
    trainer.fit(LBFGS(), loader(64, 32))
    assert trainer.global_step == 2 and LBFGS.closures > 2  # LBFGS evaluated the closure several times


def test_an_optimizer_step_that_skips_the_closure_is_a_clear_error():
    class Forgetful(TinyModule):
        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
            optimizer.step()

    with pytest.raises(TandemUserCodeError, match=r"optimizer_step did not run the closure.*closure=optimizer_closure"):
        quiet_trainer(max_steps=1).fit(Forgetful(), loader())


def test_optimizer_zero_grad_override_can_keep_gradients():
    class KeepEveryOther(TinyModule):
        calls: list[int] = []

        def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
            self.calls.append(batch_idx)
            if batch_idx % 2:
                optimizer.zero_grad()

    torch.manual_seed(0)
    model = KeepEveryOther()
    reference = copy.deepcopy(model)
    quiet_trainer(max_epochs=1).fit(model, loader(64, 16))
    assert model.calls == [0, 1, 2, 3]
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for i, (x, y) in enumerate(loader(64, 16)):
        F.cross_entropy(reference(x), y).backward()
        optimizer.step()
        if i % 2:
            optimizer.zero_grad()
    assert max_abs_diff(model.state_dict(), reference.state_dict()) == 0.0


def test_configure_gradient_clipping_override_gets_the_trainer_settings():
    seen = []

    class OwnClipping(TinyModule):
        def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            seen.append((gradient_clip_val, gradient_clip_algorithm))
            self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val / 10, gradient_clip_algorithm="value")

    with pytest.raises(
        Exception, match=r"gradient_clip_val=0.5\) and clip_gradients\(gradient_clip_val=0.05\) disagree"
    ):
        quiet_trainer(max_steps=1, gradient_clip_val=0.5).fit(OwnClipping(lr=10.0), loader())

    grads = []

    class Clipped(TinyModule):
        def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            seen.append((gradient_clip_val, gradient_clip_algorithm))
            self.clip_gradients(optimizer, gradient_clip_val=0.001, gradient_clip_algorithm="value")
            grads.append(max(p.grad.abs().max().item() for p in self.parameters()))

    quiet_trainer(max_steps=2).fit(Clipped(lr=10.0), loader())
    assert seen[-2:] == [(None, None), (None, None)] and max(grads) <= 0.001 + 1e-7


def test_configure_optimizers_dict_with_a_top_level_monitor_steps_the_plateau_scheduler():
    class Plateau(TinyModule):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", patience=0, factor=0.5)
            return {"optimizer": optimizer, "lr_scheduler": scheduler, "monitor": "val_loss"}

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", 5.0 - self.current_epoch)  # falls every epoch: mode="max" sees no improvement

    trainer = quiet_trainer(max_epochs=3)
    trainer.fit(Plateau(), loader(32, 16), loader(32, 16))
    assert trainer.lr_scheduler_configs[0].monitor == "val_loss"
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.25)  # epochs 2 and 3 halve it


def test_lr_scheduler_step_override_and_epoch_frequency():
    steps = []

    class Custom(TinyModule):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 2},
            }

        def lr_scheduler_step(self, scheduler, metric):
            steps.append((self.trainer.global_step, metric))
            scheduler.step()

    quiet_trainer(max_steps=6).fit(Custom(), loader(64, 8))
    assert steps == [(2, None), (4, None), (6, None)]


class StepsByHand(TinyModule):
    """Steps ``self.optimizers()`` itself in ``training_step`` under automatic optimization."""

    def __init__(self, return_loss: bool) -> None:
        super().__init__()
        self.return_loss = return_loss

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        loss = F.cross_entropy(self(batch[0]), batch[1])
        loss.backward()
        opt.step()
        return loss if self.return_loss else None


def test_stepping_by_hand_and_returning_the_loss_is_a_double_step_error():
    with pytest.raises(
        TandemUserCodeError,
        match=r"stepped an optimizer itself.*also returned a loss.*two steps.*"
        r"automatic_optimization = False.*manual_backward.*return None",
    ):
        quiet_trainer(max_steps=2).fit(StepsByHand(return_loss=True), loader())


def test_stepping_by_hand_and_returning_none_counts_each_step(tmp_path):
    torch.manual_seed(0)
    model = StepsByHand(return_loss=False)
    reference = copy.deepcopy(model)
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=3, enable_checkpointing=True, default_root_dir=tmp_path)
    trainer.fit(model, loader())
    assert trainer.global_step == 3  # one per optimizer step (Lightning leaves it at 0 here)
    (saved,) = (tmp_path / "checkpoints").glob("*.ckpt")
    assert load_checkpoint_file(saved)["loops"]["global_step"] == 3
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)  # the same steps, by hand
    for x, y in list(loader())[:3]:
        optimizer.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        optimizer.step()
    assert max_abs_diff(model.state_dict(), reference.state_dict()) < 1e-6  # stepped once per batch, not twice
    trainer = quiet_trainer(max_steps=2)
    trainer.fit(StepsByHand(return_loss=False), loader())
    assert trainer.global_step == 2  # max_steps sees them


def test_stepping_by_hand_where_the_trainer_steps_or_accumulates_is_an_error():
    with pytest.raises(
        TandemUserCodeError, match=r"on an accumulation micro-batch \(Trainer\(accumulate_grad_batches=2"
    ):
        quiet_trainer(max_steps=2, accumulate_grad_batches=2).fit(StepsByHand(return_loss=False), loader())

    class StepsInAHook(TinyModule):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.optimizers().step()

    with pytest.raises(TandemUserCodeError, match=r"optimizer.step\(\) was called in on_train_batch_end under auto"):
        quiet_trainer(max_steps=2).fit(StepsInAHook(), loader())


def test_an_epoch_that_returns_none_for_every_batch_warns_once_and_trains_nothing():
    class SkipsAll(TinyModule):
        def training_step(self, batch, batch_idx):
            return None

    model = SkipsAll()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=2)
    with pytest.warns(UserWarning, match=r"`training_step` returned `None`") as got:
        trainer.fit(model, loader())
    assert len([w for w in got if "returned `None`" in str(w.message)]) == 1
    assert trainer.global_step == 4  # Lightning's count: each batch's step is taken
    assert max_abs_diff(model.state_dict(), before) == 0.0


class _EpochEndRecorder(tandem.Callback):
    """The learning rate each on_train_epoch_end sees; optionally a checkpoint saved there at epoch ``save_at``."""

    def __init__(self, save_at: int | None = None, path=None):
        self.lrs: list[float] = []
        self.save_at, self.path = save_at, path

    def on_train_epoch_end(self, trainer, module):
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])
        if trainer.current_epoch == self.save_at:
            trainer.save_checkpoint(self.path)


class _Plateau(TinyModule):
    """A StepLR and a ReduceLROnPlateau on val_loss that cuts the rate at each epoch (patience 0, threshold huge)."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        step = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.8, patience=0, threshold=10.0)
        return [opt], [step, {"scheduler": plateau, "monitor": "val_loss"}]


class _PlateauOnly(TinyModule):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.8, patience=0, threshold=10.0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}


def test_epoch_schedulers_step_at_lightnings_moments():
    """Lightning's order: an epoch scheduler steps at the epoch's last batch, before the epoch-end validation and
    on_train_epoch_end; a ReduceLROnPlateau steps after on_train_epoch_end (it reads the epoch's values)."""
    recorder = _EpochEndRecorder()
    trainer = quiet_trainer(max_epochs=3, callbacks=[recorder], limit_val_batches=0)
    trainer.fit(TinyModule(lr=0.1, scheduler=True), loader())
    assert recorder.lrs == pytest.approx([0.05, 0.025, 0.0125])
    recorder = _EpochEndRecorder()
    quiet_trainer(max_epochs=3, callbacks=[recorder]).fit(_PlateauOnly(lr=0.1), loader(), loader(32))
    assert recorder.lrs == pytest.approx([0.1, 0.08, 0.064])


def test_a_checkpoint_saved_in_on_train_epoch_end_resumes_exactly_with_the_pending_scheduler_step(tmp_path):
    """Saved before the epoch's schedulers stepped, the checkpoint records that step (and the plateau monitor's
    value); the resume takes it, so rates and weights equal the uninterrupted run's."""
    torch.manual_seed(0)
    whole = _Plateau(lr=0.1)
    saver = _EpochEndRecorder(save_at=1, path=tmp_path / "end1.ckpt")
    trainer = quiet_trainer(max_epochs=4, callbacks=[saver])
    trainer.fit(whole, loader(), loader(32))
    torch.manual_seed(1)
    resumed = _Plateau(lr=0.1)
    after = _EpochEndRecorder()
    again = quiet_trainer(max_epochs=4, callbacks=[after])
    again.fit(resumed, loader(), loader(32), ckpt_path=tmp_path / "end1.ckpt")
    assert after.lrs == saver.lrs[2:]
    assert again.optimizers[0].param_groups[0]["lr"] == trainer.optimizers[0].param_groups[0]["lr"]
    assert max_abs_diff(resumed.state_dict(), whole.state_dict()) == 0.0


def test_a_plateau_scheduler_stepped_per_step_steps_after_the_epochs_validation_as_lightning(tmp_path):
    """Lightning steps a per-step ReduceLROnPlateau after the validation that follows the batch, the epoch's last
    batch included: a checkpoint saved in the epoch-end validation records 3 plateau steps of 4 batches (tandem
    stepped it before that validation: 4), and the scheduler sees that validation's value."""
    from tandem.callbacks import ModelCheckpoint

    seen = {}

    class Plateau(TinyModule):
        def training_step(self, batch, batch_idx):
            self.log("foo", float(batch_idx))
            return super().training_step(batch, batch_idx)

        def configure_optimizers(self):
            sgd = torch.optim.SGD(self.parameters(), lr=0.1)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(sgd)
            step = torch.optim.lr_scheduler.StepLR(sgd, step_size=1)
            return [sgd], [
                {"scheduler": plateau, "interval": "step", "monitor": "foo"},
                {"scheduler": step, "interval": "step"},
            ]

        def on_save_checkpoint(self, checkpoint):
            seen["plateau"] = checkpoint["lr_schedulers"][0]["last_epoch"]
            seen["step"] = checkpoint["lr_schedulers"][1]["_step_count"] - 1

    callback = ModelCheckpoint(dirpath=tmp_path, save_on_train_epoch_end=False)
    trainer = quiet_trainer(max_epochs=1, limit_val_batches=1, callbacks=[callback], enable_checkpointing=True)
    trainer.fit(Plateau(), loader(), loader())
    assert seen == {
        "plateau": 3,
        "step": 4,
    }  # Lightning 2.6.6's test_plateau_scheduler_lr_step_interval_updated_after_saving
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 4  # and it stepped after the validation


def test_a_module_can_be_attached_to_a_trainer_by_hand_as_in_lightning():
    inner, outer = TinyModule(), TinyModule()
    outer.inner = inner
    trainer = quiet_trainer()
    outer.trainer = trainer
    assert outer.trainer is trainer and inner.trainer is trainer


def test_a_non_strict_plateau_without_its_metric_skips_with_lightnings_runtime_warning():
    class Loose(TinyModule):
        def configure_optimizers(self):
            sgd = torch.optim.SGD(self.parameters(), lr=0.1)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(sgd)
            return {"optimizer": sgd, "lr_scheduler": {"scheduler": plateau, "monitor": "giraffe", "strict": False}}

    trainer = quiet_trainer(max_epochs=1)
    with pytest.warns(RuntimeWarning, match=r"conditioned on metric giraffe which is not available but strict is set"):
        trainer.fit(Loose(), loader())
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 0  # skipped


def test_a_strict_plateau_without_its_metric_raises_lightnings_type():
    class Strict(TinyModule):
        def configure_optimizers(self):
            sgd = torch.optim.SGD(self.parameters(), lr=0.1)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(sgd)
            return {"optimizer": sgd, "lr_scheduler": {"scheduler": plateau, "monitor": "giraffe"}}

    # Lightning raises a MisconfigurationException there: a ported `except` clause catches tandem's error too
    with pytest.raises(MisconfigurationException, match="giraffe"):
        quiet_trainer(max_epochs=1).fit(Strict(), loader())


class OwnBackward(TinyModule):
    """Lightning's ``backward`` hook, overridden: the Trainer's backward and manual_backward run through it."""

    def __init__(self, manual: bool = False) -> None:
        super().__init__()
        self.automatic_optimization = not manual
        self.backwards: list[float] = []

    def backward(self, loss, *args, **kwargs):
        self.backwards.append(float(loss.detach()))
        loss.backward(*args, **kwargs)

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()


@pytest.mark.parametrize("manual", [False, True])
def test_an_overridden_backward_hook_runs_each_backward_as_in_lightning(manual):
    model = OwnBackward(manual)
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=3)
    trainer.fit(model, loader())
    assert len(model.backwards) == 3 and trainer.global_step == 3
    assert all(math.isfinite(v) for v in model.backwards)


def test_a_backward_hook_that_raises_stops_the_fit():
    class Troubled(TinyModule):
        def backward(self, loss, *args, **kwargs):
            raise RuntimeError("trouble in backward")

    with pytest.raises(RuntimeError, match="trouble in backward"):
        quiet_trainer(max_epochs=1, limit_train_batches=2).fit(Troubled(), loader())
