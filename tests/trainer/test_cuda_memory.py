"""A run on CUDA ends by freeing what torch keeps for itself: cuBLAS's workspaces (about 75 MB on an H200, held by
the caching allocator) and the allocator's cache, as Lightning's teardown does. What stays allocated is what the
caller holds: the module (which stays on its device) and, through the Trainer, the optimizer's state; not the last
batch.

On the CPU the tests check that every entry point ends through ``free_cuda_memory`` with the strategy's device,
which does nothing there, and that no batch outlives its run; on a GPU, the bytes themselves."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tandem
from helpers import TinyModule, loader, quiet_trainer
from tandem.utilities import memory


class Linear(tandem.TrainingModule):
    """Matrix products (cuBLAS) and nothing logged: after a run only parameters and optimizer state remain."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        self.net(batch[0])

    def test_step(self, batch, batch_idx):
        self.net(batch[0])

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def test_every_entry_point_ends_by_freeing_cuda_memory_of_its_device(monkeypatch):
    freed: list[torch.device] = []
    monkeypatch.setattr("tandem.trainer.run.free_cuda_memory", freed.append)
    trainer = quiet_trainer(max_epochs=1)
    model = Linear()
    trainer.fit(model, loader(32), loader(16))
    trainer.validate(model, loader(16), verbose=False)
    trainer.test(model, loader(16), verbose=False)
    trainer.predict(model, loader(16), return_predictions=False)
    assert freed == [torch.device("cpu")] * 4


def test_a_failed_run_frees_cuda_memory_too(monkeypatch):
    class Failing(TinyModule):
        def training_step(self, batch, batch_idx):
            raise ValueError("boom")

    freed: list[torch.device] = []
    monkeypatch.setattr("tandem.trainer.run.free_cuda_memory", freed.append)
    with pytest.raises(ValueError, match="boom"):
        quiet_trainer(max_epochs=1, limit_val_batches=0).fit(Failing(), loader(32))
    assert freed == [torch.device("cpu")]


class LastBatches(tandem.Callback):
    """Weak references to the last batch of each stage (its tensors are the loader's, made for that batch)."""

    def __init__(self) -> None:
        self.batches: dict[str, weakref.ref] = {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batches["train"] = weakref.ref(batch[0])

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        self.batches["validation"] = weakref.ref(batch[0])

    def on_predict_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        self.batches["predict"] = weakref.ref(batch[0])


def test_a_finished_run_keeps_no_batch():
    """On CUDA a batch kept by the Trainer would stay allocated (the cache cannot give it back)."""
    last = LastBatches()
    trainer = quiet_trainer(max_epochs=1, callbacks=[last])
    model = Linear()
    gc.collect()
    gc.disable()
    try:
        trainer.fit(model, loader(32), loader(16))
        assert {stage: ref() is None for stage, ref in last.batches.items()} == {"train": True, "validation": True}
        trainer.predict(model, loader(16), return_predictions=False)
        assert last.batches["predict"]() is None
    finally:
        gc.enable()


def test_free_cuda_memory_clears_the_workspaces_then_the_cache_on_cuda_only(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: calls.append("workspaces"), raising=False)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("cache"))
    memory.free_cuda_memory(torch.device("cpu"))
    quiet_trainer(max_epochs=1).fit(Linear(), loader(32), loader(16))  # the real call at the end of a CPU fit
    assert calls == []
    memory.free_cuda_memory(torch.device("cuda", 0))
    assert calls == ["workspaces", "cache"]


def test_free_cuda_memory_leaves_the_runs_own_error_to_report(monkeypatch):
    def broken() -> None:
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(torch._C, "_cuda_clearCublasWorkspaces", broken, raising=False)
    memory.free_cuda_memory(torch.device("cuda", 0))  # no second error on top of the run's


def _allocated(tensors) -> int:
    """Bytes the caching allocator counts for ``tensors``, one block each (rounded up to 512 bytes)."""
    return sum(-(-t.untyped_storage().nbytes() // 512) * 512 for t in tensors)


@pytest.mark.gpu
def test_a_finished_cuda_run_holds_only_the_module_and_the_optimizer_state():
    """Without a garbage collection: the memory is free when the run returns."""
    memory.free_cuda_memory(torch.device("cuda"))  # no workspace of an earlier test in the baseline
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    gc.collect()
    gc.disable()
    try:
        model = Linear()
        trainer = quiet_trainer(accelerator="cuda", devices=1, max_epochs=1)
        trainer.fit(model, loader(64), loader(32))
        params = list(model.parameters())
        momentum = [s["momentum_buffer"] for s in trainer.optimizers[0].state.values()]
        assert all(p.is_cuda for p in params) and len(momentum) == len(params)
        expected = _allocated(params) + _allocated(momentum)
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - before
        assert held == expected, (
            f"fit: {held} bytes held, {expected} expected ({(held - expected) / 2**20:.1f} MiB more)"
        )
        for run in (
            lambda: trainer.validate(model, loader(32), verbose=False),
            lambda: trainer.test(model, loader(32), verbose=False),
            lambda: trainer.predict(model, loader(32), return_predictions=False),
        ):
            run()
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated() - before
            assert _allocated(params) <= held <= expected, f"{held} bytes held, {expected} at most"
    finally:
        gc.enable()
