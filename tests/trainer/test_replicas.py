"""The DDP replica checks (``tandem.trainer.replicas``) without processes: the checksums, the decisions on
gathered numbers, and a stand-in strategy whose "other rank" is this rank's numbers changed on purpose. The
two-process runs are in ``scripts/replica_runs.py``, checked at the end of this file."""

from __future__ import annotations

import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import tandem
from helpers import TinyModule, launch_free_env, loader, quiet_trainer
from tandem.strategies import SingleDeviceStrategy
from tandem.trainer import replicas
from tandem.trainer.replicas import (
    ReplicaCheck,
    batch_fingerprint,
    check_replicas,
    replicated_tensors,
    tensor_checksum,
)
from tandem.utilities.exceptions import ReplicasDivergedError


class TwoRanks(SingleDeviceStrategy):
    """One process that plays two ranks holding identical replicas: rank 1's gathered numbers are rank 0's,
    passed through ``other`` (the identity: identical replicas and the same data on both)."""

    identical_replicas = True

    def __init__(self, module: nn.Module, other=lambda row: row) -> None:
        super().__init__(device="cpu")
        self.other, self.gathers = other, 0
        self.setup(module)

    @property
    def world_size(self) -> int:
        return 2

    def _all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        self.gathers += 1
        return torch.stack([tensor, self.other(tensor.clone())])

    def _reduce(self, tensor: torch.Tensor, reduce_op: str) -> torch.Tensor:
        self.gathers += 1  # a collective
        both = torch.stack([tensor, self.other(tensor.clone())])
        return both.amax(0) if reduce_op == "max" else both.sum(0)


class WithBuffers(nn.Module):
    def __init__(self, norm: type[nn.Module] = nn.BatchNorm1d) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.norm = norm(4)
        self.register_buffer("seen", torch.zeros(()))


def _changed_at(index: int):
    """``other`` for :class:`TwoRanks`: rank 1's ``index``-th number differs."""

    def other(row: torch.Tensor) -> torch.Tensor:
        row[index] += 1
        return row

    return other


def _index(module: nn.Module, name: str) -> int:
    return [n for _, n, _ in replicated_tensors(module)].index(name)


# ---------------------------------------------------------------------- checksums
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64])
def test_a_checksum_changes_with_one_bit_and_not_with_the_memory_layout(dtype):
    t = torch.randn(64, 16, generator=torch.Generator().manual_seed(0)).to(dtype)
    assert torch.equal(tensor_checksum(t), tensor_checksum(t.clone()))
    assert torch.equal(tensor_checksum(t), tensor_checksum(t.t().contiguous().t()))  # a non-contiguous copy
    assert torch.equal(tensor_checksum(t[1:]), tensor_checksum(t[1:].clone()))  # a view at an offset
    real = torch.view_as_real(t)[..., 0] if t.is_complex() else t
    nudged = t.clone()
    nudged_real = torch.view_as_real(nudged)[..., 0] if t.is_complex() else nudged
    nudged_real[3, 5] = torch.nextafter(real[3, 5], torch.tensor(float("inf"), dtype=real.dtype))  # one ulp
    assert not torch.equal(tensor_checksum(t), tensor_checksum(nudged))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_integer_and_bool_tensors_have_checksums(dtype):
    t = torch.arange(10).to(dtype)
    changed = t.clone()
    changed[0] = True if dtype == torch.bool else 7
    assert not tensor_checksum(t).is_floating_point()
    assert not torch.equal(tensor_checksum(t), tensor_checksum(changed))
    assert torch.equal(tensor_checksum(torch.tensor(2**62)), tensor_checksum(torch.tensor(2**62)))  # 0-d int64


@pytest.mark.parametrize("dtype", [torch.float16, torch.uint8])
def test_short_elements_at_any_offset_and_count_have_checksums(dtype):
    t = (torch.arange(11) * 3).to(dtype)
    for view in (t[1:], t[1:9], t[:9], t[2:]):  # offsets inside a 4-byte word, odd byte counts
        assert torch.equal(tensor_checksum(view), tensor_checksum(view.clone()))
        changed = view.clone()
        changed[-1] += 1
        assert not torch.equal(tensor_checksum(view), tensor_checksum(changed))


