"""Profilers: time the Trainer's hooks, steps and loop phases, and report at the end of each run
(``Trainer(profiler="simple" | "advanced" | "pytorch" | Profiler())``; Lightning's names and reports).

``AdvancedProfiler`` (cProfile) and ``PyTorchProfiler`` (torch.profiler) are imported when first used.
"""

from __future__ import annotations

from typing import Any

from tandem.profilers.base import PassThroughProfiler
from tandem.profilers.profiler import Profiler
from tandem.profilers.simple import SimpleProfiler

__all__ = ["AdvancedProfiler", "PassThroughProfiler", "Profiler", "PyTorchProfiler", "SimpleProfiler"]

_LAZY = {"AdvancedProfiler": "tandem.profilers.advanced", "PyTorchProfiler": "tandem.profilers.pytorch"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
