"""Data for the loops: which loaders each stage runs (given to the entry point, from a DataModule, or from
the module's own data hooks), processed for the strategy, and how each batch reaches the device."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torch.utils.data import DataLoader

from tandem.module import DataModule, TrainingModule, is_overridden
from tandem.strategies.strategy import Strategy
from tandem.trainer.config import TrainerConfig, limit_batches
from tandem.trainer.state import EVAL_STAGES, TRAIN, StageData, StageNames
from tandem.utilities.data import has_len, in_order, make_skippable
from tandem.utilities.exceptions import TandemConfigError, TandemUserCodeError
from tandem.utilities.rank_zero import rank_zero_warn

_TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def prepare_data(module: TrainingModule, datamodule: DataModule | None, strategy: Strategy) -> None:
    """``prepare_data`` of the DataModule and the module: once per node (or once in all, with
    ``prepare_data_per_node = False``) while the other processes wait."""
    owners = [o for o in (datamodule, module) if o is not None and is_overridden(o, "prepare_data")]
    for owner in owners:
        rank = strategy.local_rank if getattr(owner, "prepare_data_per_node", True) else strategy.global_rank
        if rank == 0:
            owner.prepare_data()
    if owners:
        strategy.barrier("prepare_data")


def stage_records(
    fn: str,
    module: TrainingModule,
    train: Any,
    evaluation: Any,
    datamodule: DataModule | None,
    strategy: Strategy,
    config: TrainerConfig,
) -> tuple[StageData | None, str, StageData]:
    """The records of the stages an entry point uses: the training loader (``fit``; None otherwise), and the
    name and record of its evaluation stage ("validate" for ``fit``). Loaders given to the entry point come
    first, then the DataModule's, then the module's own hooks."""
    train_data = None
    if fn == "fit":
        given = train if train is not None else request(TRAIN, module, datamodule)
        if given is None:
            raise TandemConfigError(
                "Trainer.fit needs training data: pass train_dataloaders=DataLoader(...), a datamodule whose "
                "train_dataloader() returns one, or define train_dataloader() on the module."
            )
        if config.overfit_batches > 0:
            given = in_order(given, "training batches")
        train_data = training_data(given, strategy, config.limit_train_batches)
        if train_data.num_batches[0] == 0:
            rank_zero_warn("No training batches (limit_train_batches or an empty dataloader): fit trains nothing.")
    stage = "validate" if fn == "fit" else fn
    names = EVAL_STAGES[stage]
    given = evaluation if evaluation is not None else request(names, module, datamodule)
    if given is None and fn != "fit":
        raise TandemConfigError(
            f"Trainer.{fn} needs data: pass dataloaders=DataLoader(...), a datamodule whose "
            f"{names.loader_hook}() returns one, or define {names.loader_hook}() on the module."
        )
    if given is not None and stage != "predict" and not is_overridden(module, names.step):
        if fn != "fit":
            raise TandemUserCodeError(f"Trainer.{fn} needs {type(module).__name__}.{names.step} to be defined.")
        if evaluation is not None or datamodule is not None:
            rank_zero_warn(f"{type(module).__name__} defines no validation_step: validation data is ignored.")
        given = None
    if given is None:
        return train_data, stage, StageData(names)
    if fn == "fit" and config.overfit_batches > 0:
        given = _map_loaders(given, lambda loader: in_order(loader, "validation batches"))
    return train_data, stage, evaluation_data(names, given, strategy, stage, getattr(config, names.limit))


def request(names: StageNames, module: TrainingModule, datamodule: DataModule | None) -> Any:
    """The stage's loaders from the DataModule when there is one, else from the module's data hooks."""
    source = datamodule if datamodule is not None else module
    return getattr(source, names.loader_hook)()


def training_data(given: Any, strategy: Strategy, limit: int | float) -> StageData:
    """The training loader, sharded by the strategy and able to skip ahead on a mid-epoch resume."""
    if isinstance(given, (list, tuple, Mapping)):
        if len(given) != 1:
            raise TandemConfigError(
                f"train_dataloaders got {len(given)} loaders; tandem trains from one loader per fit. Combine the "
                "datasets (torch.utils.data.ConcatDataset) or the batches (a loader that yields several) instead."
            )
        given = next(iter(given.values())) if isinstance(given, Mapping) else given[0]
    loader = strategy.process_dataloader(_check(given, "train_dataloaders"), "fit")
    loader, skippable = make_skippable(loader)
    count = limit_batches(TRAIN.limit, limit, len(loader) if has_len(loader) else math.inf)
    return StageData(TRAIN, [loader], [count], loader, skippable)


def evaluation_data(names: StageNames, given: Any, strategy: Strategy, stage: str, limit: int | float) -> StageData:
    """One evaluation stage's loaders (one, a list or a dict), each sharded by the strategy on its own."""
    loaders = list(given.values()) if isinstance(given, Mapping) else list(given) if _is_sequence(given) else [given]
    processed = [
        strategy.process_dataloader(_check(loader, f"{names.prefix}_dataloaders"), stage) for loader in loaders
    ]
    counts = [limit_batches(names.limit, limit, len(d) if has_len(d) else math.inf) for d in processed]
    if isinstance(given, Mapping):
        shaped: Any = dict(zip(given, processed))
    elif _is_sequence(given):
        shaped = type(given)(processed) if isinstance(given, (list, tuple)) else processed
    else:
        shaped = processed[0]
    return StageData(names, processed, counts, shaped)


