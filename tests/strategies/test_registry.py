"""Strategy resolution by name and the single-device defaults: pure configuration, no processes."""

from __future__ import annotations

import pytest
import torch

from tandem.strategies import Precision, SingleDeviceStrategy, available_strategies
from tandem.strategies.registry import resolve_strategy

pytestmark = pytest.mark.timeout(30)


def test_auto_resolves_to_single_device_on_cpu():
    strategy = resolve_strategy("auto", "cpu", "auto", 1, "32-true")
    assert isinstance(strategy, SingleDeviceStrategy)
    assert strategy.root_device == torch.device("cpu")
    assert strategy.distributed_sampler_kwargs is None and strategy.launcher is None
    assert "single_device" in available_strategies()


def test_single_device_collectives_are_identities():
    strategy = SingleDeviceStrategy("cpu", precision="32-true")
    t = torch.tensor([1.0, 2.0])
    assert strategy.reduce(t, "sum") is t
    assert strategy.all_gather(t).shape == (1, 2)
    assert strategy.broadcast({"a": 1}) == {"a": 1}
    strategy.barrier()
    assert strategy.is_global_zero and strategy.world_size == 1


def test_user_instance_keeps_its_device_and_gets_the_trainer_precision():
    strategy = resolve_strategy(SingleDeviceStrategy("cpu"), "cpu", "auto", 1, "bf16-mixed")
    assert strategy.precision.precision == "bf16-mixed"


@pytest.mark.parametrize(("strategy", "devices"), [("auto", 1), ("ddp", 2)])
def test_trainer_float16_mixed_on_cpu_becomes_bf16_with_a_warning(strategy, devices):
    # Lightning's rule: no float16 AMP on the CPU (several times slower than float32 there)
    with pytest.warns(UserWarning, match=r"precision='16-mixed'\) but AMP with float16 is not supported on the CPU"):
        resolved = resolve_strategy(strategy, "cpu", devices, 1, 16)
    assert resolved.precision.precision == "bf16-mixed" and resolved.precision.scaler is None


def test_a_strategy_built_with_float16_keeps_it_on_cpu(recwarn):
    resolved = resolve_strategy(SingleDeviceStrategy("cpu", precision="16-mixed"), "cpu", "auto", 1, "32-true")
    assert resolved.precision.precision == "16-mixed" and resolved.precision.scaler is not None
    assert not [w for w in recwarn if "float16" in str(w.message)]


def test_precision_aliases_and_forward_context():
    assert Precision(16).precision == "16-mixed" and Precision("bf16").precision == "bf16-mixed"
    with Precision("bf16-mixed").forward_context():
        out = torch.nn.Linear(2, 2)(torch.randn(1, 2))
    assert out.dtype == torch.bfloat16
    with Precision("32-true").forward_context():
        assert torch.nn.Linear(2, 2)(torch.randn(1, 2)).dtype == torch.float32
