"""Manual optimization (``self.automatic_optimization = False``) and several optimizers, on one process and
under DDP (the shared launch of ``conftest.py``)."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tandem
from helpers import TinyModule, float16_mixed, loader, max_abs_diff, quiet_trainer
from tandem.callbacks import ModelCheckpoint
from tandem.loggers import CSVLogger
from tandem.utilities.checkpoint import load_checkpoint_file
from tandem.utilities.exceptions import MisconfigurationException, TandemConfigError, TandemUserCodeError

pytestmark = pytest.mark.timeout(60)


class TwoNets(tandem.TrainingModule):
    """Two optimizers on two halves, stepped by hand; schedulers stepped by hand at each epoch's end."""

    def __init__(self, lr: float = 0.1, shape: str = "lists", dropout: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.encoder = nn.Sequential(nn.Linear(8, 8), nn.Dropout(dropout), nn.Tanh())
        self.head = nn.Linear(8, 3)
        self.seen_optimizers: list[type] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt_a, opt_b = self.optimizers()
        self.seen_optimizers = [type(opt_a), type(opt_b)]
        loss = F.cross_entropy(self.head(self.encoder(x)), y)
        opt_a.zero_grad()
        opt_b.zero_grad()
        self.manual_backward(loss)
        opt_a.step()
        opt_b.step()
        self.log("loss", loss, prog_bar=True)
        return loss

    def on_train_epoch_end(self):
        for scheduler in self.lr_schedulers():
            scheduler.step()

    def configure_optimizers(self):
        opt_a = torch.optim.SGD(self.encoder.parameters(), lr=self.hparams.lr, momentum=0.9)
        opt_b = torch.optim.Adam(self.head.parameters(), lr=self.hparams.lr / 10)
        sched_a = torch.optim.lr_scheduler.StepLR(opt_a, step_size=1, gamma=0.5)
        sched_b = torch.optim.lr_scheduler.ExponentialLR(opt_b, gamma=0.9)
        if self.hparams.shape == "dicts":
            return [{"optimizer": opt_a, "lr_scheduler": sched_a}, {"optimizer": opt_b, "lr_scheduler": sched_b}]
        return [opt_a, opt_b], [sched_a, sched_b]


def _hand_written(model: TwoNets, epochs: int, data) -> None:
    opt_a = torch.optim.SGD(model.encoder.parameters(), lr=0.1, momentum=0.9)
    opt_b = torch.optim.Adam(model.head.parameters(), lr=0.01)
    sched_a = torch.optim.lr_scheduler.StepLR(opt_a, step_size=1, gamma=0.5)
    sched_b = torch.optim.lr_scheduler.ExponentialLR(opt_b, gamma=0.9)
    for _ in range(epochs):
        for x, y in data:
            loss = F.cross_entropy(model.head(model.encoder(x)), y)
            opt_a.zero_grad()
            opt_b.zero_grad()
            loss.backward()
            opt_a.step()
            opt_b.step()
        sched_a.step()
        sched_b.step()


@pytest.mark.parametrize("shape", ["lists", "dicts"])
def test_manual_steps_count_and_match_a_hand_written_loop(shape):
    tandem.seed_everything(0)
    model = TwoNets(shape=shape)
    reference = copy.deepcopy(model)
    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(model, loader(64, 16))
    assert trainer.global_step == 2 * 4 * 2  # each optimizer's step counts, as in Lightning
    assert model.seen_optimizers == [type(o) for o in trainer.optimizers] or all(
        issubclass(seen, type(o)) for seen, o in zip(model.seen_optimizers, trainer.optimizers)
    )
    _hand_written(reference, 2, loader(64, 16))
    assert max_abs_diff(model.state_dict(), reference.state_dict()) == 0.0
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.25)  # stepped by the module only


