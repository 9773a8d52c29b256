"""Data for the loops: which loaders each stage runs (given to the entry point, from a DataModule, or from
the module's own data hooks), processed for the strategy, and how each batch reaches the device."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import torch
from torch.utils.data import DataLoader

from tandem.module import DataModule, TrainingModule, calls_hook, is_overridden
from tandem.strategies.strategy import Strategy
from tandem.trainer.combined_batches import TrainingBatches
from tandem.trainer.config import TrainerConfig, limit_batches
from tandem.trainer.hooks import callback_overrides
from tandem.trainer.state import EVAL_STAGES, TRAIN, StageData, StageNames
from tandem.utilities.combined_loader import CombinedLoader, Mode
from tandem.utilities.data import has_len, in_order, make_skippable
from tandem.utilities.exceptions import (
    STAGE_TYPOS,
    MissingStateError,
    PossibleUserWarning,
    TandemConfigError,
    TandemUserCodeError,
    add_note,
    stage_hook_signature,
    state_from_prepare_data,
    state_not_built,
)
from tandem.utilities.rank_zero import rank_zero_warn

_TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def prepare_data(module: TrainingModule, datamodule: DataModule | None, strategy: Strategy) -> None:
    """``prepare_data`` of the DataModule and the module: once per node (or once in all, with
    ``prepare_data_per_node = False``) while the other processes wait."""
    owners = [o for o in (datamodule, module) if o is not None and is_overridden(o, "prepare_data")]
    for owner in owners:
        if _prepares_here(owner, strategy):
            owner.prepare_data()
    if owners:
        strategy.barrier("prepare_data")


def _prepares_here(owner: TrainingModule | DataModule, strategy: Strategy) -> bool:
    """Whether this process runs ``owner.prepare_data``: local rank 0, or global rank 0 with
    ``prepare_data_per_node = False``."""
    per_node = getattr(owner, "prepare_data_per_node", True)
    return (strategy.local_rank if per_node else strategy.global_rank) == 0


def check_stage_hooks(fn: str, module: TrainingModule, datamodule: DataModule | None, callbacks: Iterable[Any]) -> None:
    """``setup`` and ``teardown`` of the module, the DataModule and the callbacks take the stage (Lightning's
    signatures), checked before any of them runs: a ``def setup(self)`` would fail with Python's "takes 1
    positional argument but 2 were given"."""
    calls: list[tuple[Any, tuple[str, ...], Callable[[Any, str], bool]]] = [
        (owner, ("stage",), is_overridden) for owner in (module, datamodule) if owner is not None
    ]
    calls += [(callback, ("trainer", "pl_module", "stage"), callback_overrides) for callback in callbacks]
    for owner, names, overrides in calls:
        for hook in ("setup", "teardown"):
            method = getattr(owner, hook, None)
            if method is None or not overrides(owner, hook):
                continue
            try:
                parameters = inspect.signature(method)
            except (TypeError, ValueError):  # a builtin or C callable: nothing to read
                continue
            try:
                parameters.bind(*names[:-1], stage=fn)  # called with stage= as Lightning calls it
            except TypeError:
                raise stage_hook_signature(type(owner).__name__, hook, str(parameters), ", ".join(names)) from None


def setup(owner: TrainingModule | DataModule, fn: str, strategy: Strategy) -> None:
    """``owner.setup(fn)``. An AttributeError on a process that did not run ``owner.prepare_data`` is named as
    what it most likely is: state that prepare_data set on another process."""
    try:
        owner.setup(stage=fn)
    except AttributeError as err:
        explained = _missing_state(owner, "setup", err, fn, strategy)
        if explained is None:
            raise
        raise explained from err


