"""The hook dispatcher: which module and callback hooks a run calls, in what order, and what is running now.

One ``HookDispatcher`` per Trainer. It collects the table once per run (Lightning's order: each callback's
override in the callbacks' order, then the module's; ``on_load_checkpoint`` the module's first, and
``on_train_epoch_end`` the monitoring callbacks' — ``EarlyStopping``, the checkpoint callbacks — after the module's;
hooks nobody overrides are not called at all), calls a hook with
``HookDispatcher.call``, and keeps the facts ``self.log`` needs: the hook now running (a context
variable, read by ``current_hook``), the stage now running (``TrainerState.stage``, set for a block
with ``HookDispatcher.running``) and, for that block, the run's module (through which a callback's
``self.log`` logs: ``running_module``). Whether a hook's ``self.log`` calls
default to ``on_step=True`` is declared with the hook itself (``@logs_per_step`` on ``TrainingModule``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tandem.callbacks.callback import Callback, Checkpoint
from tandem.module import TrainingModule, calls_hook
from tandem.trainer.profiling import callback_action, module_action, timed
from tandem.trainer.state import RunningStage
from tandem.utilities.logged_values import CURRENT_HOOK as _CURRENT_HOOK
from tandem.utilities.logged_values import logging_module

if TYPE_CHECKING:
    from tandem.profilers import Profiler
    from tandem.trainer.state import TrainerState
    from tandem.trainer.trainer import Trainer

_HOOK_NAMES = tuple(sorted(n for n in dir(Callback) if n.startswith("on_")))


#: mark a hook as running and take it back (``token = enter_hook(name)`` ... ``leave_hook(token)``): the
#: context variable's own methods, for the per-step path, where ``running_hook`` costs three times more
enter_hook = _CURRENT_HOOK.set
leave_hook = _CURRENT_HOOK.reset


#: the hook or step method running now (``"training_step"``, ``"on_validation_epoch_end"``, ...), or None (the
#: context variable's own ``get``: ``self.log`` asks it on every call)
current_hook = _CURRENT_HOOK.get

#: the hooks whose ``self.log`` calls default to ``on_step=True, on_epoch=False`` (the others: the reverse), as
#: declared on ``TrainingModule`` with ``@logs_per_step``
STEP_HOOKS = frozenset(n for n in dir(TrainingModule) if getattr(getattr(TrainingModule, n, None), "logs_per_step", 0))


class running_hook:  # noqa: N801 - used as a context manager, like contextlib's lower-case ones
    """Mark ``name`` (a step method, or a module override the loop calls) as the hook running in the block.
    A class, not a generator: it wraps every training step."""

    __slots__ = ("_name", "_token")

    def __init__(self, name: str) -> None:
        self._name = name

    def __enter__(self) -> None:
        self._token = _CURRENT_HOOK.set(self._name)

    def __exit__(self, *exc: object) -> None:
        _CURRENT_HOOK.reset(self._token)


class HookDispatcher:
    """Calls the hooks of one Trainer's runs.

    Args:
        state: the Trainer's state, whose ``stage`` the ``running`` method sets.

    The table holds plain functions ``fn(trainer, *args)``; the Trainer is held weakly (it holds this
    dispatcher, and a reference back would be a cycle that only Python's garbage collector frees, keeping a
    finished fit's module alive).
    """

    def __init__(self, state: TrainerState) -> None:
        self._state = state
        self._table: dict[str, list[Callable[..., None]]] = {}
        self._module_fns: dict[str, Callable[..., Any]] = {}  # the module's entry of each hook it overrides
        self.registered: frozenset[str] = frozenset()  # the hooks someone overrides in the current run
        self._trainer: Callable[[], Trainer | None] = _no_trainer
        self._module: Callable[[], TrainingModule | None] = _no_trainer  # the run's module (weakly, as the Trainer)

    def __getstate__(self) -> dict[str, Any]:  # ddp_spawn pickles the Trainer; each run collects afresh
        return {**self.__dict__, "_trainer": _no_trainer, "_module": _no_trainer}

    def collect(
        self, trainer: Trainer, module: TrainingModule, callbacks: list[Callback], profiler: Profiler | None = None
    ) -> None:
        """Build the table for a run, in Lightning's order: for each hook, each callback's override (in the order of
        ``callbacks``), then the module's; for ``on_load_checkpoint`` the module's first; for ``on_train_epoch_end``
        the monitoring callbacks (``EarlyStopping`` and the checkpoint callbacks) after the module. With a
        ``profiler``, each entry is timed (``[LightningModule]<Module>.<hook>``, ``[Callback]<state_key>.<hook>``):
        the profiling variant of the table, chosen here once, so that ``call`` itself never asks."""
        from tandem.callbacks.early_stopping import EarlyStopping

        self._trainer, self._module = weakref.ref(trainer), weakref.ref(module)
        table: dict[str, list[Callable[..., None]]] = {}
        module_fns: dict[str, Callable[..., Any]] = {}
        for name in _HOOK_NAMES:
            before: list[Callable[..., None]] = []  # the callbacks called before the module's hook
            after: list[Callable[..., None]] = []
            for callback in callbacks:
                if callback_overrides(callback, name):
                    fn = _callback_hook(getattr(callback, name), module)
                    fn = fn if profiler is None else timed(fn, profiler, callback_action(callback, name))
                    monitors = name == "on_train_epoch_end" and isinstance(callback, (EarlyStopping, Checkpoint))
                    (after if monitors or name == "on_load_checkpoint" else before).append(fn)
            if calls_hook(module, name):  # overridden by its class, or a function set on the instance
                fn = _module_hook(getattr(module, name))
                module_fns[name] = fn if profiler is None else timed(fn, profiler, module_action(module, name))
                before.append(module_fns[name])
            table[name] = before + after
        self._table, self._module_fns = table, module_fns
        self.registered = frozenset(name for name, fns in table.items() if fns)

    def has(self, name: str) -> bool:
        """Whether anyone overrides ``name`` (the per-step path tests ``name in registered`` itself)."""
        return name in self.registered

    def call(self, name: str, *args: Any) -> Any:
        """Run ``name`` on the callbacks and the module, in the table's order (see ``collect``). Returns what the
        module's override returned (``on_train_batch_start`` may return -1); callbacks' returns are ignored."""
        fns = self._table.get(name)
        if not fns:
            return None
        trainer, module_fn = self._trainer(), self._module_fns.get(name)
        token = _CURRENT_HOOK.set(name)
        result = None
        try:
            for fn in fns:
                value = fn(trainer, *args)
                if fn is module_fn:
                    result = value
        finally:
            _CURRENT_HOOK.reset(token)
        return result

    @contextlib.contextmanager
    def running(self, stage: str) -> Iterator[None]:
        """``trainer.state.stage`` is ``stage`` inside the block ("train", "sanity_check", "validate", "test",
        "predict"), and what it was before after it: the one writer of the stage. The run's module is
        ``running_module`` there."""
        state = self._state
        previous, state.stage = state.stage, RunningStage(stage)
        try:
            with logging_module(self._module()):
                yield
        finally:
            state.stage = previous


def callback_overrides(callback: Callback, name: str) -> bool:
    """``callback`` has its own hook ``name``: overridden by its class, or a function set on the instance
    (``LambdaCallback``), as Lightning reads it; one set to None is not called."""
    own = getattr(type(callback), name, None) is not getattr(Callback, name, None) or name in vars(callback)
    return own and callable(getattr(callback, name, None))


def _no_trainer() -> None:
    return None


def _module_hook(method: Callable[..., Any]) -> Callable[..., Any]:
    def call(trainer: Trainer, *args: Any) -> Any:  # the module's hooks take no (trainer, module) arguments
        return method(*args)

    return call


def _callback_hook(method: Callable[..., None], module: TrainingModule) -> Callable[..., None]:
    def call(trainer: Trainer, *args: Any) -> None:
        method(trainer, module, *args)

    return call
