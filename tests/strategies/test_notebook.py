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

forked, steps = fit("STRATEGY", 2, 4)
alone, alone_steps = fit("single_device", 1, 8)  # the same global batches of 8 on one process
assert steps == alone_steps == 16, (steps, alone_steps)
assert torch.allclose(forked, alone, atol=1e-6), (forked, alone)
print("notebook ok", forked.flatten().tolist())
"""


@pytest.mark.parametrize("strategy", ["ddp_notebook", "ddp_fork"])
def test_a_module_defined_in_main_trains_on_two_forked_ranks_as_on_one_process(strategy):
    done = run_python(["-c", CELLS.replace("STRATEGY", strategy)], timeout=100, env=launch_free_env())
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "notebook ok" in done.stdout


def test_ddp_spawn_of_a_class_from_an_interactive_session_names_ddp_notebook():
    """The reason ddp_notebook exists: spawned processes cannot import a class defined in the __main__ of a
    notebook or `python -c`; instead of their raw `Can't get attribute 'Line' on <module '__main__'>`, one error
    before any process starts, naming the fix."""
    done = run_python(["-c", CELLS.replace("STRATEGY", "ddp_spawn")], timeout=100, env=launch_free_env())
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