def test_a_large_tensor_checksum_reads_evenly_spaced_elements():
    t = torch.arange(100, dtype=torch.int32)
    assert int(tensor_checksum(t, max_elements=10)) == sum(range(0, 100, 10))
    assert int(tensor_checksum(t, max_elements=1000)) == sum(range(100))


def test_a_batch_fingerprint_covers_every_tensor_of_the_batch():
    x, y = torch.randn(8, 3), torch.arange(8)
    batch = {"x": x, "pair": (y, "text")}
    assert torch.equal(batch_fingerprint(batch), batch_fingerprint({"x": x.clone(), "pair": (y.clone(), "text")}))
    assert not torch.equal(batch_fingerprint(batch), batch_fingerprint({"x": x, "pair": (y.flip(0) * 2, "text")}))
    assert not torch.equal(batch_fingerprint((x, y)), batch_fingerprint((y, x)))  # a tensor's place counts
    assert batch_fingerprint(batch)[0] == 1
    assert batch_fingerprint(["no", "tensors"]).tolist() == [0, 0, 0]


def test_normalization_and_quantization_statistics_are_not_compared_unless_synced():
    names = [n for _, n, _ in replicated_tensors(WithBuffers())]
    assert names == ["linear.weight", "linear.bias", "norm.weight", "norm.bias", "seen", "norm.num_batches_tracked"]
    names = [n for _, n, _ in replicated_tensors(WithBuffers(nn.SyncBatchNorm))]
    assert "norm.running_mean" in names and "norm.running_var" in names
    quantized = nn.Sequential(nn.Linear(4, 4), torch.ao.quantization.FakeQuantize())  # quantization-aware training
    assert [n for _, n, _ in replicated_tensors(quantized)] == ["0.weight", "0.bias"]
    kinds = {n: k for k, n, _ in replicated_tensors(WithBuffers())}
    assert kinds["linear.weight"] == "parameter" and kinds["seen"] == "buffer"


# ---------------------------------------------------------------------- decisions
def test_identical_replicas_pass_and_the_first_differing_parameter_is_named():
    module = WithBuffers()
    check_replicas(TwoRanks(module), "before saving a checkpoint")  # identical: nothing
    strategy = TwoRanks(module, _changed_at(_index(module, "linear.bias")))
    with pytest.raises(ReplicasDivergedError) as error:
        check_replicas(strategy, "before saving a checkpoint")
    text = str(error.value)
    assert "differ before saving a checkpoint: parameter 'linear.bias' on rank 1 is not what rank 0 holds" in text
    assert "changed outside the optimizer on some ranks only" in text
    assert "manual_backward" not in text  # automatic optimization: not a cause


def test_a_differing_buffer_is_named_with_its_causes():
    module = WithBuffers()
    strategy = TwoRanks(module, _changed_at(_index(module, "seen")))
    with pytest.raises(ReplicasDivergedError, match=r"buffer 'seen' on rank 1 .*updated on some ranks only"):
        ReplicaCheck().check_epoch_end(strategy, 3)


def test_under_manual_optimization_loss_backward_is_the_first_cause_named():
    module = WithBuffers()
    module.automatic_optimization = False
    everything = lambda row: row + 1  # noqa: E731 (every checksum differs)
    with pytest.raises(ReplicasDivergedError) as error:
        ReplicaCheck().check_epoch_end(TwoRanks(module, everything), 0)
    text = str(error.value)
    assert "at the end of epoch 0: parameter 'linear.weight' on rank 1" in text
    assert "(5 more tensors differ too: linear.bias, norm.weight, norm.bias, seen, norm.num_batches_tracked)" in text
    assert "(1) under manual optimization, loss.backward() called instead of self.manual_backward(loss)" in text


def _first_batch_then_epoch_end(check: ReplicaCheck, strategy: TwoRanks, data, epoch: int = 0) -> list[str]:
    sampler = data.sampler if isinstance(data, DataLoader) else None
    batches = list(check.watch_first_batch(strategy, sampler, iter(data)))
    assert len(batches) == len(data)  # the first batch is not lost
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check.check_epoch_end(strategy, epoch)
    return [str(w.message) for w in caught]