def test_max_steps_checkpoints_and_logging_follow_the_manual_steps(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1, filename="{step}")
    logger = CSVLogger(tmp_path)
    trainer = tandem.Trainer(
        accelerator="cpu",
        max_steps=12,  # 2 optimizer steps per batch: 6 batches
        log_every_n_steps=2,
        logger=logger,
        callbacks=[checkpoint],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TwoNets(), loader(64, 8))
    assert trainer.global_step == 12 and trainer.num_training_batches == 8  # stopped after 6 of 8 batches
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step=12.ckpt", "step=4.ckpt", "step=8.ckpt"]
    rows = (Path(logger.log_dir) / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    steps = [int(row.split(",")[header.index("step")]) for row in rows[1:] if row.split(",")[header.index("loss")]]
    assert steps == [1, 3, 5]  # Lightning's: the batches stepped before each logging one, every log_every_n_steps


def test_exact_resume_with_two_optimizers_and_two_schedulers(tmp_path):
    def run(epochs, ckpt_path=None, folder="whole"):
        tandem.seed_everything(5)
        model = TwoNets(dropout=0.2)
        checkpoint = ModelCheckpoint(dirpath=tmp_path / folder, save_last=True, save_top_k=0)
        trainer = quiet_trainer(max_epochs=epochs, callbacks=[checkpoint], enable_checkpointing=True)
        trainer.fit(model, loader(64, 16, shuffle=True), ckpt_path=ckpt_path)
        return model, trainer

    whole, _ = run(4)
    run(2, folder="half")
    saved = load_checkpoint_file(tmp_path / "half" / "last.ckpt")
    assert len(saved["optimizer_states"]) == 2 and len(saved["lr_schedulers"]) == 2
    resumed, trainer = run(4, ckpt_path=tmp_path / "half" / "last.ckpt", folder="half")
    assert trainer.global_step == 4 * 4 * 2
    assert max_abs_diff(resumed.state_dict(), whole.state_dict()) == 0.0
    for a, b in zip(trainer.optimizers, run(4, folder="again")[1].optimizers):
        assert a.param_groups[0]["lr"] == b.param_groups[0]["lr"]


def test_toggle_optimizer_freezes_the_other_networks_and_untoggle_restores():
    seen = {}

    class Toggling(TwoNets):
        def training_step(self, batch, batch_idx):
            opt_a, opt_b = self.optimizers()
            self.head.bias.requires_grad_(False)  # the user's own choice must survive the toggling
            with self.toggled_optimizer(opt_a):
                seen["toggled"] = {n: p.requires_grad for n, p in self.named_parameters()}
            seen["after"] = {n: p.requires_grad for n, p in self.named_parameters()}
            self.toggle_optimizer(opt_b)
            seen["b"] = {n: p.requires_grad for n, p in self.named_parameters()}
            self.untoggle_optimizer(opt_b)
            self.head.bias.requires_grad_(True)
            return super().training_step(batch, batch_idx)

    quiet_trainer(max_steps=2).fit(Toggling(), loader(32, 16))
    assert seen["toggled"] == {
        "encoder.0.weight": True,
        "encoder.0.bias": True,
        "head.weight": False,
        "head.bias": False,
    }
    assert seen["after"] == {"encoder.0.weight": True, "encoder.0.bias": True, "head.weight": True, "head.bias": False}
    assert seen["b"] == {"encoder.0.weight": False, "encoder.0.bias": False, "head.weight": True, "head.bias": False}


def test_manual_backward_goes_through_the_precision_and_hooks():
    calls = []

    class Scaled(TwoNets):
        def on_before_backward(self, loss):
            calls.append("before_backward")

        def on_after_backward(self):
            calls.append("after_backward")

        def on_before_optimizer_step(self, optimizer):
            calls.append("before_step")

    trainer = quiet_trainer(max_steps=2, precision="bf16-mixed")
    trainer.fit(Scaled(), loader(32, 16))
    assert calls == ["before_backward", "after_backward", "before_step", "before_step"]


def test_float16_manual_steps_use_the_scaler_and_clip_unscaled_gradients():
    norms = []

    class Clipped(TwoNets):
        def training_step(self, batch, batch_idx):
            x, y = batch
            opt_a, opt_b = self.optimizers()
            loss = F.cross_entropy(self.head(self.encoder(x)), y)
            self.manual_backward(loss)
            self.clip_gradients(opt_a, gradient_clip_val=0.01, gradient_clip_algorithm="norm")
            opt_a.step()
            opt_b.step()
            opt_a.zero_grad()
            opt_b.zero_grad()

        def on_before_optimizer_step(self, optimizer):
            if optimizer is self.trainer.optimizers[0]:  # what the optimizer steps with: unscaled, clipped
                norms.append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in self.encoder.parameters()])))

    trainer = quiet_trainer(max_steps=8, **float16_mixed())
    trainer.fit(Clipped(), loader(64, 16))
    assert trainer.global_step == 8 and len(norms) == 4
    # clipped after unscaling (clipping the scaled gradients would leave 0.01 / 65536 after the scaler's step)
    assert all(abs(n.item() - 0.01) < 1e-4 for n in norms), norms


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (dict(accumulate_grad_batches=2), r"accumulate_grad_batches=2\) with manual optimization"),
        (dict(gradient_clip_val=1.0), r"gradient_clip_val=1.0\) with manual optimization.*self.clip_gradients"),
    ],
)
def test_trainer_settings_that_manual_optimization_cannot_honour(settings, match):
    with pytest.raises(TandemConfigError, match=match):
        quiet_trainer(max_steps=1, **settings).fit(TwoNets(), loader())


