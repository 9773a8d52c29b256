"""DataParallel: splitting, the weighted loss, log collection, predict order and the mistakes' messages.

Without CUDA these run dp's own code on CPU devices (``DataParallelStrategy(devices=["cpu"] * 4)``): the
same split / replicate / apply-in-threads / combine path as on GPUs, with CPU copies as replicas. The
GPU tests at the end compare dp on all visible GPUs with a single device.
"""

from __future__ import annotations

import copy
import warnings
from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from helpers import TinyModule, loader, make_data, quiet_trainer
from tandem.strategies import DataParallelStrategy, SingleDeviceStrategy
from tandem.strategies.data_parallel import combine_outputs, split_batch, split_sizes
from tandem.strategies.registry import resolve_strategy
from tandem.utilities.exceptions import TandemConfigError, TandemUserCodeError

pytestmark = pytest.mark.filterwarnings("ignore:DataParallelStrategy on CPU devices")

CPU = torch.device("cpu")


def cpu_dp(n: int = 4, parallel: bool = True) -> DataParallelStrategy:
    return DataParallelStrategy(devices=["cpu"] * n, parallel=parallel)


def ready(strategy, module):
    resolve_strategy(strategy, "cpu", len(strategy.parallel_devices), 1, "32-true")  # its own devices
    strategy.setup(module)
    return strategy


# ====================================================================== splitting
def test_split_sizes_are_balanced():
    assert split_sizes(10, 4) == [3, 3, 2, 2]  # torch's scatter would give 3, 3, 3, 1
    assert split_sizes(8, 4) == [2, 2, 2, 2]
    assert split_sizes(3, 4) == [1, 1, 1]
    assert split_sizes(1, 4) == [1]


Pair = namedtuple("Pair", "a b")


@dataclass
class Sample:
    image: torch.Tensor
    source: str


def test_split_batch_nested_collections():
    x = torch.arange(20.0).reshape(10, 2)
    batch = {
        "x": x,
        "pair": Pair(torch.arange(10), [torch.arange(10) * 2, "tag"]),
        "sample": Sample(torch.ones(10, 3), "camera"),
        "scale": 0.5,
        "none": None,
    }
    chunks, sizes = split_batch(batch, 4)
    assert sizes == [3, 3, 2, 2]
    assert [c["x"].shape[0] for c in chunks] == sizes
    assert torch.equal(torch.cat([c["x"] for c in chunks]), x)
    assert torch.equal(torch.cat([c["pair"].a for c in chunks]), torch.arange(10))
    assert torch.equal(torch.cat([c["pair"].b[0] for c in chunks]), torch.arange(10) * 2)
    for c in chunks:  # non-tensor leaves are copied to every chunk, containers keep their types
        assert isinstance(c["pair"], Pair) and isinstance(c["sample"], Sample)
        assert c["pair"].b[1] == "tag" and c["sample"].source == "camera"
        assert c["scale"] == 0.5 and c["none"] is None
    assert torch.equal(torch.cat([c["sample"].image for c in chunks]), torch.ones(10, 3))


def test_split_batch_names_what_cannot_be_split():
    class Graph:
        pass

    with pytest.raises(TandemUserCodeError, match=r"cannot split batch\['g'\]\[1\], a .*Graph"):
        split_batch({"x": torch.zeros(4), "g": [torch.zeros(4), Graph()]}, 2)
    with pytest.raises(TandemUserCodeError, match=r"batch\[1\], a 0-dim tensor"):
        split_batch((torch.zeros(4), torch.tensor(1.0)), 2)
    with pytest.raises(TandemUserCodeError, match=r"batch\[0\] has 4 rows but batch\[1\] has 3"):
        split_batch((torch.zeros(4), torch.zeros(3)), 2)
    with pytest.raises(TandemUserCodeError, match="holds none"):
        split_batch(["a", "b"], 2)


