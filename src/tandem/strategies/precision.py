"""Numerical precision: autocast for the forward pass, loss scaling for float16, dtype conversion.

The strategy owns one ``Precision``; the trainer never reads the precision string itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch.optim import Optimizer

from tandem.utilities.exceptions import bad_choice
from tandem.utilities.rank_zero import rank_zero_warn

_NO_CONTEXT = contextlib.nullcontext()
_AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


class Precision:
    """How one precision setting changes the forward pass, backward pass and optimizer step.

    Args:
        precision: ``"32-true"`` (default), ``"64-true"``, ``"bf16-mixed"`` (autocast to bfloat16,
            CPU and CUDA) or ``"16-mixed"`` (autocast to float16 with a ``GradScaler``).
        device_type: ``"cpu"`` or ``"cuda"``; set by the strategy once it knows its device.
    """

    SUPPORTED: ClassVar[tuple[str, ...]] = ("32-true", "64-true", "bf16-mixed", "16-mixed")
    _ALIASES: ClassVar[dict[Any, str]] = {
        32: "32-true",
        "32": "32-true",
        64: "64-true",
        "64": "64-true",
        16: "16-mixed",
        "16": "16-mixed",
        "bf16": "bf16-mixed",
    }

    def __init__(self, precision: str | int = "32-true", device_type: str = "cpu") -> None:
        precision = self._ALIASES.get(precision, precision)
        if precision not in self.SUPPORTED:
            raise bad_choice("precision", precision, self.SUPPORTED)
        self.precision: str = precision
        self.autocast_dtype: torch.dtype | None = _AUTOCAST_DTYPES.get(precision)
        self.device_type = device_type
        self.scaler: torch.amp.GradScaler | None = None
        if precision == "16-mixed":
            self.scaler = torch.amp.GradScaler(device_type)
        self._last_step_skipped = False
        self._unscaled: set[int] = set()  # optimizers unscaled since their last step (unscale once per step)

    def set_device_type(self, device_type: str) -> None:
        """Called by the strategy when its device is known; rebuilds the scaler for that device."""
        if device_type != self.device_type:
            self.device_type = device_type
            if self.scaler is not None:
                self.scaler = torch.amp.GradScaler(device_type)

    @contextlib.contextmanager
    def module_init_context(self) -> Iterator[None]:
        """Floating-point tensors created inside are float64 under "64-true"; other precisions change nothing."""
        if self.precision != "64-true":
            yield
            return
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            yield
        finally:
            torch.set_default_dtype(previous)

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.double() if self.precision == "64-true" else module

    def convert_input(self, batch: Any) -> Any:
        if self.precision != "64-true":
            return batch
        return apply_to_collection(batch, torch.Tensor, lambda t: t.double() if t.is_floating_point() else t)

    def forward_context(self) -> contextlib.AbstractContextManager:
        """Autocast for mixed precision; a shared no-op context otherwise (cheap on the per-step path)."""
        dtype = self.autocast_dtype
        return _NO_CONTEXT if dtype is None else torch.autocast(self.device_type, dtype=dtype)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward(*args, **kwargs)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Undo loss scaling on the gradients, so clipping and hooks see true values (once per step)."""
        if self.scaler is not None and id(optimizer) not in self._unscaled:
            self._unscaled.add(id(optimizer))
            self.scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer: Optimizer, closure: Any = None, **kwargs: Any) -> bool:
        """Step the optimizer; returns False when the scaler skipped the step (inf/NaN gradients).

        ``closure`` (forward and backward, then the pre-step hooks) runs inside ``optimizer.step`` in full
        precision, as torch optimizers such as LBFGS expect; with float16 scaling it runs once, first.
        """
        if self.scaler is None:
            if closure is None:
                optimizer.step(**kwargs)
            else:
                optimizer.step(closure, **kwargs)
            return True
        if closure is not None:
            closure()
        scale_before = self.scaler.get_scale()
        self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        self._unscaled.clear()  # update() resets every optimizer's unscale state
        # The scaler lowers its scale exactly when it found inf/NaN and skipped the step.
        return self.scaler.get_scale() >= scale_before

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict()} if self.scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def for_device(precision: Precision, device_type: str) -> Precision:
    """The Trainer's ``precision`` for a device of ``device_type``. ``"16-mixed"`` on the CPU becomes
    ``"bf16-mixed"`` with a warning, as in Lightning: CPUs have no fast float16 arithmetic (autocast to float16
    there runs several times slower than float32), and bfloat16 needs no loss scaling. A strategy built with
    ``precision="16-mixed"`` (or a ``Precision`` instance) keeps it: that is asked for explicitly."""
    if precision.precision != "16-mixed" or device_type != "cpu":
        return precision
    rank_zero_warn(
        "You passed Trainer(accelerator='cpu', precision='16-mixed') but AMP with float16 is not supported on "
        "the CPU (it runs slower than float32 there). Using precision='bf16-mixed' instead. To keep float16 on the "
        "CPU anyway, build the strategy with it, e.g. strategy=SingleDeviceStrategy('cpu', precision='16-mixed')."
    )
    return Precision("bf16-mixed", device_type)
