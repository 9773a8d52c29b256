"""DDPStrategy without processes: configuration, launcher choice, samplers, prediction reordering.

Ranks are simulated with environment variables (a LocalEnvironment with LOCAL_RANK set), so
``world_size`` and ``global_rank`` are what a launched rank would see; no process group is joined.
"""

from __future__ import annotations

import datetime
import re

import pytest
import torch
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    TensorDataset,
    WeightedRandomSampler,
)

from helpers import clear_launch_variables
from tandem.strategies import DDPStrategy, SingleDeviceStrategy
from tandem.strategies.launchers import ScriptLauncher, SpawnLauncher
from tandem.strategies.registry import resolve_strategy
from tandem.strategies.samplers import (
    DistributedSamplerWrapper,
    EvalDistributedSampler,
    FirstItems,
    GlobalOrderSampler,
    interleave_predictions,
)
from tandem.utilities.data import find_sampler, in_order
from tandem.utilities.exceptions import TandemConfigError


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    clear_launch_variables(monkeypatch)


def _as_rank(monkeypatch, rank: int, world: int = 2) -> None:
    for name, value in {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world}.items():
        monkeypatch.setenv(name, str(value))


def _strategy(devices: int = 2, **kwargs: object) -> DDPStrategy:
    return resolve_strategy(DDPStrategy(**kwargs), "cpu", devices, 1, "32-true")


def _dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1))


def _indices(loader: DataLoader) -> list[int]:
    return [int(v) for (batch,) in loader for v in batch.flatten().tolist()]


# ---------------------------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"start_method": "forkserver"}, "start_method='forkserver' is not valid"),
        ({"timeout": 30}, "timeout=30 is out of range"),
        ({"bucket_cap_mb": 0}, "bucket_cap_mb=0"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, match):
    with pytest.raises(TandemConfigError, match=match):
        DDPStrategy(**kwargs)


def test_cpu_only_checks():
    with pytest.raises(TandemConfigError, match="'nccl' needs CUDA"):
        _strategy(process_group_backend="nccl")
    with pytest.raises(TandemConfigError, match="sync_batchnorm=True needs CUDA"):
        _strategy(sync_batchnorm=True)
    strategy = _strategy(timeout=datetime.timedelta(seconds=5), bucket_cap_mb=1, static_graph=True)
    assert strategy.process_group_backend == "gloo"
    assert strategy.ddp_kwargs == {
        "find_unused_parameters": False,
        "static_graph": True,
        "gradient_as_bucket_view": False,
        "bucket_cap_mb": 1,
    }


def test_registry_names():
    ddp = resolve_strategy("ddp", "cpu", 2, 1, "32-true")
    spawn = resolve_strategy("ddp_spawn", "cpu", 2, 1, "32-true")
    auto = resolve_strategy("auto", "cpu", 2, 1, "32-true")
    assert isinstance(ddp, DDPStrategy) and ddp.start_method == "popen"
    assert isinstance(spawn, DDPStrategy) and spawn.start_method == "spawn"
    assert isinstance(auto, DDPStrategy)
    assert ddp.parallel_devices == [torch.device("cpu")] * 2 and ddp.num_processes == 2


def test_launcher_choice(monkeypatch):
    assert isinstance(_strategy().launcher, ScriptLauncher)
    assert isinstance(_strategy(start_method="spawn").launcher, SpawnLauncher)
    assert _strategy(devices=1).launcher is None  # one process: nothing to start
    _as_rank(monkeypatch, 1)
    assert _strategy(start_method="spawn").launcher is None  # a spawned rank starts nothing
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert _strategy().launcher is None  # torchrun started the processes


def test_topology_from_the_environment(monkeypatch):
    _as_rank(monkeypatch, 1)
    strategy = _strategy()
    assert (strategy.global_rank, strategy.local_rank, strategy.world_size, strategy.is_global_zero) == (1, 1, 2, False)
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 2, "rank": 1}
    assert strategy.root_device == torch.device("cpu")


def test_setup_environment_refuses_to_wait_for_ranks_never_started():
    with pytest.raises(TandemConfigError, match="before the other ranks were started"):
        _strategy().setup_environment()


def test_setup_environment_checks_the_world_size(monkeypatch):
    _as_rank(monkeypatch, 0, world=4)
    with pytest.raises(TandemConfigError, match=r"devices × num_nodes = 2 × 1 = 2"):
        _strategy().setup_environment()