def test_combine_outputs_rules():
    sizes = [3, 3, 2, 2]
    losses = [torch.tensor(float(i)) for i in range(4)]
    expected = (0 * 3 + 1 * 3 + 2 * 2 + 3 * 2) / 10
    assert combine_outputs(losses, sizes, CPU).item() == pytest.approx(expected)
    preds = [torch.full((s, 2), float(i)) for i, s in enumerate(sizes)]
    out = combine_outputs([{"loss": lo, "preds": p, "k": 7} for lo, p in zip(losses, preds)], sizes, CPU)
    assert out["loss"].item() == pytest.approx(expected) and out["k"] == 7
    assert torch.equal(out["preds"], torch.cat(preds))
    per_replica = combine_outputs([torch.zeros(5)] * 4, sizes, CPU)  # not per sample: one row per replica
    assert per_replica.shape == (4, 5)
    assert combine_outputs([None, losses[1], None, losses[3]], sizes, CPU).item() == pytest.approx((3 + 6) / 5)
    assert combine_outputs([None] * 4, sizes, CPU) is None
    assert combine_outputs([(p, "a") for p in preds], sizes, CPU)[0].shape == (10, 2)


# ====================================================================== the weighted loss and its gradient
class Unlogged(TinyModule):
    """TinyModule without self.log: its steps run here outside a Trainer, where a logged value would be dropped."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)


def whole_batch_grads(module, batch):
    module.zero_grad()
    module.training_step(batch, 0).backward()
    return {n: p.grad.clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("parallel", [True, False], ids=["threads", "in_turn"])
def test_uneven_split_gradient_equals_whole_batch_gradient(parallel):
    torch.manual_seed(0)
    module = Unlogged()
    reference = copy.deepcopy(module)
    x, y = make_data(10)[:]
    strategy = ready(cpu_dp(4, parallel), module)
    loss = strategy.run_step("training_step", (x, y), 0)
    module.zero_grad()
    loss.backward()
    expected = whole_batch_grads(reference, (x, y))
    assert loss.item() == pytest.approx(reference.training_step((x, y), 0).item(), abs=1e-6)
    for name, p in module.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], atol=1e-6, rtol=0)


def fit_params(strategy, batch_size=10, steps=4, **kwargs):
    torch.manual_seed(0)
    module = TinyModule()
    trainer = quiet_trainer(strategy=strategy, max_steps=steps, **kwargs)
    trainer.fit(module, loader(64, batch_size=batch_size))
    return {k: v.detach().clone() for k, v in module.state_dict().items()}, trainer


def test_dp_training_matches_single_device():
    single, _ = fit_params(SingleDeviceStrategy("cpu"), steps=7)  # batches of 10 and a last one of 4
    dp, trainer = fit_params(cpu_dp(4), steps=7)
    assert trainer.global_step == 7
    for k in single:
        torch.testing.assert_close(dp[k], single[k], atol=1e-6, rtol=0)


# ====================================================================== self.log inside replicas
class LogsInSteps(TinyModule):
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("mean_x", x[:, 0].mean())  # the chunk's mean, combined weighted by chunk size
        self.log("count", float(len(x)), reduce_fx="sum")
        self.log("max_x", x[:, 1].max(), reduce_fx="max")
        self.log("min_x", x[:, 1].min(), reduce_fx="min")
        self.log("device_count", 1.0, reduce_fx="sum", prog_bar=True)
        return loss


def test_logs_from_replicas_are_combined_once():
    x, y = make_data(10)[:]
    module = LogsInSteps()
    trainer = quiet_trainer(strategy=cpu_dp(4), max_steps=1)
    trainer.fit(module, DataLoader(list(zip(x, y)), batch_size=10))
    m = trainer.callback_metrics
    assert m["mean_x"].item() == pytest.approx(x[:, 0].mean().item(), abs=1e-6)
    assert m["count"].item() == 10
    assert m["max_x"].item() == pytest.approx(x[:, 1].max().item())
    assert m["min_x"].item() == pytest.approx(x[:, 1].min().item())
    assert m["device_count"].item() == 4  # one value per replica, summed
    assert trainer.progress_bar_metrics["device_count"] == 4  # a number, as Lightning's


def test_validation_epoch_metrics_match_single_device():
    def validate(strategy):
        torch.manual_seed(0)
        module = TinyModule()
        val = loader(64, batch_size=10)  # 6 batches of 10 (split 3, 3, 2, 2) and one of 4
        return quiet_trainer(strategy=strategy).validate(module, val)[0]

    single, dp = validate(SingleDeviceStrategy("cpu")), validate(cpu_dp(4))
    assert single.keys() == dp.keys() == {"val_loss", "val_acc"}
    for k in single:
        assert dp[k] == pytest.approx(single[k], abs=1e-6)


def test_predict_outputs_are_concatenated_in_order():
    torch.manual_seed(0)
    module = TinyModule()
    data = loader(23, batch_size=10)  # 10, 10, 3: the last batch is smaller than the device count
    single = quiet_trainer().predict(module, data)
    with pytest.warns(UserWarning, match="only 3 of them work"):
        dp = quiet_trainer(strategy=cpu_dp(4)).predict(module, data)
    assert [p.shape[0] for p in dp] == [10, 10, 3]
    for a, b in zip(dp, single):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_dict_outputs_reach_batch_end_hooks_combined():
    seen = []

    class DictOut(TinyModule):
        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self(x)
            return {"loss": F.cross_entropy(logits, y), "preds": logits.argmax(1), "target": y}

        def on_train_batch_end(self, outputs, batch, batch_idx):
            seen.append(outputs)

    x, y = make_data(10)[:]
    quiet_trainer(strategy=cpu_dp(4), max_steps=1).fit(DictOut(), DataLoader(list(zip(x, y)), batch_size=10))
    (out,) = seen
    assert out["loss"].ndim == 0 and not out["loss"].requires_grad
    assert torch.equal(out["target"], y) and out["preds"].shape == (10,)


# ====================================================================== the classic mistakes
def test_dp_without_cuda_suggests_ddp():
    with pytest.raises(TandemConfigError, match=r"strategy='dp' needs CUDA devices; on CPU use strategy='ddp'"):
        quiet_trainer(strategy="dp", accelerator="cpu")


def test_dp_with_one_device_runs_as_single_device():
    with pytest.warns(UserWarning, match="runs as a single device"):
        strategy = DataParallelStrategy(devices=["cpu"])
        single, _ = fit_params(SingleDeviceStrategy("cpu"), steps=3)
        dp, _ = fit_params(strategy, steps=3)
    for k in single:
        torch.testing.assert_close(dp[k], single[k], atol=1e-6, rtol=0)


def test_batch_smaller_than_devices_warns_once():
    x, y = make_data(6)[:]
    with pytest.warns(UserWarning, match="batch of 3 samples was split across 4 devices: only 3") as record:
        quiet_trainer(strategy=cpu_dp(4), max_steps=2).fit(TinyModule(), DataLoader(list(zip(x, y)), batch_size=3))
    assert sum("only 3 of them" in str(w.message) for w in record) == 1


class SGDModule(TinyModule):
    """Subclasses with their own __init__ (TinyModule's hparams would not see its arguments)."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class WithBatchNorm(SGDModule):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x):
        return self.net(self.norm(x))


class WithCounter(SGDModule):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def training_step(self, batch, batch_idx):
        self.calls += 1
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize(("module_cls", "name"), [(WithBatchNorm, "norm.num_batches_tracked"), (WithCounter, "calls")])
def test_module_changing_its_buffers_warns_that_replica_changes_are_lost(module_cls, name):
    module = module_cls()
    with pytest.warns(UserWarning, match=rf"changed its own buffers or parameters \({name}.*other 3 device\(s\)"):
        quiet_trainer(strategy=cpu_dp(4), max_steps=2).fit(module, loader(16, batch_size=8))
    if module_cls is WithCounter:
        assert module.calls.item() == 2  # only the first replica's in-place change reached the module


def test_tensor_created_on_the_wrong_device_is_explained():
    class WrongDevice(TinyModule):
        def training_step(self, batch, batch_idx):
            x, y = batch
            x = x + torch.zeros(1, device="meta")  # on GPUs: the classic x.cuda() / device="cuda:0"
            return F.cross_entropy(self(x), y)

    with pytest.raises(TandemUserCodeError, match=r"(?s)mixed tensors on different devices.*x\.device"):
        quiet_trainer(strategy=cpu_dp(2), max_steps=1).fit(WrongDevice(), loader(8, batch_size=8))


def test_other_errors_in_a_replica_keep_their_type():
    class Fails(TinyModule):
        def training_step(self, batch, batch_idx):
            if len(batch[0]) == 2:
                raise ValueError("bad chunk")
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match="bad chunk"):
        quiet_trainer(strategy=cpu_dp(4), max_steps=1).fit(Fails(), loader(10, batch_size=10))