def check_sources(
    fn: str, module: TrainingModule, train: Any, evaluation: Any, datamodule: DataModule | None, config: TrainerConfig
) -> bool:
    """What ``fn`` needs of its data sources, checked before any hook runs, without asking for a loader (Lightning
    asks for them where the loops first need them). Returns whether a fit validates: validation data is given or a
    ``val_dataloader`` hook is defined, the module has ``validation_step``, and ``limit_val_batches`` is not 0."""
    source = datamodule if datamodule is not None else module
    if fn == "fit" and train is None and not defines(source, TRAIN.loader_hook):
        raise _no_training_data()
    stage = "validate" if fn == "fit" else fn
    names = EVAL_STAGES[stage]
    defined = evaluation is not None or defines(source, names.loader_hook)
    if not defined and fn != "fit":
        raise _no_evaluation_data(fn, names)
    has_step = is_overridden(module, names.step)
    if defined and stage != "predict" and not has_step:
        if fn != "fit":
            raise TandemUserCodeError(
                f"Trainer.{fn} needs {type(module).__name__}.{names.step}() to be defined: define "
                f"{names.step}(self, batch, batch_idx) and self.log the metrics there."
            )
        rank_zero_warn(
            f"You passed validation data (val_dataloaders, or val_dataloader() of the datamodule or module) but "
            f"{type(module).__name__} has no validation_step: the validation loop is skipped. Define "
            "validation_step(self, batch, batch_idx), or drop the validation data."
        )
        return False
    if fn == "fit" and not defined and has_step and config.limit_val_batches != 0:
        _warn_no_validation_data(module)
    return fn == "fit" and defined and has_step and config.limit_val_batches != 0


def defines(source: TrainingModule | DataModule, hook: str) -> bool:
    """``source`` has a loader hook of its own: its class overrides it, or it was set on the object."""
    return is_overridden(source, hook) or hook in vars(source)


def _no_training_data() -> TandemConfigError:
    return TandemConfigError(
        "Trainer.fit needs training data: pass train_dataloaders=DataLoader(...), a datamodule whose "
        "train_dataloader() returns one, or define train_dataloader() on the module."
    )


def _no_evaluation_data(fn: str, names: StageNames) -> TandemConfigError:
    return TandemConfigError(
        f"Trainer.{fn} needs data: pass dataloaders=DataLoader(...), a datamodule whose "
        f"{names.loader_hook}() returns one, or define {names.loader_hook}() on the module."
    )


def _warn_no_validation_data(module: TrainingModule) -> None:
    rank_zero_warn(
        f"{type(module).__name__} defines validation_step but the fit got no validation data: the validation "
        "loop is skipped (no val_* metrics for callbacks to monitor). Pass val_dataloaders=DataLoader(...), or "
        "a datamodule / module whose val_dataloader() returns one; set limit_val_batches=0 to turn validation "
        "off knowingly.",
        category=PossibleUserWarning,
    )


def training_record(
    module: TrainingModule,
    train: Any,
    datamodule: DataModule | None,
    strategy: Strategy,
    config: TrainerConfig,
    validates: bool,
) -> StageData:
    """The fit's training record, its loader asked for now (given to ``fit``, else the DataModule's or the module's
    ``train_dataloader()``). ``validates``: the fit validates, so an int ``val_check_interval`` must fit an epoch."""
    given = train if train is not None else request(TRAIN, module, datamodule, "fit", strategy)
    if given is None:
        raise _no_training_data()
    given = combined(given)
    if config.overfit_batches > 0:  # each loader of a list or dict too
        given = _map_loaders(given, lambda loader: in_order(loader, "training batches"))
    limit = config.limit_train_batches
    assert limit is not None  # TrainerConfig resolved None (1.0)
    train_data = training_data(given, strategy, limit)
    if train_data.num_batches[0] == 0:
        rank_zero_warn("No training batches (limit_train_batches or an empty dataloader): fit trains nothing.")
    elif validates:
        check_val_check_interval(config, train_data.num_batches[0])
    if strategy.distributed_sampler_kwargs is None:  # one process: the loaders the user gave, as Lightning's
        train_data.given = given.iterables if isinstance(given, CombinedLoader) else given
    return train_data


def combined(given: Any) -> Any:
    """Several training loaders (a list, tuple or dict of them, nested too) as Lightning reads them: a
    ``CombinedLoader`` in ``"max_size_cycle"`` mode; one loader, or a ``CombinedLoader`` of the user's, as given."""
    if isinstance(given, (list, tuple, Mapping)) and not isinstance(given, CombinedLoader):
        return CombinedLoader(given, "max_size_cycle")
    return given


def evaluation_record(
    fn: str,
    module: TrainingModule,
    evaluation: Any,
    datamodule: DataModule | None,
    strategy: Strategy,
    config: TrainerConfig,
) -> StageData:
    """The record of ``fn``'s evaluation stage ("validate" for ``fit``), its loaders asked for now."""
    stage = "validate" if fn == "fit" else fn
    names = EVAL_STAGES[stage]
    given = evaluation if evaluation is not None else request(names, module, datamodule, fn, strategy)
    if given is None:
        if fn != "fit":
            raise _no_evaluation_data(fn, names)
        _warn_no_validation_data(module)
        return StageData(names)
    if fn == "fit" and config.overfit_batches > 0:
        given = _map_loaders(given, lambda loader: in_order(loader, "validation batches"))
    return evaluation_data(names, given, strategy, stage, getattr(config, names.limit))


