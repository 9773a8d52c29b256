"""FSDP's checkpoints: the optimizer state's two formats (torch's numbered parameters, the named ones of
torch.distributed.checkpoint), and the sharded checkpoint, a directory each rank writes its shard into, beside
rank 0's meta file."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.optim import Optimizer

from tandem.utilities.atomic import replace_directory, temporary_directory
from tandem.utilities.checkpoint import SHARDED_META_FILE, atomic_save, load_checkpoint_file
from tandem.utilities.exceptions import CheckpointError

if TYPE_CHECKING:
    from tandem.strategies.strategy import Strategy

META_FILE = (
    SHARDED_META_FILE  #: a sharded checkpoint's non-tensor state (loops, callbacks, RNG, ...), written by rank 0
)


# ---------------------------------------------------------------------------------------------- formats


def numbered_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """torch.distributed.checkpoint names parameters; torch's optimizers number them in param_groups order."""
    index: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        ids = []
        for name in group["params"]:
            index[name] = len(index)
            ids.append(index[name])
        groups.append({**group, "params": ids})
    return {"state": {index[k]: v for k, v in state["state"].items()}, "param_groups": groups}


def named_state(state: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of ``numbered_state``, with the names of the optimizer's parameters in order."""
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {names[i]: v for i, v in state["state"].items()}, "param_groups": groups}


def _is_numbered(state: Mapping[str, Any]) -> bool:
    return not state.get("state") or all(isinstance(k, int) for k in state["state"])


def _meta_file(path: Path) -> Path:
    meta = path / META_FILE
    if not meta.is_file():
        raise CheckpointError(
            f"{str(path)!r} is a directory without {META_FILE}: not a tandem sharded checkpoint, or one whose "
            "writing was interrupted (those are never renamed into place). Use another checkpoint."
        )
    return meta


# ---------------------------------------------------------------------------------------------- sharded checkpoints


def save_sharded_checkpoint(strategy: Strategy, checkpoint: dict[str, Any], path: str | Path) -> None:
    """Every rank writes its shard with torch.distributed.checkpoint into a temporary directory (named and locked
    by rank 0 like a file's temporary, so a later save or resume removes one a killed job left), rank 0 adds
    ``meta.pt`` (everything but the module and optimizer tensors), and the directory is renamed onto ``path``
    once every rank has finished (``replace_directory``: a kill while the previous checkpoint is replaced leaves
    what the next save or a resume settles)."""
    import torch.distributed.checkpoint as dcp

    path = Path(path)
    meta = dict(checkpoint)
    tensors: dict[str, Any] = {"state_dict": meta.pop("state_dict")}
    if "optimizer_states" in meta:  # the plain states of optimizers that never stepped go with the meta
        states = meta.pop("optimizer_states")
        meta["optimizer_states"] = [s if _is_numbered(s) else None for s in states]
        tensors["optimizer_states"] = {str(i): s for i, s in enumerate(states) if not _is_numbered(s)}
    with contextlib.ExitStack() as held:
        temporary = None
        if strategy.is_global_zero:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = str(held.enter_context(temporary_directory(path)))
        temporary = strategy.broadcast(temporary)
        assert temporary is not None  # rank 0's folder, on every rank
        try:
            dcp.save(tensors, checkpoint_id=temporary)
            if strategy.is_global_zero:
                atomic_save(meta, Path(temporary) / META_FILE)
            strategy.barrier("save_checkpoint")  # every shard is written
            if strategy.is_global_zero:
                replace_directory(temporary, path)
            strategy.barrier("save_checkpoint")
        except BaseException:
            if strategy.is_global_zero:
                shutil.rmtree(temporary, ignore_errors=True)
            raise


def load_sharded_checkpoint(
    path: Path,
    weights_only: bool | None,
    module: nn.Module,
    optimizers: list[Optimizer],
    reading: Callable[[], AbstractContextManager[None]],
) -> dict[str, Any]:
    """A sharded directory read into this rank's shards of ``module`` (and of the ``optimizers``' states), whatever
    the number of ranks that wrote it, inside ``reading()`` (the strategy's access to the sharded state). Tensors
    and plain data only, its ``.metadata`` too (``sharded_reader``), unless ``weights_only=False`` says the
    checkpoint is trusted."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    from tandem.strategies.sharded_reader import readers, refusal, refused_message

    checkpoint = load_checkpoint_file(_meta_file(path), weights_only)
    with reading():
        target: dict[str, Any] = {"state_dict": get_model_state_dict(module)}
        plain = checkpoint.get("optimizer_states")
        if plain is not None and optimizers:
            target["optimizer_states"] = {
                str(i): get_optimizer_state_dict(module, optimizer)
                for i, optimizer in enumerate(optimizers)
                if i < len(plain) and plain[i] is None
            }
    arguments = readers(path, trusted=weights_only is False)
    try:
        dcp.load(target, **arguments)
    except (Exception, CheckpointException) as err:  # several types for a checkpoint that does not fit
        refused = refusal(arguments)
        if refused is not None:
            raise CheckpointError(refused_message(path, refused)) from None
        raise CheckpointError(
            f"Sharded checkpoint {str(path)!r} does not fit {type(module).__name__}: "
            f"{type(err).__name__}: {str(err).strip().splitlines()[0][:500]}"
        ) from None
    checkpoint["state_dict"] = target["state_dict"]
    if plain is not None:
        loaded = target.get("optimizer_states", {})
        checkpoint["optimizer_states"] = [s if s is not None else loaded.get(str(i)) for i, s in enumerate(plain)]
    return checkpoint