def test_the_same_first_batch_on_every_rank_warns_once():
    module, check = WithBuffers(), ReplicaCheck()
    batch_slot = len(replicated_tensors(module)) + 2  # the batch's combined checksums
    assert _first_batch_then_epoch_end(check, TwoRanks(module, _changed_at(batch_slot)), loader()) == []
    (message,) = _first_batch_then_epoch_end(check, TwoRanks(module), loader())
    assert "Every one of the 2 ranks got the same first training batch in epoch 0" in message
    assert "trained on 2 times per epoch" in message
    assert "torch.utils.data.get_worker_info()" in message and "DistributedSampler" in message
    assert _first_batch_then_epoch_end(check, TwoRanks(module), loader(), epoch=1) == []  # once
    batches = iter(loader())
    assert check.watch_first_batch(TwoRanks(module), None, batches) is batches  # and no more fingerprints


def test_data_split_by_a_distributed_sampler_is_not_fingerprinted():
    data = TensorDataset(torch.zeros(16, 2))  # constant samples: equal batches on every rank, split or not
    split = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, num_replicas=2, rank=0))
    check = ReplicaCheck()
    assert _first_batch_then_epoch_end(check, TwoRanks(WithBuffers()), split) == []
    assert not check.same_data_warned


def test_one_process_and_sharded_replicas_cost_nothing(monkeypatch, tmp_path):
    """No checksum and no collective: one process, or a strategy whose processes do not hold identical replicas."""

    def refuse(*args):
        raise AssertionError("checksums computed")

    monkeypatch.setattr(replicas, "module_checksums", refuse)
    monkeypatch.setattr(replicas, "batch_fingerprint", refuse)
    model = TinyModule()
    trainer = quiet_trainer(max_epochs=2, enable_checkpointing=True, default_root_dir=tmp_path)
    trainer.fit(model, loader())  # epoch ends and the checkpoint save: nothing runs
    assert trainer.current_epoch == 2

    class Sharded(TwoRanks):
        identical_replicas = False

    class OneRank(TwoRanks):
        world_size = 1

    for strategy in (Sharded(WithBuffers()), OneRank(WithBuffers())):
        check = ReplicaCheck()
        batches = iter(loader())
        assert check.watch_first_batch(strategy, None, batches) is batches
        check.check_epoch_end(strategy, 0)
        check_replicas(strategy, "before saving a checkpoint")
        assert strategy.gathers == 0


def test_only_ddp_declares_identical_replicas():
    from tandem.strategies import DDPStrategy, FSDPStrategy

    assert DDPStrategy.identical_replicas and not FSDPStrategy.identical_replicas
    assert not SingleDeviceStrategy.identical_replicas and not tandem.Trainer().strategy.identical_replicas


# ---------------------------------------------------------------------- two processes (scripts/replica_runs.py)
@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Both ranks started here, as torchrun would, so that a fit failing on every rank leaves them running."""
    out = tmp_path_factory.mktemp("replicas")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = Path(__file__).parent / "scripts" / "replica_runs.py"
    variables = dict(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(out)],
            env=launch_free_env(RANK=str(r), LOCAL_RANK=str(r), **variables),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=out,
        )
        for r in (0, 1)
    ]
    outputs = [p.communicate(timeout=110)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


def test_ddp_manual_loss_backward_is_found_at_the_epoch_end(ranks):
    for result in ranks:
        text = result["manual"]
        assert text is not None, "the ranks diverged without an error"
        assert "The DDP replicas differ at the end of epoch 0: parameter 'net.0.weight' on rank 1" in text
        assert "loss.backward() called instead of self.manual_backward(loss)" in text


def test_ddp_buffer_updated_on_one_rank_is_found_before_a_save(ranks):
    for result in ranks:
        text = result["buffer"]
        assert text is not None, "the ranks' buffers differed without an error"
        assert "The DDP replicas differ before saving a checkpoint: buffer 'seen' on rank 1" in text
        assert result["buffer_files"] == []  # nothing written


def test_ddp_same_data_on_every_rank_warns_once(ranks):
    rank0, rank1 = ranks
    (message,) = rank0["same_data"]  # two epochs, one warning
    assert "Every one of the 2 ranks got the same first training batch in epoch 0" in message
    assert rank1["same_data"] == []  # rank zero warns


def test_ddp_with_batchnorm_and_checkpoints_raises_and_warns_nothing(ranks):
    for result in ranks:
        normal = result["normal"]
        assert normal["warnings"] == []
        assert normal["epochs"] == 2 and normal["saved"]
        assert normal["running_mean_differs"]  # BatchNorm's statistics differed, and were let be
