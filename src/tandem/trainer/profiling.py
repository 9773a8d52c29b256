"""The Trainer's use of a profiler: ``Trainer(profiler=...)`` resolved, the actions' names (Lightning's), and
timed variants of the calls the loops make. The loops choose them once per run, only when a profiler is set;
without one they call the plain functions and nothing here runs per step.

Action names, as Lightning writes them: ``[LightningModule]<Module>.<hook>``, ``[Callback]<state_key>.<hook>``,
``[Strategy]<Strategy>.training_step`` (``backward``, ``optimizer_step``, ``batch_to_device``, the evaluation
steps), ``run_training_epoch``, ``run_training_batch`` (the optimization of a batch),
``[_TrainingEpochLoop].train_dataloader_next``, ``[_EvaluationLoop].val_next`` / ``test_next`` and
``[_PredictionLoop].predict_next`` (fetching a batch).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from tandem.profilers import PassThroughProfiler, Profiler
from tandem.utilities.exceptions import TandemConfigError

if TYPE_CHECKING:
    from tandem.strategies.strategy import Strategy

#: ``Trainer(profiler=<name>)``: the profiler class each name builds (with its default arguments)
PROFILERS = {"simple": "SimpleProfiler", "advanced": "AdvancedProfiler", "pytorch": "PyTorchProfiler"}

#: the action of fetching an evaluation stage's next batch
NEXT_BATCH = {
    "validation": "[_EvaluationLoop].val_next",
    "test": "[_EvaluationLoop].test_next",
    "predict": "[_PredictionLoop].predict_next",
}
TRAIN_NEXT_BATCH = "[_TrainingEpochLoop].train_dataloader_next"


def resolve_profiler(profiler: Profiler | str | None) -> Profiler:
    """``Trainer(profiler=...)``: None (a [`PassThroughProfiler`][tandem.profilers.PassThroughProfiler]), a name of
    ``PROFILERS``, or a [`Profiler`][tandem.profilers.Profiler] instance."""
    if profiler is None:
        return PassThroughProfiler()
    if isinstance(profiler, Profiler):
        return profiler
    if isinstance(profiler, str) and profiler.lower() in PROFILERS:
        import tandem.profilers

        return getattr(tandem.profilers, PROFILERS[profiler.lower()])()
    names = ", ".join(repr(name) for name in PROFILERS)
    raise TandemConfigError(
        f"Trainer(profiler={profiler!r}) is not valid; expected one of {names}, a tandem.profilers.Profiler "
        "instance (e.g. SimpleProfiler(filename='perf')), or None for no profiling."
    )


def active(profiler: Profiler) -> Profiler | None:
    """The profiler the loops time with, or None when it records nothing (a
    [`PassThroughProfiler`][tandem.profilers.PassThroughProfiler]): the loops then take their plain path."""
    return None if isinstance(profiler, PassThroughProfiler) else profiler


def timed(fn: Callable[..., Any], profiler: Profiler, action: str) -> Callable[..., Any]:
    """``fn``, timed as ``action`` at each call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        profiler.start(action)
        try:
            return fn(*args, **kwargs)
        finally:
            profiler.stop(action)

    return call


def timed_batches(batches: Iterable[Any], profiler: Profiler, action: str) -> Iterator[Any]:
    """The batches of ``batches``, fetching each timed as ``action``."""
    iterator = iter(batches)
    while True:
        profiler.start(action)
        try:
            batch = next(iterator)
        except StopIteration:
            return
        finally:
            profiler.stop(action)
        yield batch


def module_action(module: Any, hook: str) -> str:
    return f"[LightningModule]{type(module).__name__}.{hook}"


def callback_action(callback: Any, hook: str) -> str:
    return f"[Callback]{callback.state_key}.{hook}"


def strategy_action(strategy: Any, method: str) -> str:
    return f"[Strategy]{type(strategy).__name__}.{method}"


class StrategyCalls:
    """The strategy's methods a batch calls, bound once per run: the strategy's own methods, or (with a
    profiler) wrappers that time each call as ``[Strategy]<Strategy>.<method>`` (a step as its name:
    ``[Strategy]SingleDeviceStrategy.training_step``).

    Args:
        strategy: whose methods.
        profiler: the profiler to time them with; None: no timing.
    """

    __slots__ = ("backward", "optimizer_step", "run_step")

    def __init__(self, strategy: Strategy, profiler: Profiler | None = None) -> None:
        self.run_step: Callable[..., Any] = strategy.run_step
        self.backward: Callable[..., None] = strategy.backward
        self.optimizer_step: Callable[..., bool] = strategy.optimizer_step
        if profiler is None:  # a strategy that leaves them to its precision: the precision's, one call fewer a step
            from tandem.strategies.strategy import Strategy

            kind, precision = type(strategy), strategy.precision
            if kind.backward is Strategy.backward:
                self.backward = precision.backward
            if kind.optimizer_step is Strategy.optimizer_step:
                self.optimizer_step = precision.optimizer_step
            return
        run_step = strategy.run_step
        actions: dict[str, str] = {}

        def timed_step(method: str, *args: Any) -> Any:
            action = actions.get(method) or actions.setdefault(method, strategy_action(strategy, method))
            profiler.start(action)
            try:
                return run_step(method, *args)
            finally:
                profiler.stop(action)

        self.run_step = timed_step
        self.backward = timed(strategy.backward, profiler, strategy_action(strategy, "backward"))
        self.optimizer_step = timed(strategy.optimizer_step, profiler, strategy_action(strategy, "optimizer_step"))


def timed_transfer(
    strategy: Strategy, transfer: Callable[[Any, int], Any] | None, profiler: Profiler
) -> Callable[[Any, int], Any]:
    """The loops' batch transfer (``transfer(batch, dataloader_idx)``; None: the strategy's ``batch_to_device``)
    timed as ``[Strategy]<Strategy>.batch_to_device``."""
    if transfer is None:

        def transfer(batch: Any, dataloader_idx: int) -> Any:
            return strategy.batch_to_device(batch)

    return timed(transfer, profiler, strategy_action(strategy, "batch_to_device"))