def test_collectives_without_a_process_group_are_identities():
    strategy = _strategy()
    value = torch.tensor([1.0, 2.0])
    assert strategy.reduce(value, "sum") is value
    assert strategy.all_gather(value).shape == (1, 2)
    assert strategy.broadcast("x") == "x"
    with pytest.raises(TandemConfigError, match="reduce_op='avg'"):
        strategy.reduce(value, "avg")


def test_steps_are_collectives_only_with_several_processes(monkeypatch):
    single = SingleDeviceStrategy(device="cpu")
    assert single.world_size == 1 and single.ranks_with_batch(1) == [True]  # no collective, no loop cost
    _as_rank(monkeypatch, 1)
    assert _strategy().world_size > 1
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert _strategy(devices=1).world_size == 1
    assert _strategy(devices=1).ranks_with_batch(False) == [False]  # no process group: this rank's answer


def test_unused_parameter_error_names_the_parameters():
    strategy = _strategy()

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(2, 2)
            self.frozen = nn.Linear(2, 2).requires_grad_(False)  # not counted by DDP
            self.unused = nn.Linear(2, 2)

    strategy._module = Net()
    torch_message = (
        "Expected to have finished reduction in the prior iteration before starting a new one. ... "
        "Parameter indices which did not receive grad for rank 1: 2 3\n In addition, ..."
    )
    explained = strategy._explain(RuntimeError(torch_message))
    assert "unused.weight, unused.bias" in str(explained)
    assert "DDPStrategy(find_unused_parameters=True)" in str(explained)
    other = RuntimeError("something else")
    assert strategy._explain(other) is other


# ---------------------------------------------------------------------------------------------- training data


def _strategy_ordered(data_order: str) -> DDPStrategy:
    return resolve_strategy(DDPStrategy(), "cpu", 2, 1, "32-true", data_order=data_order)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_the_global_order_keeps_the_users_choices(monkeypatch, shuffle, drop_last):
    monkeypatch.setenv("TANDEM_GLOBAL_SEED", "7")
    per_rank = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        loader = _strategy_ordered("global").process_dataloader(
            DataLoader(_dataset(11), batch_size=2, shuffle=shuffle, drop_last=drop_last), "fit"
        )
        sampler = find_sampler(loader)
        assert isinstance(sampler, DistributedSampler)
        assert (sampler.shuffle, sampler.drop_last, sampler.seed, loader.drop_last) == (
            shuffle,
            drop_last,
            7,
            drop_last,
        )
        assert (sampler.num_replicas, sampler.rank) == (2, rank)
        per_rank.append(_indices(loader))
    if not shuffle:
        assert per_rank[0][:4] == [0, 2, 4, 6] and per_rank[1][:4] == [1, 3, 5, 7]  # interleaved, in order
    if drop_last:  # as one process with batch 4 and drop_last: 2 batches, no sample twice
        assert len(per_rank[0]) == len(per_rank[1]) == 4 and len(set(per_rank[0]) | set(per_rank[1])) == 8
    else:  # every sample, padded by repeating the first ones
        assert len(per_rank[0]) == len(per_rank[1]) == 6 and set(per_rank[0]) | set(per_rank[1]) == set(range(11))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_the_default_order_is_lightnings_training_distributed_sampler(monkeypatch, shuffle, drop_last):
    """Lightning injects DistributedSampler(dataset, shuffle=True, seed=<seed_everything's>) for training, whatever
    the loader's shuffle; the sampler pads (its drop_last is False), the loader keeps its own drop_last."""
    monkeypatch.setenv("TANDEM_GLOBAL_SEED", "7")
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        given = DataLoader(_dataset(11), batch_size=2, shuffle=shuffle, drop_last=drop_last)
        loader = _strategy().process_dataloader(given, "fit")
        sampler = find_sampler(loader)
        assert (sampler.shuffle, sampler.drop_last, sampler.seed, loader.drop_last) == (True, False, 7, drop_last)
        lightning = DistributedSampler(given.dataset, num_replicas=2, rank=rank, shuffle=True, seed=7)
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            lightning.set_epoch(epoch)
            expected = list(lightning)
            expected = expected[: len(expected) // 2 * 2] if drop_last else expected
            assert _indices(loader) == expected


def test_overfit_batches_keep_the_order_under_the_default_order(monkeypatch):
    """overfit_batches trains on the same first batches: Lightning's sampler does not shuffle them either."""
    _as_rank(monkeypatch, 0)
    with pytest.warns(UserWarning, match="overfit_batches"):
        ordered = in_order(DataLoader(_dataset(8), batch_size=2, shuffle=True), "training batches")
    assert _indices(_strategy().process_dataloader(ordered, "fit")) == [0, 2, 4, 6]


def test_shuffled_order_changes_per_epoch_and_is_reproducible(monkeypatch):
    _as_rank(monkeypatch, 0)
    loader = _strategy().process_dataloader(DataLoader(_dataset(40), batch_size=4, shuffle=True), "fit")
    sampler = find_sampler(loader)
    sampler.set_epoch(0)
    first = _indices(loader)
    sampler.set_epoch(1)
    second = _indices(loader)
    sampler.set_epoch(0)
    assert first != second and _indices(loader) == first


class Reversed(Sampler):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self) -> int:
        return self.n


