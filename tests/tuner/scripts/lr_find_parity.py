"""The learning-rate search of one tiny program, written so that it runs unchanged under Lightning and under
tandem; ``tests/tuner/test_lr_finder.py`` compares tandem's results with the numbers this script printed under
Lightning 2.6.6 (issue 29, item 4).

The program: an MLP (4 -> 16 -> 1, tanh) regressing a seeded linear target plus noise, 200 samples in batches of 16
(13 batches an epoch, read in order: ``shuffle=False``; the search crosses epochs), plain SGD, ``Tuner(trainer).lr_find(model,
num_training=50)``. Every run starts from ``torch.manual_seed(0)``.

Run it (from the repository root):

    /tmp/lvenv/bin/python tests/tuner/scripts/lr_find_parity.py --lightning   # Lightning's numbers, as JSON
    .venv/bin/python tests/tuner/scripts/lr_find_parity.py                    # tandem's

Its ``"curve"`` entry is the suggestion rule alone, on the hand-made loss curve :data:`CURVE` (no training).
This file imports Lightning only under ``--lightning``; the tests load it without.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: what each search is asked: name -> keyword arguments of ``Tuner.lr_find``
SEARCHES: dict[str, dict[str, Any]] = {
    "exponential": dict(num_training=50),
    "linear": dict(num_training=50, min_lr=1e-3, max_lr=2.0, mode="linear", update_attr=False),
}

#: a hand-made range test of 30 steps, as a notebook shows it: a flat start with a wiggle among the tiny rates, the
#: real descent near 1e-2 .. 1e-1, a NaN, then the blow-up
CURVE_LRS = [1e-6 * 10 ** (k / 5) for k in range(30)]
CURVE_LOSSES = [2.30, 2.31, 2.30, 2.30, 2.29, 2.30, 2.30, 2.30, 2.30, 2.30, 2.30, 2.30, 2.32, 2.28] + [
    2.29,
    2.28,
    2.26,
    2.22,
    2.15,
    2.02,
    1.80,
    float("nan"),
    1.21,
    0.95,
    0.82,
    0.80,
    0.85,
    1.10,
    2.40,
    9.00,
]
#: the ``suggestion`` calls made on it: (skip_begin, skip_end)
CURVE_CALLS = [(10, 1), (0, 1), (14, 1), (5, 3), (28, 1)]

#: raw losses fed to the search's recorder step by step (no training; None: ``training_step`` returned no loss),
#: with ``early_stop_threshold=4``: a blow-up, a NaN, an inf, and a first step without a loss
RAW_LOSSES = {
    "blow_up": [2.0, 1.5, 1.2, 1.0, 0.9, 3.0, 30.0, 300.0, 3000.0, 1.0],
    "nan": [2.0, 1.0, float("nan"), 0.5, 1e6, 1.0],
    "inf": [2.0, 1.0, float("inf"), 1.0],
    "no_loss_first": [None, 2.0, 1.0, 1.0],
}


def data() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 4, generator=g)
    y = x @ torch.tensor([[1.5], [-2.0], [0.5], [1.0]]) + 0.1 * torch.randn(200, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=16, shuffle=False)


def module_class(base: type) -> type:
    """The user's module, on ``base`` (``LightningModule`` or ``TrainingModule``)."""

    class Regressor(base):
        def __init__(self, lr: float = 0.01) -> None:
            super().__init__()
            self.lr = lr
            self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    return Regressor


def record(losses: list[float | None], lightning: bool = False) -> list[float]:
    """The smoothed losses the search's recorder keeps for raw ``losses``, one step each, until it stops the search;
    its trainer is a stand-in with the attributes the recorder reads."""
    from types import SimpleNamespace

    stop = SimpleNamespace(asked=False)
    strategy = SimpleNamespace(broadcast=lambda obj: obj)
    if lightning:
        from lightning.pytorch.tuner.lr_finder import _LRCallback

        recorder = _LRCallback(len(losses), early_stop_threshold=4.0)
        scheduler = SimpleNamespace(lr=[0.1])
        trainer = SimpleNamespace(
            fit_loop=SimpleNamespace(batch_idx=0),
            accumulate_grad_batches=1,
            lr_scheduler_configs=[SimpleNamespace(scheduler=scheduler)],
            strategy=strategy,
            should_stop=False,
        )
    else:
        from tandem.callbacks.lr_finder import _Diverged, _LRRecorder

        recorder = _LRRecorder([0.1] * len(losses), early_stop_threshold=4.0)
        optimizer = SimpleNamespace(param_groups=[{"lr": 0.0}])
        trainer = SimpleNamespace(is_stepping_batch=True, optimizers=[optimizer], strategy=strategy)
    for step, loss in enumerate(losses, start=1):
        trainer.global_step = step  # after the step's optimizer step
        outputs = {} if loss is None else {"loss": torch.tensor(loss, dtype=torch.float64)}
        recorder.on_train_batch_start(trainer, None, None, step - 1)
        if lightning:
            recorder.on_train_batch_end(trainer, None, outputs, None, step - 1)
            stop.asked = trainer.should_stop
        else:
            try:
                recorder.on_train_batch_end(trainer, None, outputs, None, step - 1)
            except _Diverged:
                stop.asked = True
        if stop.asked:
            break
    return recorder.losses


def searches(lightning: bool = False) -> dict[str, Any]:
    """Every search of :data:`SEARCHES` on the program: suggestion, the module's ``lr`` after it, rates, losses."""
    if lightning:
        import lightning.pytorch as framework
        from lightning.pytorch.tuner import Tuner

        base = framework.LightningModule
    else:
        import tandem as framework
        from tandem.tuner import Tuner

        base = framework.TrainingModule
    out: dict[str, Any] = {}
    for name, kwargs in SEARCHES.items():
        torch.manual_seed(0)
        model = module_class(base)()
        trainer = framework.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=10,  # Lightning's search also stops at max_epochs
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        finder = Tuner(trainer).lr_find(model, train_dataloaders=data(), **kwargs)
        out[name] = {"suggestion": finder.suggestion(), "model_lr": model.lr, **finder.results}
    return out


def curve_suggestions(lightning: bool = False) -> dict[str, float | None]:
    """The suggestion rule alone on :data:`CURVE_LOSSES`, for each of :data:`CURVE_CALLS` ("begin,end")."""
    if lightning:
        from lightning.pytorch.tuner.lr_finder import _LRFinder as Finder
    else:
        from tandem.tuner import LRFinder as Finder
    curve = Finder("exponential", CURVE_LRS[0], CURVE_LRS[-1], len(CURVE_LRS))
    curve.results = {"lr": list(CURVE_LRS), "loss": list(CURVE_LOSSES)}
    return {f"{begin},{end}": curve.suggestion(begin, end) for begin, end in CURVE_CALLS}


def run(lightning: bool = False) -> dict[str, Any]:
    """Everything this script prints: the searches, the curve's suggestions and the recorder on
    :data:`RAW_LOSSES`."""
    out = searches(lightning)
    out["curve"] = curve_suggestions(lightning)
    out["recorded"] = {name: record(losses, lightning) for name, losses in RAW_LOSSES.items()}
    return out


def _json(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value


if __name__ == "__main__":
    print(json.dumps(_json(run(lightning="--lightning" in sys.argv)), indent=1))