def test_several_optimizers_with_automatic_optimization_name_manual_optimization():
    class Two(TinyModule):
        def configure_optimizers(self):
            return [
                torch.optim.SGD(self.net[0].parameters(), lr=0.1),
                torch.optim.SGD(self.net[3].parameters(), lr=0.1),
            ]

    with pytest.raises(TandemUserCodeError, match=r"needs manual optimization.*automatic_optimization = False"):
        quiet_trainer(max_steps=1).fit(Two(), loader())


def test_manual_backward_with_automatic_optimization_is_an_error():
    class Mixed(TinyModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.manual_backward(loss)
            return loss

    with pytest.raises(TandemUserCodeError, match=r"manual_backward is for manual optimization") as caught:
        quiet_trainer(max_steps=1).fit(Mixed(), loader())
    assert "too late" not in str(caught.value)  # the mode was never changed: nothing to say about when


@pytest.mark.parametrize("hook", ["on_fit_start", "on_train_start", "training_step"])
def test_automatic_optimization_set_after_the_fit_started_says_it_came_too_late_and_where(hook):
    """The fit chose automatic optimization when it started; the module switched in a hook, then stepped by hand. The
    error names the hook and says the change came too late, before the advice to set it in __init__."""

    class Late(TinyModule):
        def switch(self, here: str) -> None:
            if here == hook:
                self.automatic_optimization = False

        def on_fit_start(self):
            self.switch("on_fit_start")

        def on_train_start(self):
            self.switch("on_train_start")

        def training_step(self, batch, batch_idx):
            self.switch("training_step")
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(F.cross_entropy(self(batch[0]), batch[1]))
            opt.step()

    with pytest.raises(TandemUserCodeError) as caught:
        quiet_trainer(max_steps=1).fit(Late(), loader())
    assert (
        f"self.automatic_optimization was set to False in {hook}, after this fit had started in automatic "
        "optimization" in str(caught.value)
    )
    assert "the change came too late. Set self.automatic_optimization = False in __init__" in str(caught.value)


def test_automatic_optimization_set_in_configure_optimizers_is_named_as_too_late():
    class TwoLate(TinyModule):
        def configure_optimizers(self):
            self.automatic_optimization = False  # read when the fit started, before this hook ran
            return [
                torch.optim.SGD(self.net[0].parameters(), lr=0.1),
                torch.optim.SGD(self.net[3].parameters(), lr=0.1),
            ]

    with pytest.raises(
        TandemUserCodeError,
        match=r"needs manual optimization\. self.automatic_optimization was set "
        r"to False in configure_optimizers, after this fit had started in automatic optimization",
    ):
        quiet_trainer(max_steps=1).fit(TwoLate(), loader())


# ---------------------------------------------------------------------------------------------- own schedulers
class HalvingSchedule:
    """A scheduler that is not torch's (no ``LRScheduler`` base): ``step()`` halves the rate; its checkpoint state
    is its count of steps."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer, self.steps = optimizer, 0

    def step(self) -> None:
        self.steps += 1
        for group in self.optimizer.param_groups:
            group["lr"] *= 0.5

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = state["steps"]


class OwnSchedule(TinyModule):
    """Manual optimization stepping a :class:`HalvingSchedule` every other batch through ``self.lr_schedulers()``."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt, schedule = self.optimizers(), self.lr_schedulers()
        self.manual_backward(super().training_step(batch, batch_idx))
        opt.step()
        opt.zero_grad()
        if batch_idx % 2:
            schedule.step()

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
        return {"optimizer": optimizer, "lr_scheduler": HalvingSchedule(optimizer)}


def test_a_manual_step_steps_a_scheduler_that_is_not_torchs_and_its_state_resumes(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True, save_top_k=0)
    first = quiet_trainer(max_epochs=1, callbacks=[checkpoint])
    first.fit(OwnSchedule(), loader(64, 16))
    schedule = first.lr_scheduler_configs[0].scheduler
    assert isinstance(schedule, HalvingSchedule) and schedule.steps == 2  # batches 1 and 3 of 4
    assert first.optimizers[0].param_groups[0]["lr"] == 0.25
    assert load_checkpoint_file(tmp_path / "last.ckpt")["lr_schedulers"] == [{"steps": 2}]
    resumed = quiet_trainer(max_epochs=2)
    resumed.fit(OwnSchedule(), loader(64, 16), ckpt_path=tmp_path / "last.ckpt")
    assert resumed.lr_scheduler_configs[0].scheduler.steps == 4
    assert resumed.optimizers[0].param_groups[0]["lr"] == 1.0 / 16


def test_a_scheduler_without_state_dict_and_load_state_dict_is_refused_naming_them():
    class Stateless:
        def __init__(self, optimizer):
            self.optimizer = optimizer

        def step(self):
            pass

    class Module(OwnSchedule):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
            return [optimizer], [Stateless(optimizer)]

    message = r"lr scheduler `Stateless` is invalid. It should have `state_dict` and `load_state_dict` methods"
    with pytest.raises(TypeError, match=message + r".*add both to Stateless"):  # Lightning's type and words
        quiet_trainer(max_steps=1).fit(Module(), loader())


def test_automatic_optimization_steps_a_scheduler_that_is_not_torchs_only_through_lr_scheduler_step():
    class Automatic(TinyModule):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": HalvingSchedule(optimizer), "interval": "step"},
            }

    message = r"`HalvingSchedule` doesn't follow PyTorch's LRScheduler API.*override TrainingModule.lr_scheduler_step"
    with pytest.raises(MisconfigurationException, match=message):  # as Lightning's, a config error
        quiet_trainer(max_steps=1).fit(Automatic(), loader())

    class Overridden(Automatic):
        def lr_scheduler_step(self, scheduler, metric):
            scheduler.step()

    trainer = quiet_trainer(max_steps=3)
    trainer.fit(Overridden(), loader())
    assert trainer.lr_scheduler_configs[0].scheduler.steps == 3
    by_instance = Automatic()  # a hook set on the instance counts too, as in Lightning
    by_instance.lr_scheduler_step = lambda scheduler, metric: scheduler.step()
    trainer = quiet_trainer(max_steps=2)
    trainer.fit(by_instance, loader())
    assert trainer.lr_scheduler_configs[0].scheduler.steps == 2