def test_custom_sampler_is_wrapped_not_dropped(monkeypatch):
    shards = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        loader = _strategy().process_dataloader(DataLoader(_dataset(10), batch_size=2, sampler=Reversed(10)), "fit")
        assert isinstance(find_sampler(loader), DistributedSamplerWrapper)
        shards.append(_indices(loader))
    assert shards == [[9, 7, 5, 3, 1], [8, 6, 4, 2, 0]]  # the custom order, sharded


def test_random_custom_sampler_draws_alike_on_every_rank(monkeypatch):
    weights = torch.rand(20).tolist()
    shards = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        torch.manual_seed(rank)  # ranks whose global RNG differs still draw the same sequence
        sampler = WeightedRandomSampler(weights, num_samples=20, replacement=False)
        loader = _strategy().process_dataloader(DataLoader(_dataset(20), batch_size=5, sampler=sampler), "fit")
        shards.append(_indices(loader))
    assert sorted(shards[0] + shards[1]) == list(range(20))


@pytest.mark.parametrize("batches", [False, True], ids=["sampler", "batch_sampler"])
def test_a_training_sampler_without_len_is_a_clear_error(monkeypatch, batches):
    class Endless(Sampler):
        def __iter__(self):
            return iter(range(8))

    _as_rank(monkeypatch, 0)
    given = {"batch_sampler": Endless()} if batches else {"sampler": Endless(), "batch_size": 2}
    with pytest.raises(TandemConfigError, match=r"Endless: it has no __len__.*use_distributed_sampler=False"):
        _strategy().process_dataloader(DataLoader(_dataset(8), **given), "fit")
    mine = DataLoader(_dataset(8), **given)  # sharded by the user: tandem evens the epochs as it trains
    assert _strategy(use_distributed_sampler=False).process_dataloader(mine, "fit") is mine


@pytest.mark.parametrize(
    ("counts", "iterable", "shown"),
    [([-1, 3], True, "['unknown', 3]"), ([4, 3], True, "[4, 3]"), ([2, -1], False, "[2, 'unknown']")],
    ids=["one-length-unknown", "iterable-lengths-differ", "sampler-length-unknown-on-one"],
)
def test_training_lengths_tandem_cannot_even_are_a_clear_error(monkeypatch, counts, iterable, shown):
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(8))

    _as_rank(monkeypatch, 0)
    strategy = _strategy(use_distributed_sampler=False)
    monkeypatch.setattr(strategy, "all_gather", lambda local: torch.tensor(counts))  # what the ranks report
    given = DataLoader(Stream(), batch_size=2) if iterable else DataLoader(_dataset(4), batch_size=2)
    with pytest.raises(TandemConfigError, match=rf"have these lengths \(batches per epoch\): {re.escape(shown)}"):
        strategy.process_dataloader(given, "fit")
    monkeypatch.setattr(strategy, "all_gather", lambda local: torch.tensor([-1, -1]))  # no rank knows: the loop evens
    assert strategy.process_dataloader(given, "fit") is given


def test_custom_batch_sampler_is_wrapped(monkeypatch):
    batches = BatchSampler(Reversed(8), batch_size=2, drop_last=False)
    shards = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        custom = type("MyBatches", (BatchSampler,), {})(Reversed(8), 2, False)
        loader = _strategy().process_dataloader(DataLoader(_dataset(8), batch_sampler=custom), "fit")
        shards.append(_indices(loader))
    expected = list(batches)
    assert shards == [expected[0] + expected[2], expected[1] + expected[3]]


