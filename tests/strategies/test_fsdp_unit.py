"""FSDPStrategy without processes: arguments, the clear errors raised before anything is sharded, meta
initialisation, precision policies and the checkpoint formats."""

from __future__ import annotations

import pytest
import torch
import torchmetrics
from torch import nn

import tandem
from helpers import clear_launch_variables
from tandem.strategies import FSDPStrategy
from tandem.strategies.fsdp_checkpoint import named_state, numbered_state
from tandem.strategies.registry import resolve_strategy
from tandem.utilities.atomic import replace_directory
from tandem.utilities.exceptions import CheckpointError, TandemConfigError, TandemUserCodeError

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    clear_launch_variables(monkeypatch)


def _strategy(**kwargs: object) -> FSDPStrategy:
    return resolve_strategy(FSDPStrategy(**kwargs), "cpu", 1, 1, "32-true")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def _mlp() -> nn.Module:
    return nn.Sequential(Block(), nn.ReLU(), Block())


# ---------------------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"auto_wrap_policy": {"Linear"}}, r"auto_wrap_policy=\{'Linear'\} must be a set of layer classes"),
        ({"auto_wrap_policy": 3}, "auto_wrap_policy=3 must be a set of layer classes"),
        ({"activation_checkpointing_policy": [nn.Linear, torch.Tensor]}, "activation_checkpointing_policy="),
        ({"state_dict_type": "local"}, "state_dict_type='local' is not valid; expected one of: 'full', 'sharded'"),
        ({"reshard_after_forward": 2}, r"FSDPStrategy\(reshard_after_forward=2\) must be True or False"),
        ({"start_method": "forkserver"}, "start_method='forkserver' is not valid"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, match):
    with pytest.raises(TandemConfigError, match=match):
        FSDPStrategy(**kwargs)


def test_registry_and_policies():
    strategy = resolve_strategy("fsdp", "cpu", 2, 1, "32-true")
    assert isinstance(strategy, FSDPStrategy) and strategy.process_group_backend == "gloo"
    assert FSDPStrategy(auto_wrap_policy=nn.Linear).auto_wrap_policy == frozenset({nn.Linear})
    policy = lambda module: isinstance(module, Block)  # noqa: E731
    assert FSDPStrategy(auto_wrap_policy=policy).auto_wrap_policy is policy


def test_dataparallel_style_devices_are_refused():
    with pytest.raises(TandemConfigError, match="several devices in one process is DataParallel's way"):
        resolve_strategy(FSDPStrategy(devices=[torch.device("cuda", 0)] * 2), "cpu", 1, 1, "32-true")


def test_precision_becomes_fsdps_mixed_precision_policy():
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    bf16 = resolve_strategy(FSDPStrategy(), "cpu", 1, 1, "bf16-mixed")
    policy = bf16.mixed_precision_policy
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    fp16 = resolve_strategy(FSDPStrategy(precision="16-mixed"), "cpu", 1, 1, "32-true")
    assert isinstance(fp16.precision.scaler, ShardedGradScaler)  # found-inf agreed across the shards
    assert _strategy().mixed_precision_policy.param_dtype is None


# ---------------------------------------------------------------------------------------------- bad modules


@pytest.mark.parametrize(
    ("kwargs", "module", "error", "match"),
    [
        (
            {"auto_wrap_policy": {nn.Conv2d, Block}},
            _mlp,
            TandemConfigError,
            r"auto_wrap_policy names Conv2d, which is not a layer of Sequential \(its layer classes: Block, Linear, "
            r"ReLU\)",
        ),
        (
            {"auto_wrap_policy": lambda module: False},
            _mlp,
            TandemConfigError,
            "auto_wrap_policy selected no submodule of Sequential that has parameters",
        ),
        (
            {"auto_wrap_policy": {nn.ReLU}},
            _mlp,
            TandemConfigError,
            "auto_wrap_policy selected no submodule",
        ),
        (
            {"activation_checkpointing_policy": {nn.LSTM}},
            _mlp,
            TandemConfigError,
            "activation_checkpointing_policy names LSTM",
        ),
        (
            {},
            lambda: nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).double()),
            TandemConfigError,
            r"mixes torch.float32: 0.weight, 0.bias; torch.float64: 1.weight, 1.bias",
        ),
        (
            {"auto_wrap_policy": {Block}},
            lambda: nn.Sequential(Block(), nn.DataParallel(Block())),
            TandemConfigError,
            r"Sequential.1 is a DataParallel, which drives several devices from one process",
        ),
    ],
    ids=["unknown-class", "wraps-nothing", "only-parameterless", "unknown-checkpoint-class", "dtype-mix", "dp"],
)
def test_bad_modules_are_refused_before_sharding(kwargs, module, error, match):
    with pytest.raises(error, match=match):
        _strategy(**kwargs).setup(module())


