"""``trainer.init_module(empty_init=True)`` under FSDP: parameters created on the meta device (no memory), each
rank materialising its shard when the stage starts with each layer's ``reset_parameters()``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from tandem.utilities.exceptions import TandemUserCodeError


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Parameters registered inside move to the meta device at once (their initialisation then costs
    nothing); buffers and other tensors stay real."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and type(param) is nn.Parameter and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign, assignment]  # patched for the block
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]  # the method back


def has_meta(module: nn.Module) -> bool:
    return any(p.is_meta for p in module.parameters(recurse=False))


def check_initialisable(module: nn.Module, meta: list[nn.Module]) -> None:
    names = {m: n or type(module).__name__ for n, m in module.named_modules()}
    missing = [m for m in meta if not callable(getattr(m, "reset_parameters", None))]
    if missing:
        shown = ", ".join(f"{names[m]} ({type(m).__name__})" for m in missing[:5])
        raise TandemUserCodeError(
            f"Parameters created under trainer.init_module(empty_init=True) are initialised by their module's "
            f"reset_parameters(), which {shown} lack(s). Define reset_parameters(self) initialising that "
            "module's own parameters, or build it outside init_module."
        )