def _map_loaders(given: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` applied to each loader of one, a list / tuple or a dict of them, in the same shape."""
    if isinstance(given, Mapping):
        return {key: fn(loader) for key, loader in given.items()}
    if isinstance(given, (list, tuple)):
        return type(given)(fn(loader) for loader in given)
    return fn(given)


def _is_sequence(given: Any) -> bool:
    return isinstance(given, (list, tuple))


def _check(loader: Any, name: str) -> Any:
    if not isinstance(loader, Iterable) or isinstance(loader, (str, bytes, Mapping)):
        raise TandemConfigError(
            f"{name} must be a DataLoader (or an iterable of batches), a list or a dict of them; got "
            f"{type(loader).__name__}."
        )
    return loader


def check_dataloader_idx(module: TrainingModule, names: StageNames, several: bool) -> bool:
    """Whether ``names``' step takes ``dataloader_idx``: it must with several loaders, and with one it may
    only if the argument has a default (Lightning's rule). The batch hooks follow the same rule."""
    hooks = [names.step, names.hook("batch_start"), names.hook("batch_end")]
    for hook in hooks:
        fn = getattr(module, hook)
        if not is_overridden(module, hook):
            continue  # tandem's own defaults accept it
        parameters = inspect.signature(fn).parameters
        takes = "dataloader_idx" in parameters or any(p.kind is p.VAR_POSITIONAL for p in parameters.values())
        if several and not takes:
            raise TandemUserCodeError(
                f"There are several {names.prefix} dataloaders, but {type(module).__name__}.{hook}() has no "
                "dataloader_idx argument. Add dataloader_idx=0 to its signature."
            )
        required = "dataloader_idx" in parameters and parameters["dataloader_idx"].default is inspect.Parameter.empty
        if not several and required:
            raise TandemUserCodeError(
                f"There is one {names.prefix} dataloader, but {type(module).__name__}.{hook}() requires "
                "dataloader_idx. Give it a default (dataloader_idx=0) or remove it."
            )
    return several


def takes_batch_idx(step: Callable[..., Any]) -> bool:
    """Whether a step method takes ``batch_idx`` (Lightning allows ``training_step(self, batch)``)."""
    parameters = inspect.signature(step).parameters.values()
    named = any(p.name == "batch_idx" for p in parameters)
    return named or len(parameters) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


def batch_transfer(
    strategy: Strategy, module: TrainingModule, datamodule: DataModule | None
) -> Callable[[Any, int], Any] | None:
    """``(batch, dataloader_idx) -> batch on the device`` through the transfer hooks that the DataModule or
    the module overrides (the DataModule's override wins); None when neither does, and the loops call
    ``strategy.batch_to_device`` directly. Decided once per run."""
    hooks = {name: _override(name, module, datamodule) for name in _TRANSFER_HOOKS}
    move = strategy.batch_to_device
    if not any(hooks.values()):
        return None
    before, transfer, after = (hooks[name] for name in _TRANSFER_HOOKS)
    convert = strategy.precision.convert_input

    def to_device(batch: Any, dataloader_idx: int) -> Any:
        if before is not None:
            batch = before(batch, dataloader_idx)
        batch = move(batch) if transfer is None else convert(transfer(batch, strategy.root_device, dataloader_idx))
        if after is not None:
            batch = after(batch, dataloader_idx)
        return batch

    return to_device


def _override(name: str, module: TrainingModule, datamodule: DataModule | None) -> Callable[..., Any] | None:
    if datamodule is not None and is_overridden(datamodule, name):
        return getattr(datamodule, name)
    return getattr(module, name) if is_overridden(module, name) else None


def is_datamodule(obj: Any) -> bool:
    """A DataModule passed where loaders go (``fit(model, dm)``), recognised as Lightning does."""
    return isinstance(obj, DataModule) and not isinstance(obj, DataLoader)
