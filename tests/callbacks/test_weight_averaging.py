import pytest
import torch

import tandem
from helpers import TinyModule, loader, max_abs_diff, quiet_trainer
from tandem.callbacks import EMAWeightAveraging, ModelCheckpoint, WeightAveraging
from tandem.utilities.exceptions import TandemConfigError

pytestmark = pytest.mark.timeout(60)


def _weights(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class Recorded(TinyModule):
    """Records the weights after every optimizer step, and the weights validation runs with."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.step_weights, self.val_weights = [], []

    def on_train_batch_end(self, outputs, batch, batch_idx):  # after the callbacks' (Lightning's order)
        self.step_weights.append(_weights(self))

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0:
            self.val_weights.append(_weights(self))
        return super().validation_step(batch, batch_idx)


def _ema(steps, decay, start):
    average = None
    for weights in steps[start:]:
        average = (
            dict(weights) if average is None else {k: decay * average[k] + (1 - decay) * weights[k] for k in weights}
        )
    return average


def test_ema_matches_a_hand_computed_average_in_validation_at_the_end_and_in_the_checkpoint(tmp_path):
    model = Recorded()
    ema = EMAWeightAveraging(decay=0.5, update_starting_at_step=1)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)  # each epoch: the latest, last.ckpt with it
    trainer = quiet_trainer(max_epochs=2, callbacks=[checkpoint, ema], enable_checkpointing=True)
    trainer.fit(model, loader(64, 16), loader(32, 16))  # 4 optimizer steps an epoch
    steps = model.step_weights
    assert len(steps) == 8 and len(model.val_weights) == 2
    # step 0 is before update_starting_at_step: the average starts from the weights after step 1
    assert max_abs_diff(model.val_weights[0], _ema(steps[:4], 0.5, start=1)) < 1e-6
    assert max_abs_diff(model.val_weights[1], _ema(steps, 0.5, start=1)) < 1e-6
    assert max_abs_diff(model.state_dict(), _ema(steps, 0.5, start=1)) < 1e-6  # the average kept at the end
    assert max_abs_diff(model.state_dict(), steps[-1]) > 1e-3  # ... which is not the trained weights
    # Lightning's layout: the averaged weights under state_dict, the trained ones beside them
    saved = torch.load(tmp_path / "last.ckpt")
    assert max_abs_diff(saved["state_dict"], _ema(steps, 0.5, start=1)) < 1e-6
    assert max_abs_diff(saved["current_model_state"], steps[-1]) == 0.0
    assert int(saved["averaging_state"]["n_averaged"]) == 7
    assert saved["callbacks"]["EMAWeightAveraging"]["latest_update_step"] == 8


def _run(root, epochs, resume=False):
    tandem.seed_everything(3)
    model = TinyModule(optimizer="adam", lr=0.02)
    ema = EMAWeightAveraging(decay=0.7, update_every_n_steps=2)
    checkpoint = ModelCheckpoint(dirpath=root, save_last=True)  # each epoch: the latest, last.ckpt with it
    trainer = quiet_trainer(max_epochs=epochs, callbacks=[checkpoint, ema], enable_checkpointing=True)
    trainer.fit(model, loader(64, 16, shuffle=True), ckpt_path=root / "last.ckpt" if resume else None)
    return model, ema


def test_resume_restores_the_trained_weights_and_the_average(tmp_path):
    whole, whole_ema = _run(tmp_path / "whole", 3)
    _run(tmp_path / "halves", 2)
    resumed, ema = _run(tmp_path / "halves", 3, resume=True)
    assert int(ema.average_model.n_averaged) == int(whole_ema.average_model.n_averaged) == 6
    # resumed from the averaged weights instead, or with a fresh average, the final average would differ
    assert max_abs_diff(resumed.state_dict(), whole.state_dict()) == 0.0


class EpochMean(WeightAveraging):
    def should_update(self, step_idx=None, epoch_idx=None):
        return epoch_idx is not None


class EpochEnds(TinyModule):
    def __init__(self):
        super().__init__()
        self.epoch_weights = []

    def on_train_epoch_end(self):
        self.epoch_weights.append(_weights(self))


def test_should_update_chooses_epoch_ends_and_the_default_average_is_the_mean():
    model = EpochEnds()
    averaging = EpochMean()
    quiet_trainer(max_epochs=3, callbacks=[averaging]).fit(model, loader(64, 16))
    mean = {k: sum(w[k] for w in model.epoch_weights) / 3 for k in model.epoch_weights[0]}
    assert int(averaging.average_model.n_averaged) == 3
    assert max_abs_diff(model.state_dict(), mean) < 1e-6


def test_bad_arguments_fail_at_construction():
    for make, message in (
        (lambda: WeightAveraging(avg=None), "unknown argument"),
        (lambda: WeightAveraging(avg_fn=3), "avg_fn must be callable"),
        (lambda: EMAWeightAveraging(decay=1.5), "decay=1.5 is out of range"),
        (lambda: EMAWeightAveraging(update_every_n_steps=-1), "update_every_n_steps=-1 is out of range"),
    ):
        with pytest.raises(TandemConfigError, match=message):
            make()
