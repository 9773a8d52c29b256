"""LearningRateFinder: the range test at fit start, then the fit from the same state with the rate found."""

from __future__ import annotations

import torch

from helpers import Regression, quiet_trainer
from tandem.callbacks import Callback, LearningRateFinder


class _Watch(Callback):
    """The weights and learning rate the fit's first batch trains with, and every batch's global step."""

    def __init__(self):
        self.first = None
        self.steps = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.first is None:
            weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
            self.first = (weights, trainer.optimizers[0].param_groups[0]["lr"])
        self.steps.append(trainer.global_step)


def test_the_search_runs_at_fit_start_and_the_fit_trains_from_the_same_state_with_its_rate(tmp_path):
    torch.manual_seed(0)
    model = Regression(lr=0.01)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    finder, watch = LearningRateFinder(num_training_steps=60), _Watch()
    trainer = quiet_trainer(max_epochs=4, callbacks=[finder, watch], default_root_dir=tmp_path)
    trainer.fit(model)

    suggestion = finder.optimal_lr.suggestion()
    assert finder.lr_finder is finder.optimal_lr and len(finder.lr_finder.results["lr"]) > 20
    assert suggestion is not None and model.hparams.lr == suggestion
    weights, lr = watch.first
    assert lr == suggestion  # the fit's optimizer got it, not only the attribute
    assert all(torch.equal(weights[k], initial[k]) for k in initial)  # the search's training was put back
    assert watch.steps == list(range(64)) and trainer.global_step == 64  # the other callbacks saw no search step


class _EveryEpoch(LearningRateFinder):
    """Lightning's fine-tuning example: search at the start of chosen epochs instead of the fit's."""

    def __init__(self, milestones, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.milestones, self.found = milestones, []

    def on_fit_start(self, *args, **kwargs):
        return

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch in self.milestones:
            self.lr_find(trainer, pl_module)
            self.found.append((trainer.current_epoch, trainer.global_step, self.optimal_lr.suggestion()))


def test_a_search_at_an_epoch_start_leaves_the_fit_where_it_was(tmp_path):
    torch.manual_seed(0)
    model = Regression(lr=0.01)
    finder, watch = _EveryEpoch((1,), num_training_steps=30), _Watch()
    trainer = quiet_trainer(max_epochs=2, callbacks=[finder, watch], default_root_dir=tmp_path)
    trainer.fit(model)
    assert [(epoch, step) for epoch, step, _ in finder.found] == [(1, 16)]
    assert watch.steps == list(range(32)) and trainer.global_step == 32 and trainer.current_epoch == 2
    assert model.hparams.lr == finder.found[0][2]
