"""Several training loaders (a list, a dict, nested, or a CombinedLoader) on one process: the batch's shape, the
epoch's length by mode, Lightning's numbers, and the exact resume in the middle of an epoch."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler, TensorDataset

import tandem
from helpers import max_abs_diff, quiet_trainer
from tandem.callbacks import ModelCheckpoint
from tandem.utilities import CombinedLoader
from tandem.utilities.exceptions import MisconfigurationException


def marked(n: int, offset: int) -> TensorDataset:
    """``n`` samples whose first feature names them (``offset + i``, over 1000), with random targets."""
    g = torch.Generator().manual_seed(offset)
    x = torch.randn(n, 4, generator=g)
    x[:, 0] = (torch.arange(n) + offset) / 1000
    return TensorDataset(x, torch.randn(n, 1, generator=g))


def names(part: torch.Tensor | None) -> list[int] | None:
    return None if part is None else [round(float(v) * 1000) for v in part[0][:, 0]]


def two_loaders(shuffle: bool = True) -> dict[str, DataLoader]:
    """3 batches of "a" (ids 0-5), 5 of "b" (ids 100-109)."""
    return {
        "a": DataLoader(marked(6, 0), batch_size=2, shuffle=shuffle),
        "b": DataLoader(marked(10, 100), batch_size=2, shuffle=shuffle),
    }


class Recording(tandem.TrainingModule):
    """Trains on every part of a dict batch; records the ids it saw per step."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
        self.seen: list[tuple[int, int, dict[str, list[int] | None]]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, batch_idx, {key: names(part) for key, part in batch.items()}))
        return sum(F.mse_loss(self.net(part[0]), part[1]) for part in batch.values() if part is not None)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(data, epochs: int = 1, **kwargs) -> tuple[Recording, tandem.Trainer]:
    model = Recording()
    trainer = quiet_trainer(max_epochs=epochs, **kwargs)
    trainer.fit(model, data)
    return model, trainer


# ---------------------------------------------------------------------- CombinedLoader itself
def test_combined_loader_modes_yield_lightnings_triples_and_lengths():
    loaders = {"a": DataLoader(range(6), batch_size=4), "b": DataLoader(range(15), batch_size=5)}
    expected = {
        "max_size_cycle": (
            3,
            [([0, 1, 2, 3], [0, 1, 2, 3, 4]), ([4, 5], [5, 6, 7, 8, 9]), ([0, 1, 2, 3], [10, 11, 12, 13, 14])],
        ),
        "max_size": (3, [([0, 1, 2, 3], [0, 1, 2, 3, 4]), ([4, 5], [5, 6, 7, 8, 9]), (None, [10, 11, 12, 13, 14])]),
        "min_size": (2, [([0, 1, 2, 3], [0, 1, 2, 3, 4]), ([4, 5], [5, 6, 7, 8, 9])]),
    }
    for mode, (length, batches) in expected.items():
        combined = CombinedLoader(loaders, mode)
        iter(combined)
        assert len(combined) == length
        got = [(b["a"] if b["a"] is None else b["a"].tolist(), b["b"].tolist()) for b, _, _ in combined]
        assert got == batches
        assert [(i, d) for _, i, d in CombinedLoader(loaders, mode)] == [(i, 0) for i in range(length)]
    sequential = CombinedLoader(loaders, "sequential")
    iter(sequential)
    assert len(sequential) == 5
    assert [(b.tolist()[0], i, d) for b, i, d in sequential] == [(0, 0, 0), (4, 1, 0), (0, 0, 1), (5, 1, 1), (10, 2, 1)]


