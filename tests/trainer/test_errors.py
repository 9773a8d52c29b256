"""Bad input gets a clear error naming the fix."""

from __future__ import annotations

import pytest
import torch

import tandem
from helpers import TinyModule, loader, quiet_trainer
from tandem.utilities.exceptions import CheckpointError, TandemConfigError, TandemUserCodeError, TandemWarning

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(strategy="dpp"), r"strategy='dpp' is not valid; expected one of: 'auto', .*'single_device'"),
        (dict(accelerator="tpu"), r"accelerator='tpu' is not valid; expected one of: 'auto', 'cpu', 'cuda'"),
        (dict(precision="8-bit"), r"precision='8-bit' is not valid; expected one of: '32-true', '64-true'"),
        (dict(devices=0), r"devices=0 is out of range; expected at least 1.*accelerator='cpu'"),
        (dict(devices=2, strategy="single_device"), r"strategy='single_device' uses at most 1 device.*'ddp'"),
        (dict(devices=[0, 1]), r"only CUDA has; on the CPU pass the number of processes"),
        (dict(devices="two"), r"devices='two' is out of range"),
        (dict(accumulate_grad_batches=0), r"accumulate_grad_batches=0 is out of range; expected an int >= 1"),
        (dict(limit_train_batches=1.5), r"limit_train_batches=1.5 is out of range"),
        (dict(limit_val_batches=-1), r"limit_val_batches=-1 is out of range"),
        (dict(max_epochs=-3), r"max_epochs=-3 is out of range"),
        (
            dict(gradient_clip_algorithm="l2"),
            r"gradient_clip_algorithm='l2' is not valid; expected one of: 'norm', 'value'",
        ),
        (dict(gradient_clip_val=-1.0), r"gradient_clip_val=-1.0 is out of range"),
        (dict(val_check_interval=0.0), r"val_check_interval=0.0 is out of range"),
        (dict(callbacks=[object()]), r"callbacks must be tandem.Callback instances"),
        (dict(logger="tb"), r"is not a tandem Logger"),
        (dict(num_nodes=0), r"num_nodes=0 is out of range"),
    ],
)
def test_bad_trainer_arguments(kwargs, match):
    with pytest.raises(TandemConfigError, match=match):
        tandem.Trainer(accelerator=kwargs.pop("accelerator", "cpu"), **kwargs)


def test_cuda_requested_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(
        TandemConfigError, match=r"accelerator='cuda' was requested but no CUDA device.*accelerator='cpu'"
    ):
        tandem.Trainer(accelerator="cuda")


