"""``ManualOptimization``: ``training_step`` calls ``self.manual_backward`` and ``opt.step()``; each step is counted,
and a step on gradients no ``zero_grad`` cleared is reported."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.optim import Optimizer

from tandem.trainer.optimization.base import Optimization
from tandem.utilities.exceptions import TandemUserCodeError, unzeroed_gradients
from tandem.utilities.rank_zero import rank_zero_warn


class ManualOptimization(Optimization):
    """``training_step`` does the backward and the steps (``self.manual_backward``, ``opt.step()``); each step
    counts toward ``global_step``, each batch toward the loggers' step (as in Lightning)."""

    automatic = False
    _no_step_advice = (
        "Under manual optimization (automatic_optimization = False) training_step steps the optimizers itself: "
        "opt = self.optimizers(); opt.zero_grad(); self.manual_backward(loss); opt.step()."
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: optimizers stepped whose gradients no zero_grad has cleared since (see ``_Stepped``); emptied for
        #: good once the mistake was reported (once per fit)
        self._stepped: dict[Optimizer, _Stepped] = {}
        self._unzeroed_warned = False

    def run(self, batch: Any, batch_idx: int) -> tuple[Any, torch.Tensor | None]:
        output = self._training_step(batch, batch_idx)
        self.loop.batches_stepped += 1
        loss = output.get("loss") if isinstance(output, Mapping) else output
        return output, loss if isinstance(loss, torch.Tensor) else None

    def step(self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any) -> None:
        """``opt.step()`` in a manual ``training_step``: through the strategy's precision, then counted."""
        step = self.calls.optimizer_step
        if closure is None:
            if optimizer in self._stepped:
                self._check_zeroed(optimizer)
            self._prepare(optimizer)
            step(optimizer, **kwargs)
        else:  # the closure zeroes and runs backward inside the step: not checked

            def run_closure() -> Any:  # a closure of the user's (e.g. LBFGS), which the optimizer may call again
                with torch.enable_grad():
                    result = closure()
                self._prepare(optimizer)
                return result

            step(optimizer, run_closure, **kwargs)
        self.loop.global_step += 1
        if not self._unzeroed_warned:
            stepped = _Stepped.on(optimizer)
            if stepped is not None:
                self._stepped[optimizer] = stepped

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``self.manual_backward(loss)``: the strategy's backward. Stepped optimizers whose gradients a zero_grad
        cleared since their step are forgotten first, and the others note what this backward added, so that
        their next step can tell a missing zero_grad (``_check_zeroed``) from a zeroing in place."""
        stepped = self._stepped
        if stepped:
            for optimizer in [o for o, s in stepped.items() if not s.unchanged()]:
                del stepped[optimizer]
        self.calls.backward(loss, *args, **kwargs)
        for entry in stepped.values():
            entry.added()

    def zeroed(self, optimizer: Optimizer) -> None:
        """``zero_grad()`` of an optimizer from ``self.optimizers()``."""
        self._stepped.pop(optimizer, None)

    def gradients_changed(self, optimizer: Optimizer) -> None:
        """tandem changed ``optimizer``'s gradients in place (``self.clip_gradients``: unscaled, clipped): not a
        zero_grad."""
        entry = self._stepped.get(optimizer)
        if entry is not None:
            entry.added()

    def _check_zeroed(self, optimizer: Optimizer) -> None:
        """Before a step: warn (once per fit) when ``optimizer``'s gradients are the ones of its previous step, with
        at most manual_backward's additions: no zero_grad ran in between."""
        if self._stepped.pop(optimizer).unchanged():
            self._unzeroed_warned = True
            self._stepped.clear()
            index = self.optimizers.index(optimizer)
            where = f"self.optimizers()[{index}]" if len(self.optimizers) > 1 else "self.optimizers()"
            rank_zero_warn(unzeroed_gradients(f"Optimizer {where} ({type(optimizer).__name__})"))

    def _prepare(self, optimizer: Optimizer) -> None:
        self.context.strategy.precision.unscale_gradients(optimizer)
        self.context.hooks.call("on_before_optimizer_step", optimizer)

    def hook_outputs(self, output: Any, loss: torch.Tensor | None) -> Any:
        """Under manual optimization ``training_step`` may return nothing, a tensor or a dict (Lightning's rule)."""
        if output is None:
            return None
        if isinstance(output, torch.Tensor):
            return {"loss": output.detach()}
        if isinstance(output, Mapping):
            value = output.get("loss")
            return {**output, "loss": value.detach()} if isinstance(value, torch.Tensor) else dict(output)
        raise TandemUserCodeError(
            f"training_step returned {type(output).__name__}; under manual optimization it returns nothing, a "
            "tensor or a dict."
        )


class _Stepped:
    """An optimizer's gradients as its latest ``step()`` left them, read from one of its parameters (no scan of the
    others). While that parameter holds the same gradient tensor, changed only by ``manual_backward`` (which this
    records), no zero_grad ran: ``zero_grad()`` and ``module.zero_grad()`` (``set_to_none=True``) and ``p.grad =
    None`` leave None or, after a backward, a new tensor; ``set_to_none=False`` zeroes the tensor in place, which
    advances its version counter."""

    __slots__ = ("grad", "param", "version")

    def __init__(self, param: torch.Tensor, grad: torch.Tensor) -> None:
        self.param, self.grad, self.version = param, weakref.ref(grad), grad._version

    @classmethod
    def on(cls, optimizer: Optimizer) -> _Stepped | None:
        """The first of ``optimizer``'s parameters that has a gradient (nearly always its first), or None."""
        for group in optimizer.param_groups:
            for param in group["params"]:
                grad = param.grad
                if grad is not None:
                    return cls(param, grad)
        return None

    def unchanged(self) -> bool:
        """The gradient is the stepped one, changed by nothing but what ``added`` recorded."""
        grad = self.param.grad
        return grad is not None and grad is self.grad() and grad._version == self.version

    def added(self) -> None:
        """A backward (or tandem's unscaling and clipping) changed the gradient in place: not a zero_grad."""
        grad = self.param.grad
        if grad is not None and grad is self.grad():
            self.version = grad._version
