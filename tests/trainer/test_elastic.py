"""Elastic resume within one process: the global order one process draws, and a checkpoint continued with another
batch size (the data layout changes as with another device count). The 2 <-> 1 process resumes run with real
processes in tests/strategies/test_ddp_trainer.py and test_fsdp_trainer.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, Sampler, TensorDataset

import tandem
from helpers import quiet_trainer
from tandem.utilities.exceptions import TandemConfigError, TandemWarning

N = 96  # samples; x[:, 0] is the sample's index


def _dataset() -> TensorDataset:
    x = torch.randn(N, 4, generator=torch.Generator().manual_seed(0))
    x[:, 0] = torch.arange(N, dtype=torch.float32)
    return TensorDataset(x, x.sum(1, keepdim=True))


class Seen(tandem.TrainingModule):
    """Records the sample indices of every training batch."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.seen: list[list[int]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.seen.append(x[:, 0].long().tolist())
        return F.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-4)


class SaveAt(tandem.Callback):
    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: tandem.Trainer, module: Any, outputs: Any, batch: Any, i: int) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def _fit(loader: DataLoader, ckpt: Path | None = None, save: SaveAt | None = None, **kwargs: Any) -> Seen:
    model = Seen()
    trainer = quiet_trainer(**{"max_epochs": 2, "callbacks": [save] if save else [], **kwargs})
    trainer.fit(model, loader, ckpt_path=ckpt)
    model.trainer_global_step = trainer.global_step
    return model


