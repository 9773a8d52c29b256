"""Between stages the module stays sharded: calling it (or a layer of it) or its ``state_dict()`` outside the
Trainer is an error naming the ways to the whole weights; the strategy's own reads pass."""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from tandem.utilities.exceptions import TandemUserCodeError

_GUARD_ATTRIBUTE = "_tandem_fsdp_guard"  # between stages: the hooks that stop a use of the sharded module
READING_ATTRIBUTE = "_tandem_fsdp_reading"  # the strategy is reading the sharded module's state itself


def guard(module: nn.Module, world_size: int) -> None:
    """Between stages, calling the sharded module (or a layer of it) or its ``state_dict()`` raises
    ``_sharded_module_error``; the hooks cost nothing while a stage runs (they are removed then). The
    strategy's own reads (``FSDPStrategy._reading``) pass."""
    unguard(module)
    name = type(module).__name__
    handles = [  # before FSDP's own pre-forward hook (a gather)
        layer.register_forward_pre_hook(
            functools.partial(_refuse_forward, name, world_size, f"{name}.{path}" if path else name), prepend=True
        )
        for path, layer in module.named_modules()
        if any(True for _ in layer.parameters())
    ]
    handles.append(module.register_state_dict_post_hook(functools.partial(_refuse_state_dict, world_size)))
    module.__dict__[_GUARD_ATTRIBUTE] = handles


def unguard(module: nn.Module) -> None:
    for handle in module.__dict__.pop(_GUARD_ATTRIBUTE, []):
        handle.remove()


def _refuse_forward(name: str, world_size: int, path: str, layer: nn.Module, args: Any) -> None:
    raise _sharded_module_error(name, world_size, f"calling {path}(...) outside the Trainer")


def _refuse_state_dict(world_size: int, module: nn.Module, state_dict: Any, prefix: str, metadata: Any) -> None:
    if not module.__dict__.get(READING_ATTRIBUTE):
        raise _sharded_module_error(type(module).__name__, world_size, f"{type(module).__name__}.state_dict()")


def _sharded_module_error(name: str, world_size: int, what: str) -> TandemUserCodeError:
    return TandemUserCodeError(
        f"{name} is still sharded by FSDP after the Trainer's stage: its parameters are DTensor shards over "
        f"{world_size} rank(s), each rank holding its part, so {what} would fail with DTensor errors, wait forever "
        "for the other ranks' shards, or (state_dict) return this rank's shards, not the weights. On every rank, "
        "call trainer.save_checkpoint('model.ckpt', weights_only=True) (one file with the whole weights: "
        "model.load_state_dict(torch.load('model.ckpt')['state_dict']) in a plain module) or state_dict = "
        "trainer.strategy.full_module_state_dict() (rank 0 receives the whole weights), then save or use them "
        "under `if trainer.is_global_zero:`. To run the sharded module, use trainer.validate/test/predict."
    )
