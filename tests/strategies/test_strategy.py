"""The Strategy base and the parallel base without processes: complete on construction, public guards that
refuse the same inputs on every strategy, data sharding driven by ``distributed_sampler_kwargs``."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from helpers import clear_launch_variables
from tandem.strategies import DDPStrategy, Precision, SingleDeviceStrategy
from tandem.strategies.registry import resolve_strategy
from tandem.strategies.strategy import moves_batches
from tandem.utilities.exceptions import CheckpointError, TandemConfigError, TandemUserCodeError

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    clear_launch_variables(monkeypatch)


def _configured(strategy, devices: int = 1):
    return resolve_strategy(strategy, "cpu", devices, 1, "32-true")


STRATEGIES = {
    "single_device": lambda: _configured(SingleDeviceStrategy("cpu")),
    "ddp": lambda: _configured(DDPStrategy(), devices=2),
}


# ---------------------------------------------------------------------------------------------- construction


@pytest.mark.parametrize("make", [SingleDeviceStrategy, DDPStrategy], ids=["single_device", "ddp"])
def test_a_strategy_is_complete_when_constructed(make):
    strategy = make()
    assert isinstance(strategy.precision, Precision) and strategy.precision.precision == "32-true"
    assert make(precision="bf16-mixed").precision.autocast_dtype == torch.bfloat16


def test_the_strategys_own_precision_wins_over_the_trainer_default_and_a_conflict_is_an_error():
    assert resolve_strategy(DDPStrategy(precision="bf16-mixed"), "cpu", 2, 1, "32-true").precision.precision == (
        "bf16-mixed"
    )
    assert resolve_strategy(DDPStrategy(), "cpu", 2, 1, "bf16-mixed").precision.precision == "bf16-mixed"
    with pytest.raises(TandemConfigError, match="Give the precision in one place"):
        resolve_strategy(DDPStrategy(precision="bf16-mixed"), "cpu", 2, 1, "64-true")


def test_the_trainers_sampler_and_batchnorm_settings_fill_in_what_the_strategy_left_open():
    assert resolve_strategy("ddp", "cpu", 2, 1, "32-true").use_distributed_sampler  # both defaults
    by_trainer = resolve_strategy(DDPStrategy(), "cpu", 2, 1, "32-true", use_distributed_sampler=False)
    assert by_trainer.use_distributed_sampler is False
    by_name = resolve_strategy("ddp", "cpu", 2, 1, "32-true", use_distributed_sampler=False)
    assert by_name.use_distributed_sampler is False
    one_process = resolve_strategy(SingleDeviceStrategy("cpu"), "cpu", 1, 1, "32-true", sync_batchnorm=True)
    assert one_process.sync_batchnorm  # set, and ignored with one process
    # the instance's own value wins over a Trainer argument left at its default
    mine = resolve_strategy(DDPStrategy(use_distributed_sampler=False), "cpu", 2, 1, "32-true")
    assert mine.use_distributed_sampler is False
    # the same value in both places agrees
    both = DDPStrategy(use_distributed_sampler=False)
    assert not resolve_strategy(both, "cpu", 2, 1, "32-true", use_distributed_sampler=False).use_distributed_sampler


@pytest.mark.parametrize(
    ("built_with", "trainer_argument"),
    [
        (dict(use_distributed_sampler=True), dict(use_distributed_sampler=False)),
        (dict(sync_batchnorm=False), dict(sync_batchnorm=True)),
    ],
    ids=["use_distributed_sampler", "sync_batchnorm"],
)
def test_a_strategy_built_with_another_value_than_the_trainers_is_an_error(built_with, trainer_argument):
    ((name, value),) = trainer_argument.items()
    with pytest.raises(
        TandemConfigError, match=rf"Trainer\({name}={value}\) with a strategy built with {name}="
    ) as err:
        resolve_strategy(DDPStrategy(**built_with), "cpu", 2, 1, "32-true", **trainer_argument)
    assert f"Give the {name} in one place" in str(err.value)


def test_one_process_per_device_refuses_dataparallel_style_devices():
    with pytest.raises(TandemConfigError, match="several devices in one process is DataParallel's way"):
        resolve_strategy(DDPStrategy(devices=[torch.device("cpu"), torch.device("cuda", 0)]), "cpu", 1, 1, "32-true")


# ---------------------------------------------------------------------------------------------- public guards


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_collectives_refuse_the_same_bad_arguments_on_every_strategy(name):
    strategy = STRATEGIES[name]()
    value = torch.tensor([1.0, 2.0])
    with pytest.raises(TandemConfigError, match=r"reduce_op='avg' is not valid; expected one of: 'mean', 'sum'"):
        strategy.reduce(value, "avg")
    with pytest.raises(TandemUserCodeError, match="reduce expects a tensor or a number, got str"):
        strategy.reduce("1.0", "sum")
    with pytest.raises(TandemUserCodeError, match="use all_gather_object"):
        strategy.all_gather([1.0])
    with pytest.raises(TandemConfigError, match=r"src=5 is out of range; expected a rank in 0\.\."):
        strategy.broadcast("x", src=5)
    with pytest.raises(TandemConfigError, match="name=3"):
        strategy.barrier(3)
    with pytest.raises(TandemConfigError, match="stage='train'"):
        strategy.process_dataloader(DataLoader(range(4)), "train")
    with pytest.raises(TandemConfigError, match="limit=-1"):
        strategy.evaluation_batches(range(4), -1)
    with pytest.raises(TandemConfigError, match="gradient_clip_algorithm='l2'"):
        strategy.clip_gradients(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0), 1.0, "l2")
    # without a process group, the good calls are identities
    assert strategy.reduce(value, "max") is value
    assert strategy.all_gather(value).shape == (1, 2)
    assert strategy.all_gather_object({"a": 1}) == [{"a": 1}]
    packed = (torch.tensor([0, 1]), torch.tensor([2.5]), torch.tensor([-1.0]))
    assert strategy.reduce_if_agreed(12345, *packed) == packed  # one process agrees with itself
    assert strategy.broadcast("x") == "x" and strategy.reduce_boolean_decision(True, all=False)
    assert list(strategy.evaluation_batches(range(10), 3)) == [0, 1, 2]
    assert list(strategy.evaluation_batches(range(3), math.inf)) == [0, 1, 2]


def test_a_strategy_of_several_processes_without_a_packed_reduction_makes_its_callers_gather():
    """``reduce_if_agreed`` of a strategy that does not implement it under several processes answers None (the
    logged values then travel in ``all_gather_object``), never its own tensors as if every rank had agreed."""
    from tandem.strategies.strategy import Strategy

    class Several(Strategy):
        @property
        def world_size(self) -> int:
            return 2

    packed = (torch.tensor([0, 1]), torch.tensor([2.5]), torch.tensor([-1.0]))
    assert Several().reduce_if_agreed(1, *packed) is None


def test_sharding_follows_distributed_sampler_kwargs(monkeypatch):
    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2)
    assert SingleDeviceStrategy().distributed_sampler_kwargs is None
    assert _configured(DDPStrategy(), devices=1).distributed_sampler_kwargs is None  # one process: nothing to shard
    assert _configured(DDPStrategy(), devices=1).process_dataloader(loader, "validate") is loader
    for name, value in {"RANK": 1, "LOCAL_RANK": 1, "WORLD_SIZE": 2}.items():
        monkeypatch.setenv(name, str(value))
    strategy = _configured(DDPStrategy(), devices=2)
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 2, "rank": 1}
    sharded = strategy.process_dataloader(loader, "validate")
    assert [v for (batch,) in sharded for v in batch.tolist()] == [1.0, 3.0, 5.0, 7.0]


def test_one_process_trains_on_the_batches_of_a_batch_sampler_given_to_the_loader():
    """DataLoader(batch_sampler=BatchSampler(RandomSampler(...), 4, ...)): the loader's own batch_size is None and
    its sampler an unused SequentialSampler; one process draws the BatchSampler's batches, as the plain loader."""
    dataset = TensorDataset(torch.arange(10.0))
    given = DataLoader(dataset, batch_sampler=BatchSampler(RandomSampler(dataset), 4, drop_last=True))
    loader = _configured(SingleDeviceStrategy("cpu")).process_dataloader(given, "fit")
    for seed in (1, 2):
        torch.manual_seed(seed)
        expected = [b.tolist() for (b,) in given]
        torch.manual_seed(seed)
        assert [b.tolist() for (b,) in loader] == expected
        assert [len(b) for b in expected] == [4, 4] and expected != [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]