def test_loaders_left_alone(monkeypatch):
    _as_rank(monkeypatch, 0)
    plain = DataLoader(_dataset(8), batch_size=2)
    assert _strategy(use_distributed_sampler=False).process_dataloader(plain, "fit") is plain

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    stream = DataLoader(Stream(), batch_size=2)
    assert _strategy().process_dataloader(stream, "fit") is stream
    with pytest.raises(TandemConfigError, match="stage='train'"):
        _strategy().process_dataloader(plain, "train")


def test_first_items_keeps_set_epoch_reachable():
    inner = DistributedSampler(_dataset(12), num_replicas=2, rank=0, shuffle=True)
    loader = DataLoader(_dataset(12), batch_sampler=FirstItems(BatchSampler(inner, 2, False), 2))
    assert len(loader) == 2 and len(list(loader)) == 2
    assert find_sampler(loader) is inner


# ---------------------------------------------------------------------------------------------- evaluation data


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_evaluation_counts_every_sample_once(monkeypatch, stage, shuffle):
    shards = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        loader = _strategy().process_dataloader(DataLoader(_dataset(101), batch_size=10, shuffle=shuffle), stage)
        shards.append(_indices(loader))
    assert sorted(shards[0] + shards[1]) == list(range(101))  # every sample once, no padding
    assert (len(shards[0]), len(shards[1])) == (51, 50)
    if not shuffle:  # in dataset order; a shuffled loader is sharded in Lightning's seeded shuffled order
        assert shards[0] == list(range(0, 101, 2)) and shards[1] == list(range(1, 101, 2))
    else:
        assert shards[0] != list(range(0, 101, 2))


def test_evaluation_sampler_exactly_once():
    shards = [list(EvalDistributedSampler(range(101), num_replicas=2, rank=r)) for r in (0, 1)]
    assert sorted(shards[0] + shards[1]) == list(range(101))
    assert [len(EvalDistributedSampler(range(101), 2, r)) for r in (0, 1)] == [51, 50]
    assert [len(EvalDistributedSampler(range(1), 2, r)) for r in (0, 1)] == [1, 0]


def test_evaluation_drop_last_drops_what_one_process_drops(monkeypatch):
    shards = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        loader = _strategy().process_dataloader(DataLoader(_dataset(25), batch_size=10, drop_last=True), "test")
        shards.append(_indices(loader))
    assert sorted(shards[0] + shards[1]) == list(range(20))


@pytest.mark.parametrize("data_order", ["sampler", "global"])
def test_a_batch_sampler_given_to_the_training_loader_keeps_its_batches_on_each_rank(monkeypatch, data_order):
    """DataLoader(batch_sampler=BatchSampler(...)) leaves the loader's batch_size None: each rank still draws
    batches of the BatchSampler's size, from a shuffled order as its RandomSampler's."""
    monkeypatch.setenv("TANDEM_GLOBAL_SEED", "7")
    shards = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        dataset = _dataset(16)
        given = DataLoader(dataset, batch_sampler=BatchSampler(RandomSampler(dataset), 4, drop_last=False))
        loader = _strategy_ordered(data_order).process_dataloader(given, "fit")
        batches = [batch.flatten().tolist() for (batch,) in loader]
        assert [len(b) for b in batches] == [4, 4]
        sampler = find_sampler(loader)
        assert isinstance(sampler, DistributedSampler) and sampler.shuffle
        shards.append([int(v) for b in batches for v in b])
    assert sorted(shards[0] + shards[1]) == list(range(16))


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_batch_sampler_given_to_an_evaluation_loader_keeps_its_batches_on_each_rank(monkeypatch, drop_last):
    shards = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        dataset = _dataset(10)
        given = DataLoader(dataset, batch_sampler=BatchSampler(SequentialSampler(dataset), 4, drop_last=drop_last))
        loader = _strategy().process_dataloader(given, "validate")
        batches = [batch.flatten().tolist() for (batch,) in loader]
        assert [len(b) for b in batches] == ([4] if drop_last else [4, 1])
        shards.append([int(v) for b in batches for v in b])
    assert shards[0] == list(range(0, 8 if drop_last else 10, 2))  # dataset order, rank r's r, r+2, ...
    assert sorted(shards[0] + shards[1]) == list(range(8 if drop_last else 10))  # what one process sees


