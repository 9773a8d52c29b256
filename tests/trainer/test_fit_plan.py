"""The per-fit plan (``BatchPlan``): composed when a fit starts from what is on, it leaves out the stages that are
off, and trains exactly as the full path (every stage on, ``FitLoop.compose_all``) does: the same weights, bit for
bit, and the same logged values, step by step, over a matrix of features."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tandem
from helpers import float16_mixed, loader, quiet_trainer
from tandem.callbacks import Callback
from tandem.loggers.logger import Logger
from tandem.trainer.loops import FitLoop

BATCH_HOOKS = (
    "on_train_batch_start",
    "on_train_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
)


class Recorder(Logger):
    """Every logged row: (step, {name: value})."""

    def __init__(self, save_dir: str) -> None:
        super().__init__(save_dir)
        self.rows: list[tuple[int, dict[str, float]]] = []

    def log_metrics(self, metrics, step):
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params):
        pass


class Matrix(tandem.TrainingModule):
    """A tiny classifier that keeps its weights as each batch found them (the weights step by step)."""

    manual = False

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 3)
        self.automatic_optimization = not self.manual
        self.seen: list[list[torch.Tensor]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append([p.detach().clone() for p in self.parameters()])
        x, y = batch
        loss = F.cross_entropy(self.b(torch.relu(self.a(x))), y)
        self.log("loss", loss)
        if not self.manual:
            return loss
        for optimizer in self.optimizers():  # two optimizers, each stepping every batch
            optimizer.zero_grad()
            self.manual_backward(F.cross_entropy(self.b(torch.relu(self.a(x))), y))
            optimizer.step()
        return None

    def configure_optimizers(self):
        if self.manual:
            return [torch.optim.SGD(self.a.parameters(), lr=0.1), torch.optim.Adam(self.b.parameters(), lr=0.01)]
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def _logs_hook(name: str):
    def hook(self, *args: Any) -> None:  # a value that depends on the state the hook sees
        if name != "on_train_batch_end":  # (self.log is not allowed everywhere; the others log)
            self.log(f"h/{name}", sum(float(p.detach().double().sum()) for p in self.parameters()))

    hook.__name__ = name
    return hook


class EveryBatchHook(Callback):
    """A callback overriding every batch hook (read-only: it sums what it sees)."""

    def __init__(self) -> None:
        self.total = 0.0

    def _see(self, pl_module) -> None:
        self.total += sum(float(p.detach().double().sum()) for p in pl_module.parameters())


for _name in BATCH_HOOKS:
    setattr(EveryBatchHook, _name, lambda self, trainer, pl_module, *args: self._see(pl_module))


CASES = {
    "plain": {},
    "hooks": {"hooks": BATCH_HOOKS},
    "batch_start_hook": {"hooks": ("on_train_batch_start",)},
    "step_hooks": {"hooks": ("on_before_optimizer_step", "on_before_zero_grad")},
    "callback_hooks": {"callback": True},
    "bf16_mixed": {"trainer": {"precision": "bf16-mixed"}},
    "64_true": {"trainer": {"precision": "64-true"}},
    "16_mixed_scaler_clip_hooks": {"trainer": {**float16_mixed(), "gradient_clip_val": 0.5}, "hooks": BATCH_HOOKS},
    "accumulate_clip": {"trainer": {"accumulate_grad_batches": 2, "gradient_clip_val": 0.5}},
    "accumulate_hooks": {"trainer": {"accumulate_grad_batches": 2}, "hooks": BATCH_HOOKS},
    "manual_two_optimizers": {"manual": True},
    "manual_hooks": {"manual": True, "hooks": BATCH_HOOKS},
    "rollback": {"trainer": {"on_nonfinite": "rollback"}},
    "rollback_accumulate": {"trainer": {"on_nonfinite": "rollback", "accumulate_grad_batches": 2}},
    "profiler": {"trainer": {"profiler": "simple"}},
    "everything": {
        "trainer": {
            "precision": "bf16-mixed",
            "accumulate_grad_batches": 2,
            "gradient_clip_val": 0.5,
            "on_nonfinite": "rollback",
            "profiler": "simple",
        },
        "hooks": BATCH_HOOKS,
        "callback": True,
    },
}


def _fit(case: dict[str, Any], tmp_path, full: bool, monkeypatch) -> tuple[Matrix, Recorder, Any]:
    monkeypatch.setattr(FitLoop, "compose_all", full)
    hooks = {name: _logs_hook(name) for name in case.get("hooks", ())}
    module = type("Case", (Matrix,), {"manual": case.get("manual", False), **hooks})()
    recorder = Recorder(str(tmp_path / ("full" if full else "plan")))
    callbacks = [EveryBatchHook()] if case.get("callback") else []
    trainer = quiet_trainer(
        max_epochs=1, logger=recorder, log_every_n_steps=1, callbacks=callbacks, **case.get("trainer", {})
    )
    trainer.fit(module, loader(n=48, batch_size=8))  # 6 batches
    return module, recorder, trainer


@pytest.mark.parametrize("name", list(CASES))
def test_the_composed_plan_trains_as_the_full_path_bit_for_bit(name, tmp_path, monkeypatch, capsys):
    case = CASES[name]
    plan_module, plan_log, plan_trainer = _fit(case, tmp_path, False, monkeypatch)
    full_module, full_log, full_trainer = _fit(case, tmp_path, True, monkeypatch)
    assert len(plan_module.seen) == len(full_module.seen) == 6
    for step, (ours, theirs) in enumerate(zip(plan_module.seen, full_module.seen)):
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs)), f"weights differ at batch {step}"
    assert all(torch.equal(a, b) for a, b in zip(plan_module.parameters(), full_module.parameters()))
    assert plan_log.rows == full_log.rows and len(plan_log.rows) >= 3
    assert plan_trainer.global_step == full_trainer.global_step > 0
    # the plan holds what the case turns on, and only that; the full path every stage
    on = set(BATCH_HOOKS) if case.get("callback") else set(case.get("hooks", ()))
    scaler = name.startswith("16_mixed")
    assert _flags(plan_trainer.fit_loop.plan) == {
        **{_FLAGS[hook]: hook in on for hook in BATCH_HOOKS},
        "unscale": scaler,
    }
    assert all(_flags(full_trainer.fit_loop.plan).values())


_FLAGS = {
    "on_train_batch_start": "batch_start",
    "on_train_batch_end": "batch_end",
    "on_before_backward": "before_backward",
    "on_after_backward": "after_backward",
    "on_before_optimizer_step": "before_optimizer_step",
    "on_before_zero_grad": "before_zero_grad",
}


def _flags(plan) -> dict[str, bool]:
    return {field: getattr(plan, field) for field in [*_FLAGS.values(), "unscale"]}


def test_what_is_off_is_not_in_the_plan_and_what_is_on_is(tmp_path, monkeypatch):
    module, _, trainer = _fit({}, tmp_path, False, monkeypatch)
    plan = trainer.fit_loop.plan
    assert plan.transfer is None and plan.follow is None and not plan.unscale  # CPU, full precision, one device
    assert not any(getattr(plan, field) for field in ("batch_start", "batch_end", "before_backward"))
    assert not any(getattr(plan, field) for field in ("after_backward", "before_optimizer_step", "before_zero_grad"))
    assert _flags(trainer.fit_loop.optimization.plan) == _flags(plan)  # its copy, without the fit loop's run

    _, _, trainer = _fit({"hooks": ("on_before_zero_grad",), "trainer": float16_mixed()}, tmp_path, False, monkeypatch)
    plan = trainer.fit_loop.plan
    assert plan.before_zero_grad and plan.unscale and not plan.batch_start


def test_self_log_in_a_compiled_training_step_breaks_no_graph_and_logs_as_eager(tmp_path, monkeypatch):
    from torch._dynamo.utils import counters

    def backend(graph, example_inputs):
        return graph.forward

    rows = {}
    for compiled in (False, True):
        torch._dynamo.reset()
        counters.clear()
        module = Matrix()
        recorder = Recorder(str(tmp_path / str(compiled)))
        trainer = quiet_trainer(max_steps=4, logger=recorder, log_every_n_steps=1)
        trainer.fit(torch.compile(module, backend=backend) if compiled else module, loader(n=48, batch_size=8))
        rows[compiled] = recorder.rows
        assert trainer.fit_loop.plan.deferred_logs == compiled
    assert not counters["graph_break"]  # the compiled run's: self.log is recorded in the graph, logged after it
    assert [step for step, _ in rows[True]] == [0, 1, 2, 3]
    for (_, eager), (_, compiled) in zip(rows[False], rows[True]):
        assert compiled == pytest.approx(eager, abs=1e-6)


def test_a_repeated_self_log_call_takes_the_short_way_only_while_nothing_but_the_value_changes():
    """A call like the name's previous one takes the short way; another batch_size (or a float for a tensor) is
    decided afresh. (Other arguments may not change within a hook: Lightning's error, test_logging.py.)"""

    class Varying(Matrix):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            value = torch.tensor(float(batch_idx))
            if batch_idx < 2:  # the same call twice: the second one repeats the first (weight 8, the batch's size)
                self.log("x", value, on_epoch=True, prog_bar=True)
            elif batch_idx < 5:  # another batch_size: decided afresh, and repeated from then on
                self.log("x", value, on_epoch=True, prog_bar=True, batch_size=2)
            else:  # a float: decided afresh
                self.log("x", float(batch_idx), on_epoch=True, prog_bar=True, batch_size=2)
            return loss

    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(Varying(), loader(n=48, batch_size=8))
    assert float(trainer.callback_metrics["x_step"]) == 5.0
    # (0 + 1) * 8 + (2 + 3 + 4 + 5) * 2 over 8 + 8 + 4 * 2: the batch_size each call gave, not the first call's
    assert float(trainer.callback_metrics["x_epoch"]) == 1.5
