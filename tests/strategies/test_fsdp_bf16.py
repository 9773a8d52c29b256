"""FSDP in bfloat16 on one process: on the CPU over gloo, and on one CUDA device over nccl (marked ``gpu``:
skipped without CUDA, see conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem
from helpers import clear_launch_variables
from tandem.strategies import FSDPStrategy, SingleDeviceStrategy
from tandem.strategies.environments.machine import find_free_port
from tandem.utilities.exceptions import TandemWarning

pytestmark = pytest.mark.timeout(120)


class Net(tandem.TrainingModule):
    """Records the dtype the layers compute in, and the gradients' and parameters' dtypes at the step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        self.compute_dtypes: set[torch.dtype] = set()
        self.step_dtypes: set[tuple[torch.dtype, torch.dtype]] = set()
        self.batch_dtypes: set[torch.dtype] = set()
        self.losses: list[float] = []
        # FSDP gathers the layer's parameters in its own pre-forward hook, which runs before this one
        self.net[0].register_forward_pre_hook(lambda layer, args: self.compute_dtypes.add(layer.weight.dtype))

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.batch_dtypes.add(x.dtype)  # the batch reaches the step as the loader made it
        loss = F.cross_entropy(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def on_before_optimizer_step(self, optimizer):
        for p in self.parameters():
            self.step_dtypes.add((p.dtype, p.grad.dtype))  # the sharded fp32 copy and its fp32 gradient

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def _data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()), batch_size=32)


@pytest.mark.parametrize("accelerator", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_bf16_fsdp_trains_and_resumes_from_a_sharded_checkpoint(tmp_path, monkeypatch, accelerator):
    clear_launch_variables(monkeypatch)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(find_free_port()))
    options = dict(
        accelerator=accelerator,
        devices=1,
        precision="bf16-mixed",
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        strategy = FSDPStrategy(auto_wrap_policy={nn.Linear}, state_dict_type="sharded")
        trainer = tandem.Trainer(strategy=strategy, max_epochs=4, **options)
        model = Net()
        trainer.fit(model, _data())
        assert strategy.process_group_backend == {"cpu": "gloo", "cuda": "nccl"}[accelerator]
        assert strategy.root_device.type == accelerator
        assert model.compute_dtypes == {torch.bfloat16}
        assert model.batch_dtypes == {torch.float32}
        assert model.step_dtypes == {(torch.float32, torch.float32)}
        assert sum(model.losses[-8:]) < 0.5 * sum(model.losses[:8])  # it learns
        weights = {k: v.clone() for k, v in strategy.full_module_state_dict().items()}
        last = trainer.checkpoint_callback.best_model_path  # the default checkpoint: the last epoch's, sharded
        assert Path(last).parent == tmp_path / "checkpoints" and (Path(last) / "meta.pt").is_file()

        resumed_strategy = FSDPStrategy(auto_wrap_policy={nn.Linear}, state_dict_type="sharded")
        resumed = tandem.Trainer(strategy=resumed_strategy, max_epochs=4, **options)
        again = Net()
        with pytest.warns(TandemWarning, match="trained nothing: training is already at epoch 4"):
            resumed.fit(again, _data(), ckpt_path=last)  # nothing left to train: the weights are the checkpoint's
        restored = resumed_strategy.full_module_state_dict()
        assert restored.keys() == weights.keys()
        for name, value in weights.items():
            assert torch.equal(restored[name], value), name
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class Normed(tandem.TrainingModule):
    """A BatchNorm between two Linear layers: its running statistics are float32 buffers."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_batchnorm_trains_under_fsdp_mixed_precision_as_on_one_device(monkeypatch, precision):
    """FSDP's 16-bit parameters would meet BatchNorm's float32 statistics (a dtype error deep in torch): the
    BatchNorm layers keep float32 weights, as autocast does on one device, and train to the same weights."""
    clear_launch_variables(monkeypatch)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(find_free_port()))
    # the precision goes to the strategies: a Trainer's precision="16-mixed" on the CPU would become bf16-mixed
    options = dict(accelerator="cpu", devices=1, max_epochs=1, logger=False)
    options.update(enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    reference = Normed()
    tandem.Trainer(strategy=SingleDeviceStrategy("cpu", precision=precision), **options).fit(reference, _data())
    try:
        strategy = FSDPStrategy(auto_wrap_policy={nn.Linear}, precision=precision)
        tandem.Trainer(strategy=strategy, **options).fit(Normed(), _data())
        trained = strategy.full_module_state_dict()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    expected = reference.state_dict()
    assert trained.keys() == expected.keys()
    for name, value in expected.items():
        assert trained[name].dtype == value.dtype, name  # float32 weights and statistics, as on one device
        torch.testing.assert_close(trained[name], value, atol=1e-3, rtol=1e-3, msg=name)
    assert not torch.equal(trained["net.1.running_mean"], torch.zeros(32))  # the statistics were updated