def test_more_cuda_devices_than_exist(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(TandemConfigError, match=r"devices=4 is out of range; expected at most 2.*CUDA_VISIBLE_DEVICES"):
        tandem.Trainer(accelerator="cuda", devices=4, strategy="ddp")
    with pytest.raises(TandemConfigError, match=r"devices=\[0, 5\] is out of range; expected distinct indices in 0..1"):
        tandem.Trainer(accelerator="cuda", devices=[0, 5], strategy="ddp")


@pytest.mark.parametrize(
    ("returned", "match"),
    [
        ("a string", r"training_step returned str; expected the loss as a scalar tensor"),
        ({"logits": 1}, r"a dict without a scalar tensor under 'loss' \(keys: \['logits'\]\)"),
        (torch.ones(3, requires_grad=True), r"Tensor of shape \(3,\)"),
        (torch.tensor(1.0), r"does not require grad"),
    ],
)
def test_training_step_returning_the_wrong_thing(returned, match):
    class Bad(TinyModule):
        def training_step(self, batch, batch_idx):
            return returned

    with pytest.raises(TandemUserCodeError, match=match):
        quiet_trainer(max_steps=1).fit(Bad(), loader())


@pytest.mark.parametrize(
    ("returned", "match"),
    [
        ("sgd", r"^Unknown configuration for model optimizers: configure_optimizers returned 'sgd': that is not"),
        ({"lr_scheduler": None}, r"a dict needs the key 'optimizer'"),
        ("two", r"returned 2 optimizers; training with several optimizers needs manual optimization"),
        (
            "plateau",
            r"^`configure_optimizers` must include a monitor when a `ReduceLROnPlateau` scheduler is used: .*"
            r"ReduceLROnPlateau needs a metric: add 'monitor'",
        ),
        ("plateau_dict", r"^The lr scheduler dict must include a monitor when a `ReduceLROnPlateau`"),
        ("no_scheduler", r'^The lr scheduler dict must have the key "scheduler" with its item being an lr scheduler'),
        ("other_optimizer", r"^Some schedulers are attached with an optimizer that wasn't returned from"),
        ("interval", r'^The "interval" key in lr scheduler dict must be "step" or "epoch" but is "hour"'),
    ],
)
def test_configure_optimizers_shape(returned, match):
    class Bad(TinyModule):
        def configure_optimizers(self):
            sgd = torch.optim.SGD(self.parameters(), lr=0.1)
            if returned == "two":
                return [sgd, torch.optim.SGD(self.parameters(), lr=0.1)]
            if returned == "plateau":
                return {"optimizer": sgd, "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(sgd)}
            if returned == "plateau_dict":
                return {
                    "optimizer": sgd,
                    "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(sgd)},
                }
            if returned == "no_scheduler":
                return {"optimizer": sgd, "lr_scheduler": {}}
            if returned == "other_optimizer":
                other = torch.optim.SGD(self.parameters(), lr=0.1)
                return [sgd], [torch.optim.lr_scheduler.StepLR(other, 1)]
            if returned == "interval":
                return {
                    "optimizer": sgd,
                    "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(sgd, 1), "interval": "hour"},
                }
            return returned

    with pytest.raises((TandemUserCodeError, TandemConfigError), match=match):
        quiet_trainer(max_steps=1).fit(Bad(), loader())


def test_configure_optimizers_returning_none_runs_without_changing_the_weights_as_lightning():
    """Lightning warns "this fit will run with no optimizer" and runs the steps; tandem did the same only under
    manual optimization and refused otherwise."""

    class NoOptimizer(TinyModule):
        def configure_optimizers(self):
            return None

    model = NoOptimizer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = quiet_trainer(max_epochs=1)
    with pytest.warns(
        TandemWarning, match=r"`configure_optimizers` returned `None`, this fit will run with no optimizer"
    ):
        trainer.fit(model, loader())
    assert trainer.global_step == 4  # the steps ran (and counted) as Lightning's do
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_unsupported_keys_and_a_one_cycle_stepped_per_epoch_warn_as_lightning():
    """Lightning ignores unknown keys of the optimizer and scheduler dicts with a RuntimeWarning (tandem refused
    them), and warns about a OneCycleLR stepped per epoch."""

    class Extra(TinyModule):
        def configure_optimizers(self):
            sgd = torch.optim.SGD(self.parameters(), lr=0.1)
            scheduler = torch.optim.lr_scheduler.OneCycleLR(sgd, max_lr=0.1, total_steps=100)
            return {"optimizer": sgd, "lr_scheduler": {"scheduler": scheduler, "foo": 1}, "bar": 2}

    trainer = quiet_trainer(max_steps=1)
    with pytest.warns(RuntimeWarning) as caught:
        trainer.fit(Extra(), loader())
    messages = sorted(str(w.message) for w in caught if issubclass(w.category, RuntimeWarning))
    assert messages[0].startswith("A `OneCycleLR` scheduler is using 'interval': 'epoch'")
    assert messages[1].startswith("Found unsupported keys in the lr scheduler dict: {'foo'}")
    assert messages[2].startswith("Found unsupported keys in the optimizer configuration: {'bar'}")
    assert trainer.lr_scheduler_configs[0].interval == "epoch"  # the known keys still apply


def test_configure_optimizers_missing():
    class NoOpt(tandem.TrainingModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 3)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

    with pytest.raises(TandemUserCodeError, match=r"NoOpt has no configure_optimizers\(\).*torch.optim.Adam"):
        quiet_trainer(max_steps=1).fit(NoOpt(), loader())


@pytest.mark.parametrize("value", ["high", [1.0, 2.0], torch.ones(2)])
def test_logging_something_that_is_not_a_number(value):
    class Bad(TinyModule):
        def training_step(self, batch, batch_idx):
            self.log("bad", value)
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match=r"self.log\(bad, .*was called, but|self.log\('bad', ...\) got a tensor"):
        quiet_trainer(max_steps=1).fit(Bad(), loader())


def test_bad_reduce_fx():
    class Bad(TinyModule):
        def training_step(self, batch, batch_idx):
            self.log("x", 1.0, reduce_fx="median")
            return super().training_step(batch, batch_idx)

    with pytest.raises(TandemConfigError, match=r"reduce_fx=...\)='median' is not valid; expected one of: 'mean'"):
        quiet_trainer(max_steps=1).fit(Bad(), loader())


def test_scheduler_monitor_never_logged_lists_logged_keys():
    class Plateau(TinyModule):
        def configure_optimizers(self):
            sgd = torch.optim.SGD(self.parameters(), lr=0.1)
            return {
                "optimizer": sgd,
                "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(sgd), "monitor": "val_los"},
            }

    with pytest.raises(KeyError, match=r"monitors 'val_los', which was never logged. Logged metrics: .*'val_loss'"):
        quiet_trainer(max_epochs=1).fit(Plateau(), loader(), loader())


def test_fit_without_training_data_and_validate_without_validation_data():
    with pytest.raises(TandemConfigError, match=r"Trainer.fit needs training data: pass train_dataloaders="):
        quiet_trainer().fit(TinyModule())
    with pytest.raises(TandemConfigError, match=r"Trainer.validate needs data: pass dataloaders=.*val_dataloader\(\)"):
        quiet_trainer().validate(TinyModule())
    with pytest.raises(TandemConfigError, match=r"both dataloaders and a datamodule"):
        quiet_trainer().fit(TinyModule(), loader(), datamodule=tandem.DataModule())


def test_fit_with_a_plain_module():
    with pytest.raises(
        TandemUserCodeError, match=r"expects a tandem.TrainingModule \(or torch.compile of one\), got Linear"
    ):
        quiet_trainer().fit(torch.nn.Linear(2, 2), loader())


def test_bad_checkpoint_paths(tmp_path):
    trainer = quiet_trainer(max_epochs=1)
    with pytest.raises(CheckpointError, match=r"'.*missing.ckpt' does not exist"):
        trainer.fit(TinyModule(), loader(), ckpt_path=tmp_path / "missing.ckpt")

    good = tmp_path / "good.ckpt"
    trainer.fit(TinyModule(), loader())
    trainer.save_checkpoint(good)
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"truncated.ckpt' could not be read .*truncated"):
        quiet_trainer(max_epochs=2).fit(TinyModule(), loader(), ckpt_path=truncated)

    foreign = tmp_path / "weights.pt"
    torch.save(TinyModule().state_dict(), foreign)
    with pytest.raises(CheckpointError, match=r"weights.pt' is not a tandem checkpoint .*load_state_dict"):
        quiet_trainer(max_epochs=2).fit(TinyModule(), loader(), ckpt_path=foreign)

    garbage = tmp_path / "garbage.ckpt"
    garbage.write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match=r"garbage.ckpt' is not a checkpoint: torch.save did not write it"):
        quiet_trainer().validate(TinyModule(), loader(), ckpt_path=garbage)


