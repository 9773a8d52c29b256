"""Numerical precision: autocast for the forward pass, loss scaling for float16, dtype conversion.

Two kinds, as in Lightning: *mixed* ("bf16-mixed", "16-mixed") keeps float32 parameters and runs the forward
pass under autocast; *true* ("64-true", "bf16-true", "16-true"; Lightning's ``DoublePrecision`` and
``HalfPrecision``) casts the parameters and the floating-point inputs to that dtype and makes it torch's
default dtype while the module is built (``trainer.init_module()``) and while a step runs.

The strategy owns one ``Precision``; the trainer never reads the precision string itself.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch.optim import Optimizer

from tandem.utilities.exceptions import TandemUserCodeError, bad_choice
from tandem.utilities.rank_zero import rank_zero_warn

_NO_CONTEXT = contextlib.nullcontext()
_AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
_PARAMETER_DTYPES = {"64-true": torch.float64, "bf16-true": torch.bfloat16, "16-true": torch.float16}


class _DefaultDtype:
    """Make ``dtype`` torch's default dtype inside the block. torch's default dtype belongs to the process, not
    the thread: dp's replica threads enter this together, so the first to enter saves the previous default and
    the last to leave puts it back."""

    _lock = threading.Lock()
    _depth = 0
    _previous: torch.dtype = torch.float32  # the default saved by the first to enter (torch's own until then)

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __enter__(self) -> None:
        cls = type(self)
        with cls._lock:
            if cls._depth == 0:
                cls._previous = torch.get_default_dtype()
            cls._depth += 1
            torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc: object) -> None:
        cls = type(self)
        with cls._lock:
            cls._depth -= 1
            if cls._depth == 0:
                torch.set_default_dtype(cls._previous)


class Precision:
    """How one precision setting changes the forward pass, backward pass and optimizer step.

    Args:
        precision: ``"32-true"`` (default); ``"bf16-mixed"`` (autocast to bfloat16, CPU and CUDA) or
            ``"16-mixed"`` (autocast to float16 with a ``GradScaler``); ``"64-true"``, ``"bf16-true"`` or
            ``"16-true"`` (parameters, floating-point inputs and tensors created in a step in float64,
            bfloat16 or float16; no loss scaling). On the CPU, bfloat16 and float16 arithmetic is several times
            slower than float32, and float16 is slower still: use the 16-bit precisions on a GPU.
        device_type: ``"cpu"`` or ``"cuda"``; set by the strategy once it knows its device.

    Example:
        ```python
        Trainer(precision="bf16-true")  # same as Trainer(plugins=[Precision("bf16-true")])
        ```
    """

    SUPPORTED: ClassVar[tuple[str, ...]] = ("32-true", "64-true", "bf16-true", "16-true", "bf16-mixed", "16-mixed")
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
        #: the dtype of the parameters and inputs under a "true" precision other than float32, else None
        self.parameter_dtype: torch.dtype | None = _PARAMETER_DTYPES.get(precision)
        #: whether ``forward_context`` does anything (the strategies skip it on the per-step path when not)
        self.has_forward_context: bool = self.autocast_dtype is not None or self.parameter_dtype is not None
        self.device_type = device_type
        self.scaler: torch.amp.GradScaler | None = None
        if precision == "16-mixed":
            self.scaler = torch.amp.GradScaler(device_type)
        self._unscaled: set[int] = set()  # optimizers unscaled since their last step (unscale once per step)
        self._backwards = 0  # scaled backward passes so far (float16)
        #: the module's ``backward`` hook where the module overrides it (set for each fit), else None: ``loss.backward``
        self.module_backward: Callable[..., None] | None = None
        #: per optimizer (id), ``_backwards`` when it was last unscaled: a step needs a scaled backward since
        self._backwards_at_unscale: dict[int, int] = {}

    def __repr__(self) -> str:
        return f"Precision({self.precision!r})"

    def set_device_type(self, device_type: str) -> None:
        """Called by the strategy when its device is known; rebuilds the scaler for that device."""
        if device_type != self.device_type:
            self.device_type = device_type
            if self.scaler is not None:
                self.scaler = torch.amp.GradScaler(device_type)

    def tensor_init_context(self) -> contextlib.AbstractContextManager:
        """Floating-point tensors created inside get the parameter dtype of a "true" precision (float64,
        bfloat16 or float16); other precisions change nothing."""
        dtype = self.parameter_dtype
        return _NO_CONTEXT if dtype is None else _DefaultDtype(dtype)

    def module_init_context(self) -> contextlib.AbstractContextManager:
        """Where ``trainer.init_module()`` builds the module: as
        [`tensor_init_context`][tandem.strategies.Precision.tensor_init_context]."""
        return self.tensor_init_context()

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Cast the module's floating-point parameters and buffers to the parameter dtype ("true" precisions)."""
        return module if self.parameter_dtype is None else module.to(dtype=self.parameter_dtype)

    def convert_input(self, batch: Any) -> Any:
        """Cast the floating-point tensors of a batch to the parameter dtype ("true" precisions)."""
        dtype = self.parameter_dtype
        if dtype is None:
            return batch
        return apply_to_collection(batch, torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t)

    def forward_context(self) -> contextlib.AbstractContextManager:
        """Around each step: autocast for mixed precision; the parameter dtype as torch's default dtype for a
        "true" precision (tensors the step creates match the parameters); a shared no-op context otherwise.

        Autocast keeps no cache of its casts (``cache_enabled=False``, as in Lightning): a cached cast outlives an
        optimizer step taken inside ``training_step`` (manual optimization), so the next forward of the same step
        would run on the weights as they were before it."""
        if self.autocast_dtype is not None:
            return torch.autocast(self.device_type, dtype=self.autocast_dtype, cache_enabled=False)
        return _NO_CONTEXT if self.parameter_dtype is None else _DefaultDtype(self.parameter_dtype)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``loss.backward(*args, **kwargs)``, of the scaled loss under float16 scaling; through the module's
        ``backward`` hook where it overrides it (Lightning's: the hook gets the scaled loss)."""
        if self.scaler is not None:
            self._backwards += 1
            loss = self.scaler.scale(loss)
        if self.module_backward is None:
            loss.backward(*args, **kwargs)
        else:
            self.module_backward(loss, *args, **kwargs)

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Undo loss scaling on the gradients, so clipping and hooks see true values (once per step). Refuses
        gradients that no scaled backward made since the optimizer's last step (a ``loss.backward()`` of the
        user's own, in place of ``self.manual_backward(loss)``)."""
        if self.scaler is None:
            return
        key = id(optimizer)
        if key in self._unscaled:
            return
        if self._backwards_at_unscale.get(key, 0) == self._backwards:
            raise _unscaled_backward(self.precision)
        self._backwards_at_unscale[key] = self._backwards
        self._unscaled.add(key)
        self.scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any) -> bool:
        """Step the optimizer; returns False when the scaler skipped the step (inf/NaN gradients).

        ``closure`` (forward and backward, then the pre-step hooks) runs inside ``optimizer.step`` in full
        precision, as torch optimizers such as LBFGS expect; with float16 scaling it runs once, first.

        With float16 scaling this is torch's recipe, ``scaler.step(optimizer)`` then ``scaler.update()`` (after
        each step, as in Lightning), and reads the device once, as the recipe does: ``scaler.step`` reads whether
        the gradients hold inf/NaN and calls ``optimizer.step`` only when they do not, which the optimizer's
        step post-hook tells without a read of its own. An optimizer that unscales in its own step (``fused=True``)
        decides on the device without the host knowing: its steps count as taken (the per-step schedulers step).
        """
        scaler = self.scaler
        if scaler is None:
            if closure is None:
                optimizer.step(**kwargs)
            else:
                optimizer.step(closure, **kwargs)
            return True
        if closure is not None and closure() is None:  # the step ran no backward: nothing to unscale or step
            return False  # (Lightning's rule for a training_step that returned None)
        taken: list[bool] = []
        handle = optimizer.register_step_post_hook(lambda *_: taken.append(True))
        try:
            scaler.step(optimizer, **kwargs)
        finally:
            handle.remove()
        scaler.update()
        self._unscaled.clear()  # update() resets every optimizer's unscale state
        return bool(taken)

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


def _unscaled_backward(precision: str) -> TandemUserCodeError:
    return TandemUserCodeError(
        f"An optimizer stepped under precision={precision!r} with no backward through tandem since its last step: "
        "its gradients were not scaled by the GradScaler, so unscaling them before the step would be wrong. A "
        "loss.backward() of your own skips the scaler: under manual optimization call self.manual_backward(loss) "
        "instead of loss.backward(); under automatic optimization return the loss from training_step and let the "
        "Trainer run backward."
    )
