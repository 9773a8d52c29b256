"""Elastic resume with several training loaders, in one process (a batch size changed is a layout changed as a
device count is; the 2 <-> 1 process resumes run in tests/trainer/test_elastic_loaders_ddp.py).

"The same training" when the layout changes in the middle of an epoch: each loader's samples, all ranks together,
go on from where the checkpoint left them in that loader's global order (its pass in progress, then its next passes
for a cycling loader), with no sample repeated or skipped; the epoch ends where the resumed layout's mode ends it
(``min_size``: when a loader's pass ends; ``max_size``: when the last one's does; ``max_size_cycle``: when every
loader has ended a pass), and the epochs after are the resumed layout's own."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

import tandem
from helpers import quiet_trainer
from tandem.utilities import CombinedLoader
from tandem.utilities.exceptions import TandemConfigError

SIZES = {"a": 12, "b": 20}
MODES = ("max_size_cycle", "min_size", "max_size")
SEED = 7


def _marked(n: int, offset: int) -> TensorDataset:
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(offset))
    x[:, 0] = torch.arange(n) + offset
    return TensorDataset(x, x.sum(1, keepdim=True))


def _loaders(sizes: dict[str, int], **kwargs: Any) -> dict[str, DataLoader]:
    return {
        name: DataLoader(_marked(n, 100 * i), batch_size=sizes[name], shuffle=True, **kwargs)
        for i, (name, n) in enumerate(SIZES.items())
    }


class Seen(tandem.TrainingModule):
    """Records each step's sample ids per loader (None where a loader has ended, in max_size)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 1)
        self.seen: list[dict[str, list[int] | None]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append({k: None if v is None else (v[0][:, 0].long() % 100).tolist() for k, v in batch.items()})
        return sum(F.mse_loss(self.layer(v[0]), v[1]) for v in batch.values() if v is not None)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class SaveAt(tandem.Callback):
    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: tandem.Trainer, module: Any, outputs: Any, batch: Any, i: int) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def _fit(mode: str, sizes: dict[str, int], ckpt: Path | None = None, save: SaveAt | None = None, **kw: Any) -> Seen:
    tandem.seed_everything(SEED)
    model = Seen()
    kw = {"max_epochs": 2, "data_order": "global", **kw}
    trainer = quiet_trainer(callbacks=[save] if save else [], **kw)
    trainer.fit(model, CombinedLoader(_loaders(sizes), mode), ckpt_path=ckpt)
    model.batches = trainer.num_training_batches
    return model


def _order(name: str, epoch: int) -> list[int]:
    """Loader ``name``'s global order in ``epoch`` (each pass of it in that epoch draws the same)."""
    return torch.randperm(SIZES[name], generator=torch.Generator().manual_seed(SEED + epoch)).tolist()


def _stream(steps: list[dict[str, list[int] | None]], name: str) -> list[int]:
    return [i for step in steps if step[name] is not None for i in step[name]]


def _expected_rest(mode: str, before: list[dict[str, Any]], sizes: dict[str, int]) -> int:
    """The resumed epoch's batches left, by the definition: each loader's items left in its pass in progress, in
    batches of the resumed size; the mode's end."""
    left, first_pass = {}, {}
    for name, n in SIZES.items():
        given = len(_stream(before, name))
        at = given % n if given % n or not given else n  # a pass that ended exactly here: nothing left in it
        left[name], first_pass[name] = math.ceil((n - at) / sizes[name]), given <= n
    if mode == "min_size":
        return min(left.values())
    if mode == "max_size":
        return max(left.values())
    return max((left[name] for name in SIZES if first_pass[name]), default=0)