def _order(seed: int, epoch: int) -> list[int]:
    return torch.randperm(N, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def _flat(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


def test_one_process_draws_the_loaders_own_numbers_by_default_and_the_global_order_when_asked():
    """data_order="sampler" (default): the numbers the loader's RandomSampler draws (as with use_distributed_sampler=
    False, Lightning's); "global": the order N processes share (DistributedSampler's permutation of seed + epoch)."""
    tandem.seed_everything(5)
    own = _flat(_fit(DataLoader(_dataset(), batch_size=8, shuffle=True), use_distributed_sampler=False).seen)
    tandem.seed_everything(5)
    default = _flat(_fit(DataLoader(_dataset(), batch_size=8, shuffle=True)).seen)
    assert default == own
    tandem.seed_everything(5)
    seen = _flat(_fit(DataLoader(_dataset(), batch_size=8, shuffle=True), data_order="global").seen)
    assert seen == _order(5, 0) + _order(5, 1)
    assert sorted(own[:N]) == list(range(N)) and own != seen


def test_the_default_order_draws_a_random_samplers_epoch_seeds_from_the_global_generator_as_it_does():
    """The same first batch as a plain loop over the same loader after the same draws, epoch after epoch."""
    tandem.seed_everything(3)
    model = Seen()  # the same draws before the first epoch as _fit's
    loader = DataLoader(_dataset(), batch_size=8, shuffle=True)
    plain = [x[:, 0].long().tolist() for _ in range(2) for x, _ in loader]
    tandem.seed_everything(3)
    assert _fit(DataLoader(_dataset(), batch_size=8, shuffle=True)).seen == plain
    assert sum(p.numel() for p in model.parameters()) == 5


def test_an_unknown_data_order_is_refused_with_the_choices():
    with pytest.raises(TandemConfigError, match="data_order.*'sampler'.*'global'"):
        quiet_trainer(data_order="shuffled")


ORDERS = pytest.mark.parametrize("data_order", ["sampler", "global"])


@ORDERS
@pytest.mark.parametrize("batch", [4, 12], ids=["tiles", "inside-a-batch"])
def test_another_global_batch_continues_at_the_next_item_and_says_so(tmp_path, batch, data_order):
    """Saved after 5 batches of 8 (40 items of epoch 0), resumed with batch 4 (10 of its batches done) or 12 (the
    place falls inside its 4th batch: the epoch goes on from item 40 all the same), in either order: the rest of
    the uninterrupted run's epoch 0, then its epoch 1."""
    tandem.seed_everything(5)
    saver = SaveAt(5, tmp_path / "at5.ckpt")
    whole = _fit(DataLoader(_dataset(), batch_size=8, shuffle=True), save=saver, data_order=data_order)
    epochs = _flat(whole.seen[: N // 8]), _flat(whole.seen[N // 8 :])
    if data_order == "global":
        assert epochs == (_order(5, 0), _order(5, 1))
    tandem.seed_everything(123)  # the checkpoint's order, not this seed's
    with pytest.warns(UserWarning, match=f"global batch changes from 8 .* to {batch} .* at item 40 of epoch 0"):
        resumed = _fit(
            DataLoader(_dataset(), batch_size=batch, shuffle=True), ckpt=tmp_path / "at5.ckpt", data_order=data_order
        )
    epoch0 = -(-(N - 40) // batch)  # batches left in epoch 0
    assert _flat(resumed.seen[:epoch0]) == epochs[0][40:]
    assert _flat(resumed.seen[epoch0:]) == epochs[1]
    assert resumed.trainer_global_step == 5 + epoch0 + N // batch


@ORDERS
def test_an_unseeded_run_resumes_in_the_checkpoints_order(tmp_path, monkeypatch, data_order):
    """Without seed_everything one process's order comes from torch's seed, a new one each run: the resume takes the
    checkpoint's, so it continues the same batches."""
    monkeypatch.delenv("TANDEM_GLOBAL_SEED", raising=False)
    torch.manual_seed(1)
    loader = DataLoader(_dataset(), batch_size=8, shuffle=True)
    whole = _fit(loader, save=SaveAt(5, tmp_path / "at5.ckpt"), data_order=data_order)
    torch.manual_seed(2)
    resumed = _fit(loader, ckpt=tmp_path / "at5.ckpt", data_order=data_order)
    assert resumed.seen == whole.seen[5:]


@ORDERS
def test_a_resumed_run_keeps_the_checkpoints_order_when_it_builds_its_loaders_again(tmp_path, data_order):
    """reload_dataloaders_every_n_epochs=1 builds the training loader again each epoch: still in the checkpoint's
    order, not in the order of the resumed run's own seed."""

    class Reloading(Seen):
        def train_dataloader(self) -> DataLoader:
            return DataLoader(_dataset(), batch_size=8, shuffle=True)

    kwargs = dict(max_epochs=2, reload_dataloaders_every_n_epochs=1, data_order=data_order)
    tandem.seed_everything(5)
    whole, saver = Reloading(), SaveAt(5, tmp_path / "at5.ckpt")
    quiet_trainer(callbacks=[saver], **kwargs).fit(whole)
    tandem.seed_everything(7)
    resumed = Reloading()
    quiet_trainer(**kwargs).fit(resumed, ckpt_path=tmp_path / "at5.ckpt")
    assert resumed.seen == whole.seen[5:]


class Backwards(Sampler):
    def __iter__(self):
        return iter(range(N - 1, -1, -1))

    def __len__(self) -> int:
        return N


class Stream(IterableDataset):
    def __iter__(self):
        return iter(_dataset())


@pytest.mark.parametrize("kind", ["sampler", "iterable"])
def test_an_order_tandem_cannot_reshard_refuses_another_layout_mid_epoch(tmp_path, kind):
    """A sampler of the user's (or an iterable dataset) resumed mid-epoch with another batch size: tandem cannot
    tell which samples the rest of the epoch holds, and says so instead of restarting the epoch."""

    def data(batch: int) -> DataLoader:
        if kind == "sampler":
            return DataLoader(_dataset(), batch_size=batch, sampler=Backwards())
        return DataLoader(Stream(), batch_size=batch)

    _fit(data(8), save=SaveAt(5, tmp_path / "at5.ckpt"), max_epochs=1)
    with pytest.raises(TandemConfigError, match="middle of epoch 0.*1 process.* x batch 8 to 1 process.* x batch 4"):
        _fit(data(4), ckpt=tmp_path / "at5.ckpt")
    if kind == "sampler":
        resumed = _fit(data(8), ckpt=tmp_path / "at5.ckpt", max_epochs=1)  # the same layout continues
    else:
        with pytest.warns(TandemWarning, match="reads and discards its first 5 batches"):
            resumed = _fit(data(8), ckpt=tmp_path / "at5.ckpt", max_epochs=1)  # the same layout continues
    after = list(range(N - 41, N - 49, -1)) if kind == "sampler" else list(range(40, 48))
    assert _flat(resumed.seen)[:8] == after
