"""Counting host reads of device values (each one a host-device sync on a GPU) without a GPU.

A read is an op that needs a value the device computed, on the host, before Python can go on:

- ``scalar``: ``aten::_local_scalar_dense``, what ``.item()``, ``bool(t)``, ``float(t)`` and ``int(t)`` run;
- ``copy``: ``.tolist()``, ``.numpy()`` and ``.cpu()``, and on a GPU ``.to(<a cpu device>)``. On the CPU these
  dispatch no op at all (the tensor is already in host memory), so they are counted as Python calls (a
  ``TorchFunctionMode``). On the CPU ``.to("cpu")`` is not counted: it cannot be told from a move onto the device
  (``t.to(device)``, which ``GradScaler`` does with its scale every step, and which is no read on a GPU);
- ``nonzero``: ops whose output shape depends on the values (``aten::nonzero``, ``aten::masked_select``, indexing
  with a boolean mask), which wait for the device to know the shape.

Only tensors on ``device`` count (on the CPU: every tensor). Each read also records where it came from (the
innermost frame outside torch), so that a failing comparison says which line reads.

Also here: the paired workloads (:func:`run_tandem`, :func:`run_hand`) that ``tests/trainer/test_host_syncs.py``
counts on the CPU and ``benchmarks/gpu_check.py`` on CUDA, with torch's profiler beside.

Example::

    reads = HostReads()
    with reads:
        loss.item()
    assert reads.counts == {"scalar": 1}
"""

from __future__ import annotations

import contextlib
import traceback
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, TensorDataset

import tandem

_SCALAR_OPS = {torch.ops.aten._local_scalar_dense.default}
_SHAPE_OPS = {torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default}
_INDEX_OPS = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default}
_COPY_METHODS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu}


class HostReads:
    """Counts the host reads of tensors on ``device`` while entered (or between :meth:`start` and :meth:`stop`).

    ``counts``: reads by kind (``scalar``, ``copy``, ``nonzero``); ``where``: reads by kind and source line.
    """

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device).type
        self.counts: Counter[str] = Counter()
        self.where: Counter[tuple[str, str]] = Counter()
        self._modes: list[Any] = []

    def start(self) -> None:
        if self._modes:
            raise RuntimeError("HostReads is already counting")
        self._modes = [_Dispatch(self), _Functions(self)]
        for mode in self._modes:
            mode.__enter__()

    def stop(self) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(None, None, None)
        self._modes = []

    def __enter__(self) -> HostReads:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def record(self, kind: str, tensor: Any) -> None:
        if isinstance(tensor, torch.Tensor) and tensor.device.type != self.device:
            return
        self.counts[kind] += 1
        self.where[(kind, _caller())] += 1

    def report(self) -> str:
        """The reads by kind and source line, most frequent first."""
        return "; ".join(f"{kind} {count}x at {line}" for (kind, line), count in self.where.most_common()) or "none"


class SteadyState(tandem.Callback):
    """Runs ``counter`` (anything with ``start()`` and ``stop()``: a :class:`HostReads`, a profiler window) from
    ``on_train_batch_start`` of batch ``first`` to ``on_train_batch_end`` of batch ``last`` (of a one-epoch fit): the
    steady-state steps, the loop's work between them included. Pick a window without logging steps
    (``log_every_n_steps`` beyond it) to count what every step costs."""

    def __init__(self, first: int, last: int, counter: Any) -> None:
        self.first, self.last, self.counter = first, last, counter
        self.counting = False

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.first:
            self.counter.start()
            self.counting = True

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.last:
            self.counting = False
            self.counter.stop()

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        if self.counting:
            self.counting = False
            self.counter.stop()


# ====================================================================== the paired workloads
# tests/trainer/test_host_syncs.py runs them on the CPU; benchmarks/gpu_check.py on CUDA, under torch's profiler too.
BATCHES, FIRST, LAST = 12, 4, 11  # counted: batches 4..11 of a one-epoch fit, the loop's work between them included
CLIP = 1.0
AUTOCAST = {"32-true": None, "16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


@dataclass(frozen=True)
class Setup:
    manual: bool = False  # two optimizers stepped in training_step
    accumulate: int = 1
    clip: bool = False  # by norm, CLIP (automatic: the Trainer's gradient_clip_val; manual: self.clip_gradients)
    scheduler: bool = False  # a per-step StepLR (automatic optimization)
    rollback: bool = False  # Trainer(on_nonfinite="rollback")

    def steps(self) -> int:
        """Optimizer steps in the counted batches."""
        return (LAST - FIRST + 1) * (2 if self.manual else 1) // self.accumulate


SETUPS = {
    "automatic": Setup(),
    "automatic-accumulate-clip-scheduler": Setup(accumulate=2, clip=True, scheduler=True),
    "automatic-rollback": Setup(rollback=True),
    "manual": Setup(manual=True),
    "manual-clip-rollback": Setup(manual=True, clip=True, rollback=True),
}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 3)

    def loss(self, x: torch.Tensor, y: torch.Tensor, which: int = 0) -> torch.Tensor:
        loss = F.cross_entropy(self.b(torch.relu(self.a(x))).float(), y)
        return loss if which == 0 else 0.5 * loss