# ---------------------------------------------------------------------------------------------- predictions


def _predict_per_rank(monkeypatch, n: int, batch_size: int, step) -> tuple[list, list]:
    """Per-rank outputs of ``step`` over the sharded loaders, and what one process returns."""
    per_rank = []
    for rank in (0, 1):
        _as_rank(monkeypatch, rank)
        loader = _strategy().process_dataloader(DataLoader(_dataset(n), batch_size=batch_size), "predict")
        per_rank.append([step(batch) for (batch,) in loader])
    single = [step(batch) for (batch,) in DataLoader(_dataset(n), batch_size=batch_size)]
    return per_rank, single


@pytest.mark.parametrize(
    "step",
    [
        lambda x: x * 2,
        lambda x: {"y": x[:, 0], "ids": x[:, 0].long().tolist()},
        lambda x: (x, {"twice": x * 2}),
    ],
    ids=["tensor", "dict-with-list", "tuple"],
)
def test_interleave_predictions_rebuilds_the_single_process_result(monkeypatch, step):
    per_rank, single = _predict_per_rank(monkeypatch, 101, 10, step)
    gathered = interleave_predictions(per_rank, batch_size=10)
    assert len(gathered) == len(single) == 11
    torch.testing.assert_close(gathered, single)


def test_interleave_predictions_whole_batches():
    per_rank = [["b0", "b2", "b4"], ["b1", "b3"]]
    assert interleave_predictions(per_rank, batch_size=0) == ["b0", "b1", "b2", "b3", "b4"]


def test_interleave_predictions_falls_back_rank_by_rank():
    per_rank = [[torch.tensor(1.0), torch.tensor(3.0)], [torch.tensor(2.0)]]  # scalars cannot be split
    with pytest.warns(UserWarning, match="could not be split"):
        assert interleave_predictions(per_rank, batch_size=2) == [
            torch.tensor(1.0),
            torch.tensor(3.0),
            torch.tensor(2.0),
        ]


def test_gather_predictions_without_a_process_group_is_identity(monkeypatch):
    _as_rank(monkeypatch, 0)
    strategy = _strategy()
    loader = strategy.process_dataloader(DataLoader(_dataset(5), batch_size=2), "predict")
    assert strategy.gather_predictions(["a"], loader) == ["a"]


@pytest.mark.parametrize("wrapped", [False, True], ids=["global-order", "users-sampler"])
def test_global_batch_k_is_one_block_of_the_order_for_any_number_of_ranks(wrapped):
    """Elastic resume's premise: with N ranks of batch B, global batch k is items [k·B·N, (k+1)·B·N) of one
    order (drawn from seed + epoch), whatever N; and ``start`` begins an epoch at any item of it."""
    data = range(48)

    def sampler(replicas: int, rank: int) -> GlobalOrderSampler:
        if wrapped:  # a sampler of the user's drawing from torch's RNG, which the wrapper seeds with seed + epoch
            return DistributedSamplerWrapper(RandomSampler(data), replicas, rank, seed=3)
        return GlobalOrderSampler(data, num_replicas=replicas, rank=rank, shuffle=True, seed=3)

    blocks = {}
    for replicas, batch in ((1, 12), (2, 6), (4, 3)):
        ranks = [sampler(replicas, r) for r in range(replicas)]
        for s in ranks:
            s.set_epoch(1)
        drawn = [list(s) for s in ranks]
        blocks[replicas] = [sorted(i for d in drawn for i in d[k * batch : (k + 1) * batch]) for k in range(4)]
    assert blocks[1] == blocks[2] == blocks[4]
    one = sampler(1, 0)
    one.set_epoch(1)
    order = list(one)
    assert sorted(order) == list(range(48))
    later = [sampler(4, r) for r in range(4)]
    for s in later:
        s.set_epoch(1)
        s.start = 30  # inside global batch 2 of 12: the rest of the epoch, padded to a multiple of 4 ranks
    rest = [list(s) for s in later]
    assert [len(r) for r in rest] == [5, 5, 5, 5]
    assert [rest[j % 4][j // 4] for j in range(20)] == order[30:] + order[:2]