def test_a_dtype_mix_in_separate_groups_is_fine():
    from tandem.strategies.fsdp_checks import check_dtypes

    module = nn.Sequential(Block(), Block().double())
    check_dtypes(module, [module[1]])  # the float64 block is a group of its own: nothing to flatten together


# ---------------------------------------------------------------------------------------------- meta init


class WithMetric(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        self.acc = torchmetrics.classification.MulticlassAccuracy(3)


def test_empty_init_puts_only_parameters_on_meta():
    register = nn.Module.register_parameter
    with _strategy().tensor_init_context(empty_init=True):
        module = WithMetric()
    assert all(p.is_meta for p in module.parameters())
    assert not any(b.is_meta for b in module.buffers())  # BatchNorm's running statistics are real
    assert module.acc.tp.device.type == "cpu"  # and so are torchmetrics states
    assert nn.Module.register_parameter is register
    with _strategy().tensor_init_context():
        assert not nn.Linear(2, 2).weight.is_meta


def test_meta_parameters_without_reset_parameters_are_a_clear_error():
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)
            self.scale = nn.Parameter(torch.ones(4))

    trainer = tandem.Trainer(strategy="fsdp", accelerator="cpu", devices=1, logger=False)
    with trainer.init_module(empty_init=True):
        module = Scaled()
    with pytest.raises(TandemUserCodeError, match=r"reset_parameters\(\), which Scaled \(Scaled\) lack"):
        trainer.strategy.setup(module)


# ---------------------------------------------------------------------------------------------- checkpoints


def test_optimizer_state_formats_round_trip():
    named = {
        "state": {"b.weight": {"step": torch.tensor(3.0)}, "a.weight": {"step": torch.tensor(2.0)}},
        "param_groups": [{"lr": 0.1, "params": ["a.weight"]}, {"lr": 0.2, "params": ["b.weight"]}],
    }
    numbered = numbered_state(named)
    assert numbered["param_groups"] == [{"lr": 0.1, "params": [0]}, {"lr": 0.2, "params": [1]}]
    assert numbered["state"][1]["step"] == 3.0
    assert named_state(numbered, ["a.weight", "b.weight"]) == {
        "state": {"a.weight": named["state"]["a.weight"], "b.weight": named["state"]["b.weight"]},
        "param_groups": named["param_groups"],
    }


def test_a_directory_without_meta_is_not_a_checkpoint(tmp_path):
    folder = tmp_path / "last.ckpt"
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"a shard")
    with pytest.raises(CheckpointError, match="without meta.pt: not a tandem sharded checkpoint"):
        _strategy().load_checkpoint(folder)


@pytest.mark.parametrize("strategy", ["fsdp", "single_device"])
def test_an_empty_ckpt_folder_is_called_empty_not_a_sharded_checkpoint(tmp_path, strategy):
    folder = tmp_path / "last.ckpt"
    folder.mkdir()
    loader = _strategy() if strategy == "fsdp" else resolve_strategy("single_device", "cpu", 1, 1, "32-true")
    with pytest.raises(CheckpointError, match=r"last.ckpt' is an empty folder, not a checkpoint") as caught:
        loader.load_checkpoint(folder)
    assert "written by FSDPStrategy" not in str(caught.value) and "remove the empty folder" in str(caught.value)


def test_replace_directory_swaps_in_the_finished_one(tmp_path):
    old, new = tmp_path / "last.ckpt", tmp_path / ".last.ckpt.tmp"
    old.mkdir()
    (old / "meta.pt").write_text("old")
    new.mkdir()
    (new / "meta.pt").write_text("new")
    replace_directory(new, old)
    assert (old / "meta.pt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("FULL_SHARD", "reshard_after_forward=True"),
        ("SHARD_GRAD_OP", "reshard_after_forward=False"),
        ("NO_SHARD", "strategy='ddp'"),
        ("HYBRID_SHARD", "no 2-D device mesh"),
    ],
)
def test_lightnings_fsdp1_sharding_strategy_is_refused_naming_tandems_equivalent(value, named):
    with pytest.raises(TandemConfigError, match="Lightning's FSDP1 argument") as caught:
        FSDPStrategy(sharding_strategy=value)
    assert named in str(caught.value)