def check_val_check_interval(config: TrainerConfig, train_batches: int | float) -> None:
    """An int ``val_check_interval`` counts the batches of one epoch, so it must fit in one (Lightning's rule);
    with ``check_val_every_n_epoch=None`` it counts the batches of the whole fit and may be larger."""
    interval = config.val_check_interval
    if isinstance(interval, int) and config.check_val_every_n_epoch is not None and interval > train_batches:
        raise TandemConfigError(
            f"val_check_interval ({interval}) must be less than or equal to the number of the training batches "
            f"({train_batches}): validation would never run. If you want to disable validation set "
            "limit_val_batches=0 instead. If you want to validate based on the total training batches, set "
            "check_val_every_n_epoch=None."
        )


#: Lightning 1.x hooks that Lightning 2 removed: a module defining one would see it silently never called
_REMOVED_HOOKS = {
    "training_epoch_end": "on_train_epoch_end",
    "validation_epoch_end": "on_validation_epoch_end",
    "test_epoch_end": "on_test_epoch_end",
    "training_step_end": "the end of training_step (or on_train_batch_end)",
    "validation_step_end": "the end of validation_step (or on_validation_batch_end)",
    "test_step_end": "the end of test_step (or on_test_batch_end)",
}
_REMOVED_BY_FN = {
    "fit": ("training_epoch_end", "validation_epoch_end", "training_step_end", "validation_step_end"),
    "validate": ("validation_epoch_end", "validation_step_end"),
    "test": ("test_epoch_end", "test_step_end"),
    "predict": (),
}


def check_steps(fn: str, module: TrainingModule) -> None:
    """What ``fn`` needs of the module, checked before any work (Lightning's configuration validator):
    ``training_step`` and ``configure_optimizers`` to fit, ``predict_step`` or ``forward`` to predict, and no
    Lightning 1.x hook that would silently never run."""
    name = type(module).__name__
    if fn == "fit":
        for method, example in (
            ("training_step", "training_step(self, batch, batch_idx) returning the loss"),
            (
                "configure_optimizers",
                "configure_optimizers(self) returning an optimizer, e.g. torch.optim.Adam(self.parameters(), lr=1e-3)",
            ),
        ):
            if not is_overridden(module, method):
                raise TandemUserCodeError(
                    f"{name} has no {method}(). Trainer.fit needs at least training_step(), configure_optimizers() "
                    f"and training data; define {example}."
                )
    if fn == "predict" and not is_overridden(module, "predict_step") and not _has_forward(module):
        raise TandemUserCodeError(
            f"Trainer.predict needs {name}.predict_step() or {name}.forward() (the default predict_step calls "
            "self(batch)); define one of them."
        )
    for hook in _REMOVED_BY_FN[fn]:
        if callable(getattr(module, hook, None)):
            raise TandemUserCodeError(
                f"{name} defines {hook}(), a Lightning 1.x hook that Lightning 2 removed; tandem never calls it. "
                f"Move its work to {_REMOVED_HOOKS[hook]}; to use the step outputs at the epoch end, append them "
                "to a list attribute in the step and read (and clear) it there."
            )


def _has_forward(module: TrainingModule) -> bool:
    return type(module).forward is not torch.nn.Module.forward


def request(
    names: StageNames, module: TrainingModule, datamodule: DataModule | None, fn: str, strategy: Strategy
) -> Any:
    """The stage's loaders from the DataModule when there is one, else from the module's data hooks. An
    AttributeError for an attribute of the hook's owner (``self.test_ds``) names the ``setup(fn)`` that ran just
    before and did not create it, or the ``prepare_data`` that set it on another process."""
    source = datamodule if datamodule is not None else module
    hook = getattr(source, names.loader_hook, None)
    if hook is None or source is module and not is_overridden(module, names.loader_hook):
        return None  # ``model.val_dataloader = None`` turns the stage's data off, as in Lightning
    try:
        return hook()
    except AttributeError as err:
        explained = _missing_state(source, names.loader_hook, err, fn, strategy)
        if explained is None:
            raise
        raise explained from err