# ---------------------------------------------------------------------------------------------- checkpoints and init


def test_a_sharded_checkpoint_directory_is_refused_by_a_strategy_that_does_not_shard(tmp_path):
    folder = tmp_path / "last.ckpt"
    folder.mkdir()
    (folder / "shard").write_text("x")  # not empty (an empty folder is called empty)
    with pytest.raises(CheckpointError, match="strategy='single_device' cannot load. Load it with strategy='fsdp'"):
        SingleDeviceStrategy("cpu").load_checkpoint(folder)
    SingleDeviceStrategy("cpu").remove_checkpoint(folder)
    assert not folder.exists()


def test_tensor_init_context_builds_on_the_device_in_the_precisions_dtype():
    strategy = _configured(SingleDeviceStrategy("cpu"))
    with strategy.tensor_init_context():
        layer = torch.nn.Linear(2, 2)
    assert layer.weight.device == torch.device("cpu") and layer.weight.dtype == torch.float32
    double = SingleDeviceStrategy("cpu", precision="64-true")
    with double.tensor_init_context(empty_init=True):  # no meta device without a sharding strategy
        layer = torch.nn.Linear(2, 2)
    assert layer.weight.dtype == torch.float64 and not layer.weight.is_meta
    assert torch.get_default_dtype() == torch.float32


# ---------------------------------------------------------------------------------------------- the per-step path


def test_batches_are_moved_only_where_batch_to_device_changes_them():
    class Moving(SingleDeviceStrategy):
        def batch_to_device(self, batch):
            return [t * 2 for t in batch]

    batch = [torch.ones(2), torch.ones(2, dtype=torch.long)]
    plain = _configured(SingleDeviceStrategy("cpu"))
    assert not moves_batches(plain) and plain.batch_to_device(batch) is batch  # the loop skips a call doing nothing
    assert moves_batches(_configured(Moving("cpu")))
    double = resolve_strategy(SingleDeviceStrategy("cpu"), "cpu", 1, 1, "64-true")
    assert moves_batches(double)
    moved = double.batch_to_device(batch)
    assert moved[0].dtype == torch.float64 and moved[1].dtype == torch.long


def test_the_step_calls_skip_the_strategy_only_where_it_leaves_the_work_to_its_precision():
    from tandem.profilers import SimpleProfiler
    from tandem.trainer.profiling import StrategyCalls

    single = _configured(SingleDeviceStrategy("cpu"))
    calls = StrategyCalls(single)
    assert calls.backward == single.precision.backward and calls.optimizer_step == single.precision.optimizer_step
    ddp = _configured(DDPStrategy(), devices=2)  # its own backward (the gradient sync's checks): kept
    assert StrategyCalls(ddp).backward == ddp.backward
    timed = StrategyCalls(single, SimpleProfiler())  # profiled under the strategy's names
    assert timed.backward != single.precision.backward