def _filtering_loader() -> torch.utils.data.DataLoader:
    """Batches of 16; a collate_fn that drops the samples of the second batch (index 1) entirely."""
    calls = []

    def collate(samples):
        calls.append(len(calls))
        x, y = torch.utils.data.default_collate(samples)
        return (x[:0], y[:0]) if calls[-1] == 1 else (x, y)

    return loader(64, 16, collate_fn=collate)


def test_an_empty_training_batch_is_named_with_one_process_and_no_logger():
    with pytest.raises(
        TandemUserCodeError,
        match=r"Training batch 1 of epoch 0 holds no samples.*collate_fn.*__len__"
        r".*drop_last=True.*return None",
    ):
        quiet_trainer(max_epochs=1).fit(TinyModule(), _filtering_loader())


def test_an_empty_training_batch_that_training_step_skips_is_not_an_error():
    class Skips(TinyModule):
        def training_step(self, batch, batch_idx):
            return None if len(batch[0]) == 0 else super().training_step(batch, batch_idx)

    trainer = quiet_trainer(max_epochs=1)
    with pytest.warns(TandemWarning, match=r"`training_step` returned `None`"):
        trainer.fit(Skips(), _filtering_loader())
    assert trainer.global_step == 4  # Lightning counts the skipped batch's step too


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("case", "step"), [("publish", 3), ("epoch_end", 4)])
def test_an_empty_batch_on_one_ddp_rank_stops_every_rank_with_its_name(tmp_path, case, step):
    """Rank 1 alone gets an empty batch (index 2): both ranks raise the same error at the same step, found in the
    next publishing step's gathering ("publish") or, after the last one, in the epoch end's reduction; no hang."""
    from pathlib import Path

    from helpers import launch_free_env, run_python

    script = Path(__file__).parent / "scripts" / "empty_batch_run.py"
    done = run_python([str(script), str(tmp_path), case], timeout=90, cwd=tmp_path, env=launch_free_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in (0, 1):
        result = torch.load(tmp_path / f"empty-rank{rank}.pt", weights_only=False)
        assert result["type"] == "TandemUserCodeError", result
        assert "Training batch 2 of epoch 0 on rank 1 holds no samples" in result["error"]
        assert "NaN or inf" not in result["error"] and result["step"] == step


class DictBatches(torch.utils.data.Dataset):
    """Samples as dicts: the loader's batches are ``{"x": ..., "y": ...}`` (plus ``"id"`` with ``extra``)."""

    def __init__(self, extra: bool = False) -> None:
        self.extra = extra

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> dict:
        sample = {"x": torch.randn(8), "y": torch.tensor(index % 3)}
        return {**sample, "id": torch.tensor(index)} if self.extra else sample


@pytest.mark.parametrize(
    ("fn", "extra", "error", "match"),
    [
        ("fit", False, TypeError, r"must be Tensor, not str"),  # self(x) on the key "x"
        ("validate", False, AttributeError, r"'str' object has no attribute 'float'"),  # x.float() on the key "x"
        ("fit", True, ValueError, r"too many values to unpack"),  # three keys, two names
    ],
)
def test_unpacking_a_dict_batch_says_it_gave_the_keys_and_reads_them_by_key(fn, extra, error, match):
    """``x, y = batch`` on a dict batch unpacks its keys: the error keeps Python's message and gets a note that
    names the mistake and the fix."""

    class Unpacks(TinyModule):
        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", self(x.float()).sum())

    data = torch.utils.data.DataLoader(DictBatches(extra), batch_size=4)
    trainer = quiet_trainer(max_steps=1, limit_val_batches=0 if fn == "fit" else 1.0)
    with pytest.raises(error, match=match) as caught:
        trainer.fit(Unpacks(), data) if fn == "fit" else trainer.validate(Unpacks(), data)
    note = "".join(getattr(caught.value, "__notes__", []))
    assert "The batch is a dict" in note and "'x', 'y'" in note
    assert "unpacking" in note and "x, y = batch['x'], batch['y']" in note


def test_a_str_error_with_a_batch_that_is_no_dict_gets_no_note():
    class Bad(TinyModule):
        def training_step(self, batch, batch_idx):
            return self("not a tensor")

    with pytest.raises(TypeError, match="not str") as caught:
        quiet_trainer(max_steps=1, limit_val_batches=0).fit(Bad(), loader())
    assert not getattr(caught.value, "__notes__", None)


def test_a_failed_background_write_is_noted_on_the_run_error_also_without_add_note(tmp_path, monkeypatch):
    """Python 3.10's exceptions have no ``add_note``: the failed background checkpoint write is then appended to the
    run's error message, and the run's own error is what the fit raises (not an AttributeError)."""
    from tandem.callbacks import ModelCheckpoint
    from tandem.strategies import AsyncCheckpointIO
    from tandem.strategies import checkpoint_io as checkpoint_io_module

    class NoNotes(RuntimeError):  # as on Python 3.10
        def __getattribute__(self, name):
            if name == "add_note":
                raise AttributeError(name)
            return super().__getattribute__(name)

    class FailsAtStep2(TinyModule):
        def training_step(self, batch, batch_idx):
            if batch_idx == 1:
                raise NoNotes("the step failed")
            return super().training_step(batch, batch_idx)

    def failing(obj, path):
        raise OSError("no space left")

    monkeypatch.setattr(checkpoint_io_module, "atomic_save", failing)
    checkpoints = ModelCheckpoint(tmp_path, every_n_train_steps=1)
    trainer = quiet_trainer(max_steps=3, plugins=[AsyncCheckpointIO()], callbacks=[checkpoints])
    with pytest.raises(NoNotes, match="the step failed") as caught:
        trainer.fit(FailsAtStep2(), loader())
    assert "The background checkpoint write also failed: OSError: no space left" in str(caught.value)


def one_target_short(samples: list) -> tuple[torch.Tensor, torch.Tensor]:
    """A collate_fn with a bug: every input, and one target fewer."""
    xs, ys = zip(*samples)
    return torch.stack(xs), torch.stack(ys[:-1])


def test_a_step_failing_on_a_batch_of_uneven_sizes_names_the_collate_fn():
    """16 inputs and 15 targets: torch's error stays as it is (type, message, traceback) and gets a note naming the
    sizes and the loader's collate_fn; a validation loader with torch's collate is told apart by its stage."""
    uneven = torch.utils.data.DataLoader(loader().dataset, batch_size=16, collate_fn=one_target_short)
    with pytest.raises(ValueError, match=r"^Expected input batch_size \(16\) to match target batch_size \(15\)") as fit:
        quiet_trainer(max_steps=1).fit(TinyModule(), uneven, loader())
    assert fit.traceback[-1].name == "cross_entropy"  # torch's own frame: the original traceback is kept
    note = "".join(fit.value.__notes__)
    assert "holds tensors of different first (batch) sizes: batch[0] has 16, batch[1] has 15" in note, note
    assert "(training: one_target_short; validation: torch's default_collate" in note, note
    with pytest.raises(ValueError, match="batch_size") as test:
        quiet_trainer().test(TinyModule(), uneven)
    assert "It was built by the loader's collate_fn, one_target_short." in "".join(test.value.__notes__)


def test_a_step_failing_on_an_even_batch_gets_no_size_note():
    class Bad(TinyModule):
        def training_step(self, batch, batch_idx):
            raise ValueError("a mistake of the step's own")

    with pytest.raises(ValueError, match="own") as caught:
        quiet_trainer(max_steps=1, limit_val_batches=0).fit(Bad(), loader())
    assert not getattr(caught.value, "__notes__", None)