def _missing_state(
    owner: TrainingModule | DataModule, hook: str, err: AttributeError, fn: str, strategy: Strategy
) -> MissingStateError | None:
    """Why ``owner.hook`` found no ``self.<name>`` (``err``), or None when ``err`` is about another object, or (in
    ``setup``) when no ``prepare_data`` ran elsewhere."""
    name = getattr(err, "name", None)
    if getattr(err, "obj", None) is not owner or not isinstance(name, str):
        return None
    kind = type(owner).__name__
    if is_overridden(owner, "prepare_data") and not _prepares_here(owner, strategy):
        code = getattr(type(owner).prepare_data, "__code__", None)
        assigned = code is not None and name in code.co_names  # prepare_data's code sets (or reads) self.<name>
        if assigned or hook == "setup":
            rank = f"global rank {strategy.global_rank}, local rank {strategy.local_rank}"
            per_node = getattr(owner, "prepare_data_per_node", True)
            return state_from_prepare_data(kind, hook, name, rank, assigned, per_node)
    if hook == "setup":
        return None
    has_setup = is_overridden(owner, "setup")
    code = getattr(type(owner).setup, "__code__", None) if has_setup else None
    held = {c for c in code.co_consts if isinstance(c, str)} if code is not None else set()
    return state_not_built(kind, hook, name, fn, has_setup, [t for t in STAGE_TYPOS if t in held])


def training_data(given: Any, strategy: Strategy, limit: int | float) -> StageData:
    """The training loader, sharded by the strategy and able to skip ahead on a mid-epoch resume; several loaders
    (see ``combined``) each on their own, read as one by ``TrainingBatches``."""
    if isinstance(given, CombinedLoader):
        return _combined_training_data(given, strategy, limit)
    loader = strategy.process_dataloader(_check(given, "train_dataloaders"), "fit")
    loader, skippable = make_skippable(loader)
    count = limit_batches(TRAIN.limit, limit, len(loader) if has_len(loader) else math.inf)
    return StageData(TRAIN, [loader], [count], loader, skippable)


def _combined_training_data(given: CombinedLoader, strategy: Strategy, limit: int | float) -> StageData:
    """Each loader of ``given`` processed as one training loader is (sharded with a sampler of its own), its
    batches limited as Lightning limits them (``limit_train_batches`` per loader, the mode's length of those)."""
    if given.mode == "sequential":
        raise TandemConfigError(
            '`FitLoop` does not support the `CombinedLoader(mode="sequential")` mode: Trainer.fit trains on one batch '
            'of each loader per step. The available modes are: "min_size", "max_size_cycle", "max_size".'
        )
    if not given.flattened:
        raise TandemConfigError("train_dataloaders got an empty collection; pass at least one DataLoader.")
    loaders, skippables = [], []
    for loader in given.flattened:
        loader = strategy.process_dataloader(_check(loader, "train_dataloaders"), "fit")
        loader, skippable = make_skippable(loader)
        loaders.append(loader)
        skippables.append(skippable)
    processed = CombinedLoader(given.iterables, cast("Mode", given.mode))  # a mode CombinedLoader checked
    processed.flattened = loaders
    processed.limits = [limit_batches(TRAIN.limit, limit, len(d) if has_len(d) else math.inf) for d in loaders]
    ready = [skippable for skippable in skippables if skippable is not None]
    can_skip = len(ready) == len(skippables)  # else a resume reads and drops batches
    batches = TrainingBatches(processed, ready if can_skip else None)
    count = len(batches) if has_len(batches) else math.inf
    return StageData(TRAIN, [batches], [count], processed.iterables, batches if can_skip else None)


def evaluation_data(names: StageNames, given: Any, strategy: Strategy, stage: str, limit: int | float) -> StageData:
    """One evaluation stage's loaders (one, a list or a dict, or a ``CombinedLoader`` in ``"sequential"`` mode of
    them), each sharded by the strategy on its own."""
    if isinstance(given, CombinedLoader):
        if given.mode != "sequential":
            raise TandemConfigError(
                f"{names.prefix}_dataloaders got a CombinedLoader in {given.mode!r} mode; tandem evaluates several "
                'loaders one after another (mode="sequential"). Pass CombinedLoader(loaders, "sequential") or the '
                "list or dict of loaders itself."
            )
        given = given.iterables
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
    """``fn`` applied to each loader of one, a list / tuple or a dict of them, or a CombinedLoader (a new one; the
    user's keeps its loaders), in the same shape."""
    if isinstance(given, CombinedLoader):
        mapped = CombinedLoader(given.iterables, cast("Mode", given.mode))  # a mode CombinedLoader checked
        mapped.flattened = [fn(loader) for loader in given.flattened]
        return mapped
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