def test_combined_loader_keeps_nested_shapes_and_exposes_samplers():
    a, b, c = (DataLoader(range(n)) for n in (2, 3, 4))
    combined = CombinedLoader({"x": [a, b], "y": (c,)}, "max_size")
    assert combined.flattened == [a, b, c]
    assert combined.sampler == {"x": [a.sampler, b.sampler], "y": (c.sampler,)}
    assert combined.batch_sampler["x"][1] is b.batch_sampler
    batch, _, _ = next(iter(combined))
    assert set(batch) == {"x", "y"} and isinstance(batch["x"], list) and isinstance(batch["y"], tuple)
    combined.flattened = [c, b, a]
    assert combined.iterables == {"x": [c, b], "y": (a,)}
    with pytest.raises(ValueError, match="Mismatch in flattened length"):
        combined.flattened = [a]
    combined.limits = 1
    iter(combined)
    assert len(combined) == 1
    with pytest.raises(ValueError, match="Unsupported mode 'cycle'"):
        CombinedLoader([a], "cycle")
    with pytest.raises(RuntimeError, match="call `iter"):
        len(CombinedLoader([a]))


# ---------------------------------------------------------------------- training
@pytest.mark.parametrize(
    ("mode", "batches", "a_last"),
    [("max_size_cycle", 5, 1), ("min_size", 3, 2), ("max_size", 5, None)],
)
def test_each_mode_trains_on_the_dict_batch_for_its_epoch_length(mode, batches, a_last):
    model, trainer = fit(CombinedLoader(two_loaders(shuffle=False), mode), epochs=2)
    assert trainer.num_training_batches == batches and trainer.global_step == 2 * batches
    assert [(e, i) for e, i, _ in model.seen] == [(e, i) for e in range(2) for i in range(batches)]
    first = [parts for e, _, parts in model.seen if e == 0]
    assert [p["b"] for p in first] == [[100 + 2 * i, 101 + 2 * i] for i in range(batches)]
    assert first[-1]["a"] == (None if a_last is None else [2 * a_last, 2 * a_last + 1])  # cycled / ended / last
    assert isinstance(trainer.train_dataloader, dict) and set(trainer.train_dataloader) == {"a", "b"}


def test_a_list_of_loaders_is_max_size_cycle_and_its_batch_a_list():
    seen = []

    class ListModule(Recording):
        def training_step(self, batch, batch_idx):
            seen.append([names(part) for part in batch])
            return super().training_step(dict(enumerate(batch)), batch_idx)

    loaders = list(two_loaders(shuffle=False).values())
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(ListModule(), train_dataloaders=loaders)
    assert len(seen) == 5 and seen[3] == [[0, 1], [106, 107]]  # "a" started again
    assert trainer.train_dataloader == loaders  # the user's loaders on one process, as Lightning's


def test_nested_loaders_give_a_nested_batch_and_a_limit_counts_per_loader():
    shapes = []

    class Nested(Recording):
        def training_step(self, batch, batch_idx):
            shapes.append((len(batch["ab"]), len(batch["c"][0][0])))
            return self.net(batch["c"][0][0]).sum()

    a, b = two_loaders(shuffle=False).values()
    nested = {"ab": [a, b], "c": [DataLoader(marked(8, 200), batch_size=4)]}
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=0.5)
    trainer.fit(Nested(), nested)
    # limits per loader (int(3 * .5), int(5 * .5), int(2 * .5)) = (1, 2, 1); max_size_cycle's length is their max
    assert trainer.num_training_batches == 2 and shapes == [(2, 4), (2, 4)]


def test_sequential_mode_cannot_train():
    with pytest.raises(MisconfigurationException, match='does not support the `CombinedLoader\\(mode="sequential"\\)`'):
        fit(CombinedLoader(two_loaders(), "sequential"))


def test_overfit_batches_turns_each_loaders_shuffling_off():
    samplers = []

    class Checking(Recording):
        def training_step(self, batch, batch_idx):
            samplers.extend(type(loader.sampler) for loader in self.trainer.train_dataloader)
            return super().training_step(dict(enumerate(batch)), batch_idx)

    data = marked(6, 0)
    loaders = [DataLoader(data, sampler=RandomSampler(data)) for _ in range(2)]
    trainer = quiet_trainer(max_epochs=1, overfit_batches=1.0)
    with pytest.warns(UserWarning, match="turns their shuffling off"):
        trainer.fit(Checking(), loaders)
    assert samplers and all(issubclass(kind, SequentialSampler) for kind in samplers)


