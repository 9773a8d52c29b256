"""strategy="ddp_notebook" / "ddp_fork": ranks forked per stage, so classes defined in ``__main__`` (a notebook's
cells) reach them, which ``ddp_spawn`` cannot do; refused when CUDA is already initialised in the parent."""

from __future__ import annotations

import pytest
import torch

import tandem
from helpers import launch_free_env, run_python
from tandem.utilities.exceptions import TandemConfigError

pytestmark = pytest.mark.timeout(120)

# What a notebook's cells hold: the module class lives in __main__, which a spawned process cannot import.
CELLS = """
import torch, tandem
from torch.utils.data import DataLoader, TensorDataset

class Line(tandem.TrainingModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

def fit(strategy, devices, batch_size):
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=batch_size)
    module = Line()
    trainer = tandem.Trainer(strategy=strategy, accelerator="cpu", devices=devices, max_epochs=2, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             data_order="global")  # the order one process draws too
    trainer.fit(module, data)
    return module.net.weight.detach().clone(), trainer.global_step

alone, alone_steps = None, None
for strategy in ("ddp_notebook", "ddp_fork"):  # one cell after the other, in one session
    forked, steps = fit(strategy, 2, 4)
    if alone is None:
        alone, alone_steps = fit("single_device", 1, 8)  # the same global batches of 8 on one process
    assert steps == alone_steps == 16, (strategy, steps, alone_steps)
    assert torch.allclose(forked, alone, atol=1e-6), (strategy, forked, alone)
    print(f"{strategy} ok", forked.flatten().tolist(), flush=True)
fit("ddp_spawn", 2, 4)  # the last cell: refused, and the session ends with the error
"""


@pytest.fixture(scope="module")
def session():
    """One interactive session (``python -c``) running the cells: a fit under ddp_notebook, then one under
    ddp_fork, each against one process, then ddp_spawn. One interpreter for the three (each costs seconds)."""
    return run_python(["-c", CELLS], timeout=200, env=launch_free_env())


@pytest.mark.parametrize("strategy", ["ddp_notebook", "ddp_fork"])
def test_a_module_defined_in_main_trains_on_two_forked_ranks_as_on_one_process(session, strategy):
    assert f"{strategy} ok" in session.stdout, session.stdout[-2000:] + session.stderr[-3000:]


def test_ddp_spawn_of_a_class_from_an_interactive_session_names_ddp_notebook(session):
    """The reason ddp_notebook exists: spawned processes cannot import a class defined in the __main__ of a
    notebook or `python -c`; instead of their raw `Can't get attribute 'Line' on <module '__main__'>`, one error
    before any process starts, naming the fix."""
    done = session
    assert "ddp_fork ok" in done.stdout, done.stderr[-3000:]  # the cells before it ran: the error is this one's
    assert done.returncode != 0
    assert "TandemConfigError: strategy='ddp_spawn' starts fresh processes" in done.stderr, done.stderr[-2000:]
    assert "Line is defined in this interactive session" in done.stderr and "ddp_notebook" in done.stderr
    assert "Can't get attribute" not in done.stderr


def test_ddp_notebook_refuses_when_cuda_is_initialised_in_the_parent(monkeypatch, tmp_path):
    from helpers import TinyModule, clear_launch_variables, loader

    clear_launch_variables(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    trainer = tandem.Trainer(
        strategy="ddp_notebook", accelerator="cpu", devices=2, max_epochs=1, logger=False, default_root_dir=tmp_path
    )
    with pytest.raises(TandemConfigError, match="CUDA is already initialised"):
        trainer.fit(TinyModule(), loader(16))
