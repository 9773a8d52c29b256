"""The batch plan: "step on this batch?" and "log on this batch?" are decided once, at the top of each batch,
and every per-step logger (self.log, LearningRateMonitor, ThroughputMonitor) follows it."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem
from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import Callback, LearningRateMonitor, ThroughputMonitor
from tandem.loggers.logger import Logger
from tandem.utilities.exceptions import TandemWarning


class StepRecorder(Logger):
    """Records the logger step of every logged name."""

    def __init__(self, save_dir: str) -> None:
        super().__init__(save_dir)
        self.steps: dict[str, list[int]] = {}

    def log_metrics(self, metrics, step):
        for name in metrics:
            self.steps.setdefault(name, []).append(step)

    def log_hyperparams(self, params):
        pass


class TwoOptimizers(tandem.TrainingModule):
    """A GAN-shaped module: two optimizers, each stepping on every batch (two global steps per batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.a, self.b = nn.Linear(4, 1), nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        for optimizer, layer in zip(self.optimizers(), (self.a, self.b)):
            loss = layer(x).pow(2).mean()
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
        self.log("loss", loss)

    def configure_optimizers(self):
        opt_a = torch.optim.SGD(self.a.parameters(), lr=0.1)
        opt_b = torch.optim.Adam(self.b.parameters(), lr=0.01)
        return [opt_a, opt_b]


def test_with_two_optimizers_stepping_per_batch_every_per_step_value_lands_on_the_same_steps(tmp_path):
    recorder = StepRecorder(str(tmp_path))
    trainer = quiet_trainer(
        max_epochs=1,
        log_every_n_steps=2,
        logger=recorder,
        callbacks=[LearningRateMonitor(logging_interval="step"), ThroughputMonitor(batch_size_fn=len)],
    )
    data = DataLoader(TensorDataset(torch.randn(44, 4)), batch_size=4)  # 11 batches, 22 optimizer steps
    trainer.fit(TwoOptimizers(), data)
    assert trainer.global_step == 22
    logged = set(recorder.steps["loss"])
    # every second batch publishes, at Lightning's step (the loggers' step counts the batches stepped before it)
    assert logged == {1, 3, 5, 7, 9}
    assert set(recorder.steps["throughput/samples_per_sec"]) == logged
    # the learning rates are logged at the start of each publishing batch, on its row (Lightning's)
    assert set(recorder.steps["lr-SGD"]) == logged
    assert set(recorder.steps["lr-Adam"]) == logged


def test_the_plan_is_public_and_follows_accumulation():
    seen: list[tuple[int, bool, bool]] = []

    class Watch(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen.append((batch_idx, trainer.is_stepping_batch, trainer.is_log_step))

    trainer = quiet_trainer(max_epochs=1, accumulate_grad_batches=2, log_every_n_steps=2, callbacks=[Watch()])
    trainer.fit(TinyModule(), loader(80, batch_size=16))  # 5 batches: steps after batches 1, 3 and 4 (the last)
    assert seen == [
        (0, False, False),
        (1, True, False),
        (2, False, False),
        (3, True, True),  # the second stepping batch publishes
        (4, True, False),  # the epoch's last batch steps its short window
    ]
    assert trainer.global_step == 3


def test_a_batch_without_a_loss_still_steps_and_publishes_as_lightning():
    seen: list[tuple[bool, bool]] = []

    class SkipAll(TinyModule):
        def training_step(self, batch, batch_idx):
            return None  # every batch skipped

    class Watch(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append((trainer.is_stepping_batch, trainer.is_log_step))

    trainer = quiet_trainer(max_epochs=1, log_every_n_steps=1, callbacks=[Watch()])
    with pytest.warns(TandemWarning, match=r"`training_step` returned `None`"):
        trainer.fit(SkipAll(), loader(32, batch_size=16))
    assert seen == [(True, True), (True, True)]  # Lightning takes and counts the step (nothing to update)
    assert trainer.global_step == 2


def _depth_between(frame: Any, outer_name: str, outer_file: str) -> int:
    """Frames from ``frame`` (exclusive) up to the first frame of ``outer_name`` in ``outer_file`` (inclusive)."""
    depth = 0
    while frame is not None:
        depth += 1
        if frame.f_code.co_name == outer_name and frame.f_code.co_filename.endswith(outer_file):
            return depth
        frame = frame.f_back
    raise AssertionError(f"{outer_name} is not on the stack")


def test_few_frames_from_fit_to_training_step():
    depths = []

    class Measure(TinyModule):
        def training_step(self, batch, batch_idx):
            depths.append(_depth_between(sys._getframe(1), "fit", "trainer/trainer.py"))
            return super().training_step(batch, batch_idx)

    quiet_trainer(max_steps=1).fit(Measure(), loader(16))
    # fit, _launch, _run_stage, FitLoop.run (the hang watch's place, once per fit), FitLoop._run, _run_epoch,
    # _run_batch, Optimization.run, run_step
    assert depths == [9]


def test_a_manual_step_reaches_torch_through_at_most_four_tandem_frames():
    depths = []

    class Probe(torch.optim.SGD):
        def step(self, closure=None):
            frame, tandem_frames = sys._getframe(1), 0
            while frame is not None and "test_batch_plan" not in frame.f_code.co_filename:
                tandem_frames += "/tandem/" in frame.f_code.co_filename
                frame = frame.f_back
            depths.append(tandem_frames)
            return super().step(closure)

    class Manual(TinyModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(F.cross_entropy(self(batch[0]), batch[1]))
            optimizer.step()

        def configure_optimizers(self):
            return Probe(self.parameters(), lr=0.1)

    quiet_trainer(max_steps=1).fit(Manual(), loader(16))
    assert depths and depths[0] <= 4  # TrainingOptimizer.step, ManualOptimization.step, strategy, precision