def test_metric_updated_in_a_replica_is_refused_with_the_recipe():
    from torchmetrics.classification import MulticlassAccuracy

    class WithMetric(TinyModule):
        def __init__(self):
            super().__init__()
            self.acc = MulticlassAccuracy(num_classes=3)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.acc(self(x), y)
            self.log("val_acc", self.acc)

    with pytest.raises(TandemUserCodeError, match=r"Metric 'acc'.*on_validation_batch_end"):
        quiet_trainer(strategy=cpu_dp(2)).validate(WithMetric(), loader(8, batch_size=8))


def test_metric_updated_from_gathered_outputs_works():
    from torchmetrics.classification import MulticlassAccuracy

    class Recipe(TinyModule):
        def __init__(self):
            super().__init__()
            self.acc = MulticlassAccuracy(num_classes=3, average="micro")

        def validation_step(self, batch, batch_idx):
            x, y = batch
            return {"preds": self(x), "target": y}

        def on_validation_batch_end(self, outputs, batch, batch_idx):
            self.acc(outputs["preds"], outputs["target"])
            self.log("val_acc", self.acc)

    torch.manual_seed(0)
    module = Recipe()
    data = loader(64, batch_size=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp = quiet_trainer(strategy=cpu_dp(4)).validate(module, data)[0]["val_acc"]
        single = quiet_trainer().validate(module, data)[0]["val_acc"]
    assert dp == pytest.approx(single)


# ====================================================================== GPUs
def _gpu_params(strategy, steps=5, precision="64-true"):
    torch.manual_seed(0)
    module = TinyModule()
    trainer = quiet_trainer(strategy=strategy, accelerator="cuda", precision=precision, max_steps=steps)
    trainer.fit(module, loader(64, batch_size=7))  # 7 per batch: an uneven split on any number of GPUs > 1
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


@pytest.mark.gpu
def test_dp_on_all_gpus_matches_single_device():
    n = torch.cuda.device_count()
    single = _gpu_params(SingleDeviceStrategy("cuda:0"), steps=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp = _gpu_params(DataParallelStrategy(devices=list(range(n))), steps=7)
    for k in single:
        torch.testing.assert_close(dp[k], single[k], atol=1e-6, rtol=0)


@pytest.mark.gpu
def test_dp_on_one_gpu_is_single_device():
    with pytest.warns(UserWarning, match="runs as a single device"):
        trainer = quiet_trainer(strategy="dp", accelerator="cuda", devices=1, max_steps=1)
    assert trainer.strategy.root_device == torch.device("cuda", 0)
    single = _gpu_params(SingleDeviceStrategy("cuda:0"), steps=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp = _gpu_params(DataParallelStrategy(devices=[0]), steps=3)
    for k in single:
        torch.testing.assert_close(dp[k], single[k], atol=1e-12, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed"])
def test_dp_mixed_precision_on_all_gpus_trains(precision):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        params = _gpu_params(DataParallelStrategy(devices=list(range(torch.cuda.device_count()))), 4, precision)
    assert all(torch.isfinite(v.float()).all() for v in params.values())


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tensor_moved_to_the_first_gpu_in_a_replica_is_explained():
    class MovesInput(TinyModule):
        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self(x.to("cuda:0")), y)  # the replica on cuda:1 has its weights there

    trainer = quiet_trainer(strategy="dp", accelerator="cuda", devices=2, max_steps=1)
    with pytest.raises(TandemUserCodeError, match=r"(?s)mixed tensors on different devices.*cuda:1"):
        trainer.fit(MovesInput(), loader(8, batch_size=8))
