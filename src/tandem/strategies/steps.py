"""The module's steps as one callable: through a wrapper's ``forward`` (``StepForward``), or each step method
compiled on its own (``CompiledSteps``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import nn

from tandem.utilities.compile import Compiler


class StepForward(nn.Module):
    """Routes ``forward`` to the module's step method, so wrappers (DDP, FSDP, DataParallel) see each step
    as a forward call: DDP prepares its gradient reduction there, FSDP gathers the parameters there,
    DataParallel splits the batch there."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.module, method)(*args, **kwargs)


class CompiledSteps:
    """A module's step methods, each compiled on its first call (as Lightning's ``from_compiled`` does), called
    as a ``StepForward`` is: ``steps("training_step", batch, batch_idx)``."""

    def __init__(self, module: nn.Module, compiler: Compiler) -> None:
        self.module = module
        self._compiler = compiler
        self._steps: dict[str, Callable[..., Any]] = {}

    def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        step = self._steps.get(method)
        if step is None:
            step = self._steps[method] = self._compiler(getattr(self.module, method))
        return step(*args, **kwargs)


@functools.cache
def _start_graphs_at_the_steps() -> None:
    """Dynamo compiles from the frames ``StepForward.forward`` calls (``training_step``, ...), not from that
    one trampoline: each step method keeps its own cache of graphs (and its own recompile limit), as when the
    methods themselves are compiled (Lightning's ``from_compiled``). Called once, when a module comes compiled."""
    try:
        from torch._dynamo.decorators import skip  # private: the frame is skipped, the frames it calls are not
    except ImportError:  # graphs start at StepForward.forward: the same graphs, one cache for all step methods
        return
    skip(StepForward.forward)