def _optimizers(net: Net, setup: Setup) -> list[torch.optim.Optimizer]:
    if setup.manual:  # a GAN's shape: two optimizers, each over part of the model
        return [torch.optim.SGD(net.a.parameters(), lr=0.1), torch.optim.SGD(net.b.parameters(), lr=0.05)]
    return [torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)]


class _Module(tandem.TrainingModule):
    def __init__(self, setup: Setup) -> None:
        super().__init__()
        self.setup_ = setup
        self.automatic_optimization = not setup.manual
        self.net = Net()

    def training_step(self, batch, batch_idx):
        x, y = batch
        if not self.setup_.manual:
            loss = self.net.loss(x, y)
            self.log("loss", loss)
            return loss
        for which, opt in enumerate(self.optimizers()):
            opt.zero_grad()
            loss = self.net.loss(x, y, which)
            self.manual_backward(loss)
            if self.setup_.clip:
                self.clip_gradients(opt, CLIP, "norm")
            opt.step()
            self.log(f"loss{which}", loss)
        return None

    def configure_optimizers(self):
        opts = _optimizers(self.net, self.setup_)
        if not self.setup_.scheduler:
            return opts
        scheduler = torch.optim.lr_scheduler.StepLR(opts[0], step_size=1, gamma=0.99)
        return {"optimizer": opts[0], "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _batches() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16 * BATCHES, 8, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()), batch_size=16)


def run_tandem(precision: str, setup: Setup, counter: Any, device: str = "cpu") -> None:
    """``Trainer.fit`` of ``setup`` at ``precision`` on ``device``, ``counter`` running over the counted batches."""
    torch.manual_seed(0)
    if device == "cpu" and precision == "16-mixed":  # float16 on the CPU: asked for by building the strategy with it
        kwargs: dict[str, Any] = dict(strategy=tandem.strategies.SingleDeviceStrategy("cpu", precision="16-mixed"))
    else:
        kwargs = dict(accelerator=device, devices=1, precision=precision)
    trainer = tandem.Trainer(
        **kwargs,
        max_epochs=1,
        log_every_n_steps=100,  # no logging step among the counted batches
        accumulate_grad_batches=setup.accumulate,
        gradient_clip_val=CLIP if setup.clip and not setup.manual else None,
        on_nonfinite="rollback" if setup.rollback else "raise",
        callbacks=[SteadyState(FIRST, LAST, counter)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(_Module(setup), _batches())
    assert trainer.global_step == BATCHES * (2 if setup.manual else 1) // setup.accumulate


def run_hand(precision: str, setup: Setup, counter: Any, device: str = "cpu") -> None:
    """The loop a user writes for ``setup`` (torch's AMP recipe for float16), ``counter`` running over the same
    batches."""
    torch.manual_seed(0)
    net = Net().to(device)
    opts = _optimizers(net, setup)
    scheduler = torch.optim.lr_scheduler.StepLR(opts[0], step_size=1, gamma=0.99) if setup.scheduler else None
    scaler = torch.amp.GradScaler(device) if precision == "16-mixed" else None
    dtype = AUTOCAST[precision]

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast(device, dtype=dtype) if dtype is not None else contextlib.nullcontext()

    def backward(loss: torch.Tensor) -> None:
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def step(opt: torch.optim.Optimizer) -> None:
        if setup.clip:
            if scaler is not None:
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], CLIP)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()

    for i, (x, y) in enumerate(_batches()):
        if i == FIRST:
            counter.start()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if setup.manual:
            for which, opt in enumerate(opts):
                opt.zero_grad()
                with autocast():
                    loss = net.loss(x, y, which)
                backward(loss)
                step(opt)
        else:
            with autocast():
                loss = net.loss(x, y)
            backward(loss / setup.accumulate if setup.accumulate > 1 else loss)
            if (i + 1) % setup.accumulate == 0:
                step(opts[0])
                opts[0].zero_grad(set_to_none=True)
                if scheduler is not None:
                    scheduler.step()
        if i == LAST:
            counter.stop()


class _Dispatch(TorchDispatchMode):
    def __init__(self, reads: HostReads) -> None:
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _SCALAR_OPS:
            self.reads.record("scalar", args[0])
        elif (
            func in _SHAPE_OPS
            or func in _INDEX_OPS
            and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ()))
        ):
            self.reads.record("nonzero", args[0])
        return func(*args, **(kwargs or {}))


class _Functions(TorchFunctionMode):
    def __init__(self, reads: HostReads) -> None:
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _COPY_METHODS or (func is torch.Tensor.to and self.reads.device != "cpu" and _to_cpu(args, kwargs)):
            self.reads.record("copy", args[0])
        return func(*args, **kwargs)


def _to_cpu(args: tuple, kwargs: dict) -> bool:
    """``tensor.to(...)`` names a CPU destination (a device, a device string, or a CPU tensor)."""
    for target in (*args[1:], kwargs.get("device"), kwargs.get("other")):
        if isinstance(target, torch.Tensor):
            return target.device.type == "cpu"
        if isinstance(target, (str, torch.device)):
            return torch.device(target).type == "cpu"
    return False


def _caller() -> str:
    """The innermost frame outside torch and this file: ``path:line (function)``."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        name = frame.filename.replace("\\", "/")
        if "/torch/" not in name and not name.endswith("/sync_counting.py"):
            short = name.split("/src/")[-1].split("/tests/")[-1]
            return f"{short}:{frame.lineno} ({frame.name})"
    return "?"
