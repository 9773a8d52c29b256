import pytest
import torch
from torch import nn

import tandem
from helpers import TinyModule, loader, make_data, max_abs_diff, quiet_trainer
from tandem.callbacks import ModelCheckpoint, StochasticWeightAveraging
from tandem.utilities.exceptions import TandemConfigError

pytestmark = pytest.mark.timeout(60)


class Recorded(TinyModule):
    """Records the learning rate of every step and the weights at the end of every epoch."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.lrs, self.epoch_weights = [], []

    def training_step(self, batch, batch_idx):
        self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
        return super().training_step(batch, batch_idx)

    def on_train_epoch_end(self):
        self.epoch_weights.append({k: v.detach().clone() for k, v in self.state_dict().items()})


def test_the_last_epochs_are_averaged_at_swa_rates_whatever_the_modules_scheduler_does():
    model = Recorded(scheduler=True)  # StepLR halving the rate every epoch
    swa = StochasticWeightAveraging(swa_lrs=0.02, swa_epoch_start=3, annealing_epochs=0)
    quiet_trainer(max_epochs=4, callbacks=[swa]).fit(model, loader(64, 16))  # 4 steps an epoch
    assert [model.lrs[4 * e] for e in range(4)] == pytest.approx([0.1, 0.05, 0.02, 0.02])
    assert all(lr == pytest.approx(0.02) for lr in model.lrs[8:])
    assert swa.swa_start == 2 and swa.n_averaged == 2
    expected = {k: (model.epoch_weights[2][k] + model.epoch_weights[3][k]) / 2 for k in model.epoch_weights[3]}
    assert max_abs_diff(model.state_dict(), expected) < 1e-7  # the module now holds the average of epochs 2 and 3


class WithBatchNorm(TinyModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.BatchNorm1d(8), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def test_batch_norm_statistics_are_recomputed_with_the_averaged_weights():
    model = WithBatchNorm()
    quiet_trainer(max_epochs=3, callbacks=[StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=0.5)]).fit(
        model, loader(64, 16)
    )
    x = make_data(64).tensors[0]
    norm = model.net[0]
    # one pass over the data with cumulative averaging: the mean of the 4 batch means and batch variances
    torch.testing.assert_close(norm.running_mean, x.mean(0), atol=1e-6, rtol=0)
    torch.testing.assert_close(
        norm.running_var, torch.stack([b.var(0) for b in x.split(16)]).mean(0), atol=1e-5, rtol=0
    )
    assert norm.momentum == 0.1  # restored after the pass


def _run(root, epochs, resume=False):
    tandem.seed_everything(5)
    model = TinyModule(optimizer="adam", dropout=0.3, lr=0.02)
    swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=2, annealing_epochs=2)
    checkpoint = ModelCheckpoint(dirpath=root, save_last=True)  # the latest epoch's file, and last.ckpt with it
    trainer = quiet_trainer(max_epochs=epochs, callbacks=[checkpoint, swa], enable_checkpointing=True)
    trainer.fit(model, loader(64, 16, shuffle=True), ckpt_path=root / "last.ckpt" if resume else None)
    return model, swa


def test_swa_state_is_checkpointed_and_resume_is_bit_for_bit(tmp_path):
    whole, _ = _run(tmp_path / "whole", 5)
    _run(tmp_path / "halves", 3)  # SWA started at epoch 1: the checkpoint holds a running average
    saved = torch.load(tmp_path / "halves" / "last.ckpt")["callbacks"]["StochasticWeightAveraging"]  # weights_only
    assert saved["n_averaged"] == 1 and saved["scheduler_state"]["_step_count"] == 2
    resumed, swa = _run(tmp_path / "halves", 5, resume=True)
    assert swa.n_averaged == 4
    assert max_abs_diff(resumed.state_dict(), whole.state_dict()) == 0.0


def test_bad_arguments_fail_at_construction():
    for kwargs, message in (
        ({"swa_lrs": -1.0}, "positive float"),
        ({"swa_lrs": 0.1, "swa_epoch_start": 0}, "swa_epoch_start=0 is out of range"),
        ({"swa_lrs": 0.1, "swa_epoch_start": 1.5}, "swa_epoch_start=1.5 is out of range"),
        ({"swa_lrs": 0.1, "annealing_strategy": "step"}, "annealing_strategy='step' is not valid"),
        ({"swa_lrs": 0.1, "avg_fn": 3}, "avg_fn must be callable"),
    ):
        with pytest.raises(TandemConfigError, match=message):
            StochasticWeightAveraging(**kwargs)
