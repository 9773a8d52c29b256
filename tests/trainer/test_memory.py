"""A finished run leaves no reference cycle: its module, Trainer, optimizer and tensors are freed as soon as the
script drops them, without waiting for Python's garbage collector (the tests turn it off to prove it). ddp and
ddp_spawn are checked in the shared launches (``scripts/core_ddp_runs.py`` scenario ``memory``, and
``tests/strategies/scripts/spawn_runs.py``), fsdp in ``tests/strategies/test_fsdp_trainer.py``."""

from __future__ import annotations

import contextlib
import gc
import os
import weakref
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import tandem
from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import EarlyStopping, ModelCheckpoint
from tandem.loggers import CSVLogger
from tandem.strategies import DataParallelStrategy
from tandem.utilities.exceptions import TandemWarning
from tandem.utilities.memory import free_cuda_memory

WIDE = (4096, 3072)  # a 48 MiB weight: allocated (and freed) by mmap, so freeing it shows in the process's RSS


class Wide(TinyModule):
    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(*WIDE, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + 1e-6 * self.wide(torch.ones(1, WIDE[0], device=x.device)).sum()


@pytest.fixture(scope="module", autouse=True)
def _imports_done(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One fit first: torch imports some modules lazily (e.g. when the first optimizer is built), and an import
    leaves reference cycles through the frames that triggered it, those of the fit included."""
    root = tmp_path_factory.mktemp("warm")
    trainer = tandem.Trainer(accelerator="cpu", max_epochs=1, default_root_dir=root, logger=CSVLogger(root))
    trainer.fit(TinyModule(), loader(16), loader(16))
    trainer.test(TinyModule(), loader(16), verbose=False)


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _refs(trainer: tandem.Trainer, model: tandem.TrainingModule) -> dict[str, weakref.ref]:
    return {
        "module": weakref.ref(model),
        "trainer": weakref.ref(trainer),
        "optimizer": weakref.ref(trainer.optimizers[0]),
        "parameter": weakref.ref(next(model.parameters())),
    }


def _alive(refs: dict[str, weakref.ref]) -> list[str]:
    return [name for name, ref in refs.items() if ref() is not None]


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the RSS from /proc")
def test_a_finished_fit_is_freed_without_the_garbage_collector(tmp_path):
    trainer = tandem.Trainer(
        accelerator="cpu",
        max_epochs=2,
        default_root_dir=tmp_path,
        logger=CSVLogger(tmp_path),
        callbacks=[ModelCheckpoint(monitor="val_loss", save_last=True), EarlyStopping("val_loss")],
    )  # with the default progress bar and model summary
    model, train, val = Wide(), loader(32, batch_size=8), loader(16, batch_size=8)
    trainer.fit(model, train, val)
    trainer.test(model, val, verbose=False)
    wide_bytes = model.wide.weight.numel() * 4
    with collector_off():
        refs = {**_refs(trainer, model), "wide": weakref.ref(model.wide.weight)}
        before = rss()
        del trainer, model, train, val
        assert _alive(refs) == []
        # A second witness: the weight and its SGD momentum buffer went back to the operating system.
        assert before - rss() >= 1.5 * wide_bytes, f"RSS fell by {(before - rss()) / 2**20:.0f} MiB"


def test_what_users_read_after_a_fit_still_works(tmp_path):
    model = TinyModule()
    checkpoint = ModelCheckpoint(monitor="val_loss")
    trainer = quiet_trainer(max_epochs=2, default_root_dir=tmp_path, callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(model, loader(), loader(32))
    assert model.trainer is trainer  # the module refers to its Trainer weakly: it answers while the Trainer lives
    assert set(trainer.callback_metrics) >= {"train_loss", "val_loss", "val_acc"}
    assert os.path.exists(checkpoint.best_model_path) and trainer.checkpoint_callback is checkpoint
    assert trainer.test(model, loader(32), verbose=False)[0]["test_loss"] > 0
    with pytest.warns(TandemWarning, match=r"validate\(\) was called without a model: the best checkpoint"):
        assert (
            trainer.validate(dataloaders=loader(32), verbose=False)[0]["val_loss"] > 0
        )  # the last module, best weights
    with pytest.warns(TandemWarning, match="trained nothing: training is already at epoch 2"):
        trainer.fit(model, loader())  # fit again: the loop is done (max_epochs), as in Lightning
    assert trainer.global_step == 8
    again = quiet_trainer(max_epochs=1)
    again.fit(model, loader())  # the same module, another Trainer
    assert model.trainer is again and again.global_step == 4
    with collector_off():
        refs = _refs(again, model)
        del again
        assert _alive(refs) == ["module", "parameter"]  # the script and the first Trainer still hold the module
        with pytest.raises(RuntimeError, match="not attached to a Trainer: call trainer.fit.*keep the Trainer"):
            model.trainer  # noqa: B018 - its Trainer is gone
        del model, trainer
        assert _alive(refs) == []


@pytest.mark.filterwarnings("ignore:DataParallelStrategy on CPU devices")
def test_a_data_parallel_fit_is_freed_too():
    with collector_off():
        model = TinyModule()
        trainer = quiet_trainer(strategy=DataParallelStrategy(devices=["cpu"] * 2), max_epochs=1)
        trainer.fit(model, loader(), loader(32))
        refs = _refs(trainer, model)
        del trainer, model
        assert _alive(refs) == []


@pytest.mark.timeout(150)
def test_a_ddp_fit_is_freed_too(core_ddp):
    for alive in core_ddp["memory"]:  # per rank: which of module, trainer, optimizer, parameter outlived the drop
        assert [name for name in ("module", "trainer", "optimizer", "parameter") if alive[name]] == [], alive


@pytest.mark.gpu
def test_cuda_memory_returns_to_its_level_before_the_fit_without_a_collection(tmp_path):
    gc.collect()
    free_cuda_memory(torch.device("cuda"))  # an earlier test's cuBLAS workspace would be freed by this fit's end
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with collector_off():
        model = Wide()
        trainer = tandem.Trainer(accelerator="cuda", devices=1, max_epochs=1, default_root_dir=tmp_path)
        trainer.fit(model, loader(32, batch_size=8), loader(16, batch_size=8))
        held = torch.cuda.memory_allocated() - before
        assert held >= 2 * model.wide.weight.numel() * 4  # the weight and its momentum buffer
        del trainer, model
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before, f"{(torch.cuda.memory_allocated() - before) / 2**20} MiB held"
