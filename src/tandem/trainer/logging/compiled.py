"""``CompiledStepLog``: what ``self.log`` writes into while the steps run compiled."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from tandem.trainer.logging.barebones import BarebonesLog
from tandem.trainer.logging.collector import MetricCollector

if TYPE_CHECKING:
    from tandem.trainer.state import TrainerState


class CompiledStepLog:
    """What ``self.log`` writes into while the steps run compiled (``trainer.fit(torch.compile(model))``).

    Inside a compiled ``training_step`` a call is kept (name, value, arguments) in ``MetricCollector.deferred``:
    dynamo records that list's appends with the graph and makes them after it, so ``self.log`` breaks no graph,
    and the optimization logs the calls right after the step returns, still inside it
    (``MetricCollector.log_deferred``). Elsewhere (evaluation steps, hooks, eager code) the collector is called
    outside dynamo's graphs: logging is Python bookkeeping, which traced would break the graph inside the collector
    anyway and recompile at each new name, hook or stage until dynamo's recompile limit gives up on it."""

    def __init__(self, collector: MetricCollector | BarebonesLog) -> None:
        self._eager = torch.compiler.disable(collector.log)
        self.state_dict = collector.state_dict
        self._deferred: list[tuple[str, Any, tuple[Any, ...]]] | None = None
        if isinstance(collector, MetricCollector):  # barebones: nothing is collected, nor deferred
            self._state: TrainerState = collector._state
            self._deferred = collector.deferred = []

    def log(self, name: str, value: Any, *args: Any) -> None:
        # traced: is_compiling() is True, and the stage a guard (the training step's graphs are built in "train")
        if torch.compiler.is_compiling() and self._deferred is not None and self._state.stage == "train":
            self._deferred.append((name, value, args))
        else:
            self._eager(name, value, *args)