# ---------------------------------------------------------------------------------------------- DDP


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", ["gan", "single"])
def test_manual_optimization_under_ddp_equals_one_process_with_twice_the_batch(core_ddp, scripts_on_path, name):
    import manual_modules

    torch.manual_seed(0)
    model = manual_modules.MODULES[name]()
    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(model, manual_modules.loader(2 * manual_modules.BATCH))
    for result in core_ddp["manual"]:
        run = result[name]
        assert run["steps"] == trainer.global_step == (32 if name == "gan" else 16)
        assert max_abs_diff(run["final"], model.state_dict()) <= 1e-6, max_abs_diff(run["final"], model.state_dict())


def test_manual_epoch_without_a_counted_step_warns_naming_self_optimizers():
    class RawStep(tandem.TrainingModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.net = nn.Linear(8, 3)

        def training_step(self, batch, batch_idx):
            opt = self.optimizers(use_pl_optimizer=False)  # the classic mistake: the torch optimizer itself
            opt.zero_grad()
            self.manual_backward(F.cross_entropy(self.net(batch[0]), batch[1]))
            opt.step()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.warns(
        UserWarning,
        match=r"(?s)No optimizer step was counted in training epoch 0 \(2 batches; "
        r"global_step stays at 0\), although backward ran.*opt.step\(\).*self.optimizers\(\)",
    ):
        trainer = quiet_trainer(max_epochs=1, limit_train_batches=2)
        trainer.fit(RawStep(), loader())
    assert trainer.global_step == 0


# ------------------------------------------------------------------------- zero_grad under manual optimization


class Zeroing(tandem.TrainingModule):
    """Manual optimization in one of the usual shapes (``pattern``); ``zero=False`` leaves out its zero_grad."""

    def __init__(self, pattern: str, zero: bool = True) -> None:
        super().__init__()
        self.pattern, self.zero = pattern, zero
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(8, 8), nn.Tanh())
        self.discriminator = nn.Linear(8, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.pattern == "gan":  # Lightning's docs: the generator's backward reaches the discriminator too
            opt_g, opt_d = self.optimizers()
            fake = self.generator(x)
            d_loss = F.cross_entropy(self.discriminator(x), y) + F.cross_entropy(self.discriminator(fake.detach()), y)
            if self.zero:
                opt_d.zero_grad()
            self.manual_backward(d_loss)
            opt_d.step()
            opt_g.zero_grad()
            self.manual_backward(-F.cross_entropy(self.discriminator(fake), y))
            opt_g.step()
            return
        opt = self.optimizers()
        loss = F.cross_entropy(self.discriminator(self.generator(x)), y)
        if self.pattern == "accumulate":  # Lightning's docs: step and zero every N batches
            self.manual_backward(loss / 2)
            if (batch_idx + 1) % 2 == 0:
                opt.step()
                if self.zero:
                    opt.zero_grad()
            return
        if self.zero:
            if self.pattern in ("every batch", "clipped"):
                opt.zero_grad()
            elif self.pattern == "in place":
                opt.zero_grad(set_to_none=False)
            elif self.pattern == "torch optimizer in place":
                self.optimizers(use_pl_optimizer=False).zero_grad(set_to_none=False)
            elif self.pattern == "module":
                self.zero_grad()
            elif self.pattern == "module in place":
                self.zero_grad(set_to_none=False)
            elif self.pattern == "grad = None":
                for p in self.parameters():
                    p.grad = None
        self.manual_backward(loss)
        if self.pattern == "clipped":  # clipping changes the gradients in place: still not a zero_grad
            self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
        opt.step()

    def configure_optimizers(self):
        if self.pattern == "gan":
            return [
                torch.optim.SGD(self.generator.parameters(), lr=0.01),
                torch.optim.Adam(self.discriminator.parameters(), lr=0.01),
            ]
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize(
    "pattern",
    [
        "every batch",
        "accumulate",
        "gan",
        "in place",
        "torch optimizer in place",
        "module",
        "module in place",
        "grad = None",
        "clipped",
    ],
)
def test_a_step_on_gradients_no_zero_grad_cleared_warns_once_naming_the_optimizer(pattern):
    from tandem.utilities.exceptions import UnzeroedGradientsWarning

    with warnings.catch_warnings():  # zeroed, in whichever way: silent
        warnings.simplefilter("error")
        quiet_trainer(max_epochs=2).fit(Zeroing(pattern), loader(64, 8))
    name = r"self.optimizers\(\)\[1\] \(Adam\)" if pattern == "gan" else r"self.optimizers\(\) \(SGD\)"
    with pytest.warns(UnzeroedGradientsWarning, match=rf"(?s)^Optimizer {name} stepped again.*no zero_grad") as seen:
        quiet_trainer(max_epochs=2).fit(Zeroing(pattern, zero=False), loader(64, 8))
    found = [w for w in seen if issubclass(w.category, UnzeroedGradientsWarning)]
    assert len(found) == 1  # once per fit
    assert r"Call opt.zero_grad() before manual_backward, or after opt.step()" in str(found[0].message)


def test_unpacking_self_optimizers_with_one_optimizer_says_it_returns_the_optimizer_alone():
    """Lightning returns the single optimizer unwrapped too; unpacking it said "cannot unpack non-iterable"."""

    class OneOptimizer(TinyModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt_a, opt_b = self.optimizers()

    with pytest.raises(TypeError, match=r"self.optimizers\(\) returned one optimizer \(SGD\)") as caught:
        quiet_trainer(max_steps=1, limit_val_batches=0).fit(OneOptimizer(), loader())
    message = str(caught.value)
    assert "cannot be unpacked" in message and "returns it alone, not a list" in message
    assert "opt = self.optimizers()" in message and "return opt_a, opt_b" in message
