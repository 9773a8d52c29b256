"""``trainer.fit(torch.compile(model))``, as in Lightning: the module inside runs (hooks, ``self.log`` and
checkpoints see it), its steps compiled with the same settings. Two-process DDP: the ``compiled`` scenario of the
shared DDP launch (conftest ``core_ddp``, scripts/core_ddp_runs.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tandem
from helpers import TinyModule, loader, max_abs_diff, quiet_trainer
from tandem.strategies import DataParallelStrategy
from tandem.utilities.exceptions import TandemConfigError, TandemUserCodeError, TandemWarning


def weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class Graphs:
    """A ``torch.compile`` backend that runs each captured graph eagerly and keeps it (what was compiled)."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list) -> object:
        self.graphs.append(graph)
        return graph.forward


class Seen(tandem.Callback):
    """The module the hooks receive, and what ``trainer.training_module`` is, at each training batch."""

    def __init__(self) -> None:
        self.modules: list[object] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.modules.append((pl_module, trainer.training_module))


class Predicting(TinyModule):
    def predict_step(self, batch, batch_idx):
        return self(batch[0]).softmax(-1)


def test_a_compiled_fit_trains_as_an_eager_fit_with_inductor():
    """Same seed, same data: torch.compile's default backend (inductor, C++ kernels on the CPU) ends within float
    tolerance of the eager run, and the module the hooks see is the plain module."""
    results = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        model = TinyModule(lr=0.1)
        seen = Seen()
        trainer = quiet_trainer(max_steps=4, limit_val_batches=0, callbacks=[seen])
        trainer.fit(torch.compile(model) if compiled else model, loader())
        assert all(hooked is model and training is model for hooked, training in seen.modules)
        results[compiled] = (weights(model), float(trainer.callback_metrics["train_loss"]))
    assert max_abs_diff(results[False][0], results[True][0]) < 1e-5
    assert results[True][1] == pytest.approx(results[False][1], abs=1e-5)


def test_the_steps_run_compiled_and_self_log_runs_outside_the_graphs():
    """training_step / validation_step / test_step / predict_step each run as compiled graphs (the module's layers
    inside them); ``self.log`` is called outside them, so three epochs compile nothing after the first."""
    backend = Graphs()
    torch.manual_seed(0)
    model = Predicting()
    graphs_after_epoch: list[int] = []

    class Count(tandem.Callback):
        def on_train_epoch_end(self, trainer, pl_module) -> None:
            graphs_after_epoch.append(len(backend.graphs))

    compiled = torch.compile(model, backend=backend)
    trainer = quiet_trainer(max_epochs=3, callbacks=[Count()])
    trainer.fit(compiled, loader(), loader(n=32))
    assert graphs_after_epoch[0] > 0 and graphs_after_epoch[-1] == graphs_after_epoch[0]
    assert {"train_loss", "val_loss", "val_acc"} <= set(trainer.callback_metrics)
    x, y = loader(n=32).dataset.tensors
    with torch.no_grad():
        eager_loss = float(torch.nn.functional.cross_entropy(model(x), y))
    assert float(trainer.callback_metrics["val_loss"]) == pytest.approx(eager_loss, abs=1e-5)

    before = len(backend.graphs)
    trainer.test(compiled, loader(n=32), verbose=False)
    predictions = trainer.predict(compiled, loader(n=32))
    assert len(backend.graphs) > before  # test_step and predict_step were compiled too
    with torch.no_grad():
        expected = model(x).softmax(-1)
    torch.testing.assert_close(torch.cat(predictions), expected)
    assert trainer.training_module is model
    assert trainer.model is not compiled


def test_checkpoints_of_a_compiled_fit_have_plain_names_and_load_both_ways(tmp_path):
    """No ``_orig_mod.`` in a compiled fit's checkpoint: it loads into an eager module; an eager fit's checkpoint
    loads into a compiled one (``ckpt_path``) with the same results."""
    torch.manual_seed(0)
    model = TinyModule()
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(torch.compile(model, backend="aot_eager"), loader())
    trainer.save_checkpoint(tmp_path / "compiled.ckpt")
    state = torch.load(tmp_path / "compiled.ckpt", weights_only=False)["state_dict"]
    assert set(state) == set(TinyModule().state_dict())
    eager = TinyModule()
    eager.load_state_dict(state)  # strict
    assert max_abs_diff(weights(eager), weights(model)) == 0

    torch.manual_seed(1)
    trained = TinyModule()
    eager_trainer = quiet_trainer(max_epochs=1)
    eager_trainer.fit(trained, loader())
    eager_trainer.save_checkpoint(tmp_path / "eager.ckpt")
    expected = eager_trainer.validate(trained, loader(n=32), verbose=False)
    fresh = TinyModule()
    got = quiet_trainer().validate(
        torch.compile(fresh, backend="aot_eager"), loader(n=32), ckpt_path=tmp_path / "eager.ckpt", verbose=False
    )
    assert got[0] == pytest.approx(expected[0], abs=1e-6)
    assert max_abs_diff(weights(fresh), weights(trained)) == 0


def test_validate_without_a_model_after_a_compiled_fit_runs_compiled():
    backend = Graphs()
    model = TinyModule()
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(torch.compile(model, backend=backend), loader())  # no validation data
    before = len(backend.graphs)
    trainer.validate(dataloaders=loader(n=32), verbose=False)
    assert len(backend.graphs) > before


def test_strategy_dp_refuses_a_compiled_module():
    with pytest.warns(TandemWarning, match="DataParallelStrategy on CPU devices"):
        trainer = quiet_trainer(strategy=DataParallelStrategy(devices=["cpu", "cpu"]), max_steps=1)
    with pytest.raises(TandemConfigError, match=r"torch.compile'd module with strategy='dp'.*Use strategy='ddp'"):
        trainer.fit(torch.compile(TinyModule(), backend="aot_eager"), loader())


def test_a_compiled_plain_module_is_named_as_such():
    with pytest.raises(
        TandemUserCodeError, match=r"TrainingModule \(or torch.compile of one\), got torch.compile\(Linear\)"
    ):
        quiet_trainer().fit(torch.compile(nn.Linear(8, 3), backend="aot_eager"), loader())


def test_a_compiled_ddp_fit_trains_as_the_eager_ddp_fit(core_ddp):
    """Two gloo ranks (the shared launch's ``compiled`` scenario, backend aot_eager): the DDP module compiled
    around the module ends where the eager DDP fit does, on every rank, with the same logged values."""
    for rank in core_ddp["compiled"]:
        assert rank["graphs"] >= 2  # the training step (through DDP) and the validation step
        assert max_abs_diff(rank["eager"]["final"], rank["compiled"]["final"]) < 1e-6
        assert rank["compiled"]["metrics"] == pytest.approx(rank["eager"]["metrics"], abs=1e-6)
        assert rank["compiled"]["keys"] == rank["eager"]["keys"] == ["net.bias", "net.weight"]
    assert max_abs_diff(core_ddp["compiled"][0]["compiled"]["final"], core_ddp["compiled"][1]["compiled"]["final"]) == 0
