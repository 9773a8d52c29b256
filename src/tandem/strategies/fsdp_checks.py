"""What FSDPStrategy checks before it shards: its arguments (the wrap and checkpointing policies, Lightning's FSDP1
``sharding_strategy``) and the module (the layers a policy selects, one dtype a group, BatchNorm's own groups, no
DataParallel wrapper); and the tests for torch's FSDP modules and DTensors, loaded when first used."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeGuard

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tandem.utilities.exceptions import TandemConfigError

if TYPE_CHECKING:  # torch's FSDP module takes ~1 s to import: loaded when used
    from torch.distributed.fsdp import FSDPModule

    class ShardedModule(FSDPModule, nn.Module):
        """What ``fully_shard`` makes of a module: the same object, its class now also an ``FSDPModule``."""


Policy = Callable[[nn.Module], bool] | Iterable[type[nn.Module]] | type[nn.Module] | None


# ---------------------------------------------------------------------------------------------- policies


def check_policy(what: str, policy: Policy) -> Callable[[nn.Module], bool] | frozenset[type] | None:
    """A set of layer classes (or one class) becomes a frozenset; a callable stays; anything else is an error."""
    if policy is None or callable(policy) and not isinstance(policy, type):
        return policy
    classes = [policy] if isinstance(policy, type) else list(policy) if isinstance(policy, Iterable) else [policy]
    wrong = [c for c in classes if not (isinstance(c, type) and issubclass(c, nn.Module))]
    if wrong or not classes:
        raise TandemConfigError(
            f"{what}={policy!r} must be a set of layer classes (torch.nn.Module subclasses, e.g. {{nn.Linear}}) "
            f"or a callable taking a module and returning True to select it; got {wrong[0] if wrong else policy!r}."
        )
    return frozenset(classes)


def select_layers(module: nn.Module, policy: Any, what: str) -> list[nn.Module]:
    """The submodules ``policy`` selects, innermost first; a clear error for classes the module does not
    contain or a policy that selects nothing."""
    if policy is None:
        return []
    candidates = [m for m in module.modules() if m is not module and not is_fsdp(m)]
    if isinstance(policy, frozenset):
        found = {c for c in policy if any(isinstance(m, c) for m in candidates)}
        unknown = sorted(c.__name__ for c in policy - found)
        if unknown:
            present = sorted({type(m).__name__ for m in candidates})
            raise TandemConfigError(
                f"{what} names {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} not a layer of "
                f"{type(module).__name__} (its layer classes: {', '.join(present) or 'none'}). Pass the classes of "
                "the blocks to shard, e.g. {TransformerBlock}."
            )
        selected = [m for m in candidates if isinstance(m, tuple(policy))]
    else:
        selected = [m for m in candidates if policy(m)]
    selected = [m for m in selected if any(True for _ in m.parameters())]
    if not selected:
        raise TandemConfigError(
            f"{what} selected no submodule of {type(module).__name__} that has parameters, so it would do nothing. "
            f"Select the layers to {'shard' if what == 'auto_wrap_policy' else 'checkpoint'} (e.g. a set of their "
            f"classes), or leave {what}=None."
        )
    return selected[::-1]  # children before parents: fully_shard works bottom-up


def check_dtypes(module: nn.Module, groups: list[nn.Module]) -> None:
    """FSDP gathers each group's parameters as one buffer of one dtype: a group mixing dtypes is an error."""
    assigned = {id(p) for m in module.modules() if is_fsdp(m) for p in m.parameters()}
    owners = {id(p): n for n, p in module.named_parameters()}
    for group in [*groups, module]:
        dtypes: dict[torch.dtype, list[str]] = {}
        for param in group.parameters():
            if id(param) not in assigned:
                dtypes.setdefault(param.dtype, []).append(owners.get(id(param), "?"))
                assigned.add(id(param))
        if len(dtypes) > 1:
            where = "the module" if group is module else f"the group {type(group).__name__}"
            mix = "; ".join(f"{dtype}: {', '.join(names[:3])}" for dtype, names in dtypes.items())
            raise TandemConfigError(
                f"FSDP flattens each group's parameters into one buffer of one dtype, but {where} mixes "
                f"{mix}. Give them one dtype (e.g. module.float()), or put the layers of another dtype in "
                "groups of their own with auto_wrap_policy."
            )


def batch_norms(module: nn.Module) -> list[nn.Module]:
    """The BatchNorm layers with weights that no FSDP group (one ``configure_model`` made) holds yet."""
    held = {id(m) for group in module.modules() if is_fsdp(group) for m in group.modules()}
    return [
        m
        for m in module.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and id(m) not in held and any(True for _ in m.parameters())
    ]


def is_fsdp(module: object) -> TypeGuard[ShardedModule]:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def is_dtensor(tensor: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def refuse_data_parallel(module: nn.Module) -> None:
    for name, inner in module.named_modules():
        if isinstance(inner, (nn.DataParallel, DistributedDataParallel)):
            raise TandemConfigError(
                f"{type(module).__name__}.{name} is a {type(inner).__name__}, which drives several devices "
                "from one process; FSDP runs one process per device and shards the module itself. Remove the "
                f"{type(inner).__name__} wrapper and keep the plain module."
            )


#: Lightning's (FSDP1) sharding strategies and tandem's (FSDP2) way to the same thing
_FSDP1_EQUIVALENTS = {
    "FULL_SHARD": "FSDPStrategy(reshard_after_forward=True), the default: leave the argument out",
    "SHARD_GRAD_OP": "FSDPStrategy(reshard_after_forward=False): parameters stay gathered from forward to backward",
    "NO_SHARD": "strategy='ddp': every rank holds the whole module",
    "HYBRID_SHARD": "none: tandem's FSDP shards over all ranks (no 2-D device mesh); use reshard_after_forward",
    "_HYBRID_SHARD_ZERO2": "none: tandem's FSDP shards over all ranks (no 2-D device mesh); use reshard_after_forward",
}


def fsdp1_sharding(value: Any) -> TandemConfigError:
    """``sharding_strategy=`` (Lightning's FSDP1 argument): the error naming tandem's equivalent."""
    name = str(getattr(value, "name", value)).upper()
    known = _FSDP1_EQUIVALENTS.get(name)
    equivalent = f"here {name!r} is {known}" if known else "; ".join(f"{k}: {v}" for k, v in _FSDP1_EQUIVALENTS.items())
    return TandemConfigError(
        f"FSDPStrategy(sharding_strategy={value!r}) is Lightning's FSDP1 argument; tandem's fsdp is FSDP2 "
        f"(torch's fully_shard), which shards parameters, gradients and optimizer state, and chooses when to "
        f"reshard with reshard_after_forward: {equivalent}."
    )
