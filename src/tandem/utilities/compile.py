"""``torch.compile``'d modules: what the Trainer runs is the module inside, compiled again after wrapping.

``torch.compile(module)`` returns a ``torch._dynamo.OptimizedModule`` that holds the module (``_orig_mod``) and
the compiler with the user's settings (``dynamo_ctx``: backend, mode, ``dynamic``, ``fullgraph``, options).
Applied to another module, that compiler compiles it with the same settings, which is how a strategy compiles
the wrapper it built (DDP, FSDP) around the module. The module itself stays plain: its ``state_dict()`` has no
``_orig_mod.`` prefix, hooks and ``self.log`` see it, and a checkpoint loads into an eager or compiled module.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from torch import nn

#: compiles a module with the settings of one ``torch.compile`` call (an ``OptimizedModule``'s ``dynamo_ctx``)
Compiler = Callable[[nn.Module], nn.Module]


def unwrap_compiled(obj: Any) -> tuple[Any, Compiler | None]:
    """``(module, compiler)`` for ``torch.compile(module)``; ``(obj, None)`` for anything else.

    ``compiler(other)`` returns ``other`` compiled with the same settings (Lightning's ``from_compiled`` reuses
    the same ``dynamo_ctx``; Fabric re-applies the captured ``torch.compile`` arguments to the wrapped module).
    Nested calls (``torch.compile(torch.compile(m))``) give ``m`` and the outermost compiler.
    """
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # not imported: nothing was compiled
    if eval_frame is None or not isinstance(obj, eval_frame.OptimizedModule):
        return obj, None
    compiler = obj.dynamo_ctx
    while isinstance(obj, eval_frame.OptimizedModule):
        obj = obj._orig_mod
    return obj, compiler