LAYOUTS = {  # (the checkpoint's batch sizes, the resumed run's)
    "halved": ({"a": 4, "b": 4}, {"a": 2, "b": 2}),
    "unequal": ({"a": 4, "b": 4}, {"a": 8, "b": 2}),
    "inside-a-batch": ({"a": 2, "b": 4}, {"a": 3, "b": 3}),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_loader_continues_its_order_on_another_layout_and_the_epoch_ends_by_the_mode(tmp_path, mode, layout):
    """Saved mid-epoch (max_size_cycle: "a" in its second pass), resumed with other batch sizes: each loader's
    samples of epoch 0 go on without a repeat or a gap in its order (its next pass too, for a cycling one), the
    epoch ends where the resumed sizes' mode ends it, and epoch 1 is the resumed layout's own."""
    saved, resumed_sizes = LAYOUTS[layout]
    step = 2 if mode == "min_size" else 4  # min_size: 3 batches an epoch with "a" in batches of 4
    whole = _fit(mode, saved, save=SaveAt(step, tmp_path / "mid.ckpt"))
    before = whole.seen[:step]
    with pytest.warns(UserWarning, match="several training loaders in the middle of epoch 0 on another layout"):
        resumed = _fit(mode, resumed_sizes, ckpt=tmp_path / "mid.ckpt")
    fresh = _fit(mode, resumed_sizes)  # the resumed layout's own epochs
    rest = len(resumed.seen) - fresh.batches
    assert rest == _expected_rest(mode, before, resumed_sizes)
    for name, n in SIZES.items():
        stream = _stream(before + resumed.seen[:rest], name)
        cycled = (_order(name, 0) * 3)[: len(stream)]
        assert stream == cycled, name  # no repeat, no gap, in the loader's order
        if mode != "max_size_cycle":
            assert len(stream) <= n
    ends = {name: len(_stream(before + resumed.seen[:rest], name)) for name in SIZES}
    if mode == "min_size":
        assert any(ends[name] == n for name, n in SIZES.items())
    elif mode == "max_size":
        assert ends == SIZES
    else:
        assert all(ends[name] >= n for name, n in SIZES.items()) and any(ends[k] % n == 0 for k, n in SIZES.items())
    assert resumed.seen[rest:] == fresh.seen[fresh.batches :]


@pytest.mark.parametrize("step", [5, 6], ids=["mid-epoch", "its-last-batch"])
def test_an_epoch_resumed_elsewhere_saves_and_resumes_again_on_its_layout(tmp_path, step):
    """After an elastic resume the loaders are not where the epoch's batch count alone would put them; a checkpoint
    later in that epoch records where it began, so resuming it (on the same layout) continues exactly, and what the
    epoch left undrawn does not reach the next one."""
    saved, resumed_sizes = LAYOUTS["unequal"]
    _fit("max_size_cycle", saved, save=SaveAt(4, tmp_path / "at4.ckpt"))
    with pytest.warns(UserWarning, match="another layout"):
        first = _fit("max_size_cycle", resumed_sizes, ckpt=tmp_path / "at4.ckpt")
    with pytest.warns(UserWarning, match="another layout"):
        _fit("max_size_cycle", resumed_sizes, ckpt=tmp_path / "at4.ckpt", save=SaveAt(step, tmp_path / "again.ckpt"))
    again = _fit("max_size_cycle", resumed_sizes, ckpt=tmp_path / "again.ckpt")
    assert again.seen == first.seen[step - 4 :]


def test_the_default_order_continues_each_loaders_pass_in_progress_with_its_drawn_seed(tmp_path):
    """data_order="sampler" on one process: each loader's epoch (and each new pass of a cycling one) is drawn from
    the global generator, as a RandomSampler draws it; the pass each loader is in continues with the seed it drew."""
    saved, resumed_sizes = LAYOUTS["unequal"]
    whole = _fit("max_size_cycle", saved, save=SaveAt(4, tmp_path / "at4.ckpt"), data_order="sampler")
    with pytest.warns(UserWarning, match="another layout"):
        resumed = _fit("max_size_cycle", resumed_sizes, ckpt=tmp_path / "at4.ckpt", data_order="sampler")
    for name, n in SIZES.items():
        done, kept = len(_stream(whole.seen[:4], name)), _stream(whole.seen[: whole.batches], name)
        in_pass = -(-done // n) * n - done  # the items left in the pass in progress
        shared = min(in_pass, len(kept) - done)
        assert shared > 0 and _stream(resumed.seen, name)[:shared] == kept[done : done + shared], name


class Backwards(Sampler):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self) -> int:
        return self.n


def test_a_loader_whose_order_tandem_cannot_reshard_refuses_another_layout_mid_epoch(tmp_path):
    tandem.seed_everything(SEED)
    loaders = _loaders({"a": 4, "b": 4})
    loaders["b"] = DataLoader(_marked(20, 100), batch_size=4, sampler=Backwards(20))
    quiet_trainer(max_epochs=1, callbacks=[SaveAt(2, tmp_path / "at2.ckpt")]).fit(Seen(), loaders)
    loaders["b"] = DataLoader(_marked(20, 100), batch_size=2, sampler=Backwards(20))
    with pytest.raises(TandemConfigError, match="middle of epoch 0 .* training loader 1 .* sampler of its own"):
        quiet_trainer(max_epochs=1).fit(Seen(), loaders, ckpt_path=tmp_path / "at2.ckpt")