def check_dataloader_idx(module: TrainingModule, names: StageNames, several: bool, step: bool = True) -> bool:
    """Whether ``names``' step takes ``dataloader_idx``: it must with several loaders, and with one it may
    only if the argument has a default (Lightning's rule). The batch hooks follow the same rule; ``step=False``:
    the step is not asked (it takes a ``dataloader_iter``)."""
    hooks = [names.step, names.hook("batch_start"), names.hook("batch_end")][0 if step else 1 :]
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
    """The DataModule's hook where it overrides it (Lightning's rule: a wrapper of the base's no-op is not an
    override), else the module's where the loops call it."""
    if datamodule is not None and is_overridden(datamodule, name):
        return getattr(datamodule, name)
    return getattr(module, name) if calls_hook(module, name) else None


def is_datamodule(obj: Any) -> bool:
    """A DataModule passed where loaders go (``fit(model, dm)``), recognised as Lightning does."""
    return isinstance(obj, DataModule) and not isinstance(obj, DataLoader)


def note_uneven_batch(error: BaseException, batch: Any, sources: Mapping[str, Any]) -> None:
    """The failure path of a step: when ``error`` (a RuntimeError, ValueError or IndexError, not tandem's own) ends a
    step whose batch holds tensors of different first (batch) sizes, add a note that says so and names the
    ``collate_fn`` that built it (``sources``: the running entry point's loaders by stage, in the shape given), where
    16 inputs and 15 targets usually come from. torch's own message (``Expected input batch_size (16) to match
    target batch_size (15)``) stays as it is, with its traceback."""
    if not isinstance(error, (RuntimeError, ValueError, IndexError)) or type(error).__module__.startswith("tandem."):
        return
    sizes = _first_sizes(batch)
    if len(set(sizes.values())) < 2:
        return
    shown = ", ".join(f"{name} has {size}" for name, size in sizes.items())
    add_note(
        error,
        f"[tandem] The batch this step failed on holds tensors of different first (batch) sizes: {shown}. "
        f"{_built_by(sources)} Check that it returns as many targets as inputs (the same first size for each).",
    )


def _first_sizes(batch: Any) -> dict[str, int]:
    """The first size of each tensor field of a tuple, list or dict batch, by how the step reads it."""
    if isinstance(batch, Mapping):
        fields = list(batch.items())
    elif isinstance(batch, (list, tuple)):
        fields = list(enumerate(batch))
    else:
        return {}
    return {f"batch[{key!r}]": v.shape[0] for key, v in fields if isinstance(v, torch.Tensor) and v.ndim > 0}


def _built_by(sources: Mapping[str, Any]) -> str:
    """Which ``collate_fn`` built the batch: the one of the running loaders, or each, with its stage."""
    found: dict[str, list[str]] = {}  # a collate_fn's name -> the stages whose loaders use it
    for stage, given in sources.items():
        for loader in _dataloaders_in(given):
            stages = found.setdefault(_collate_name(loader.collate_fn), [])
            if stage not in stages:
                stages.append(stage)
    if not found:
        return "The loader's collate_fn (or the code that built the batch) put it together."
    if len(found) == 1:
        return f"It was built by the loader's collate_fn, {next(iter(found))}."
    named = "; ".join(f"{' and '.join(stages)}: {name}" for name, stages in found.items())
    return f"It was built by the collate_fn of the loader it came from ({named})."


def _dataloaders_in(given: Any) -> list[DataLoader]:
    """The DataLoaders of one loader, a list / tuple or a dict of them, or a CombinedLoader."""
    if isinstance(given, DataLoader):
        return [given]
    if isinstance(given, CombinedLoader):
        given = given.flattened
    parts = given.values() if isinstance(given, Mapping) else given if isinstance(given, (list, tuple)) else []
    return [loader for part in parts for loader in _dataloaders_in(part)]


def _collate_name(collate_fn: Any) -> str:
    name = getattr(collate_fn, "__qualname__", None) or type(collate_fn).__qualname__
    if getattr(collate_fn, "__module__", "").startswith("torch.utils.data"):
        return f"torch's {name} (it stacks the samples' fields: the dataset's samples gave these sizes)"
    return name