def test_an_iterable_dataset_loader_makes_the_epoch_length_unknown_in_max_size_cycle():
    class Stream(IterableDataset):
        def __iter__(self):
            for i in range(4):
                yield marked(4, 300)[i]

    loaders = {"a": DataLoader(marked(6, 0), batch_size=2), "b": DataLoader(Stream(), batch_size=2)}
    model, trainer = fit(CombinedLoader(loaders, "min_size"))
    assert trainer.num_training_batches == 3  # min_size: the sized loader's length decides
    assert len(model.seen) == 2  # the stream ended first
    model, trainer = fit(loaders)
    assert trainer.num_training_batches == math.inf
    assert len(model.seen) == 3  # until both ran out once ("b" after 2, "a" after 3)


# ---------------------------------------------------------------------- exact resume in the middle of an epoch
@pytest.mark.parametrize("mode", ["max_size_cycle", "min_size", "max_size"])
def test_a_mid_epoch_resume_continues_every_loader_where_it_stood(tmp_path, mode):
    """Shuffled loaders and dropout: the checkpoint at step 4 stands where "a" (3 batches) has started its second
    pass under max_size_cycle; the resumed run sees the same batches and ends with the same weights."""
    tandem.seed_everything(7)
    full, _ = fit(CombinedLoader(two_loaders(), mode), epochs=3)
    full_weights = {k: v.clone() for k, v in full.state_dict().items()}

    tandem.seed_everything(7)
    saving = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1, filename="{step}")
    first, trainer = fit(CombinedLoader(two_loaders(), mode), epochs=3, callbacks=[saving], max_steps=4)
    assert trainer.global_step == 4
    saved = torch.load(tmp_path / "step=4.ckpt", weights_only=False)
    assert saved["loops"]["batches_done"] == (1 if mode == "min_size" else 4)  # mid-epoch either way
    assert len(saved["loops"]["data"]["loaders"]) == 2

    tandem.seed_everything(123)  # the resume brings its own RNG state back
    resumed = Recording()
    trainer = quiet_trainer(max_epochs=3)
    trainer.fit(resumed, CombinedLoader(two_loaders(), mode), ckpt_path=tmp_path / "step=4.ckpt")
    assert resumed.seen == full.seen[4:]
    assert max_abs_diff(resumed.state_dict(), full_weights) == 0.0


def test_a_checkpoint_of_two_loaders_does_not_resume_a_fit_of_one(tmp_path):
    saving = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, filename="two")
    fit(two_loaders(), callbacks=[saving], max_steps=2)
    trainer = quiet_trainer(max_epochs=1)
    with pytest.raises(MisconfigurationException, match="trained on 2 training loaders and this fit has one"):
        trainer.fit(Recording(), DataLoader(marked(6, 0), batch_size=2), ckpt_path=tmp_path / "two.ckpt")


# ---------------------------------------------------------------------- evaluation
def test_a_sequential_combined_loader_evaluates_its_loaders_in_turn_and_other_modes_are_refused():
    calls = []

    class Evaluated(Recording):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            calls.append((dataloader_idx, batch_idx, names(batch)))

    a, b = two_loaders(shuffle=False).values()
    trainer = quiet_trainer(limit_val_batches=2)
    trainer.validate(Evaluated(), CombinedLoader({"a": a, "b": b}, "sequential"), verbose=False)
    assert calls == [(0, 0, [0, 1]), (0, 1, [2, 3]), (1, 0, [100, 101]), (1, 1, [102, 103])]
    with pytest.raises(MisconfigurationException, match="CombinedLoader in 'max_size' mode.*sequential"):
        trainer.validate(Evaluated(), CombinedLoader([a, b], "max_size"), verbose=False)
