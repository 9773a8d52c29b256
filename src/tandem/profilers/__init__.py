"""Profilers: time the Trainer's hooks, steps and loop phases, and report at the end of each run
(``Trainer(profiler="simple" | "advanced" | "pytorch" | Profiler())``; Lightning's names and reports).

``AdvancedProfiler`` (cProfile) and ``PyTorchProfiler`` (torch.profiler) are imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.profilers.base import PassThroughProfiler
from tandem.profilers.profiler import Profiler
from tandem.profilers.simple import SimpleProfiler
from tandem.utilities.lazy import lazy_attributes

if TYPE_CHECKING:
    from tandem.profilers.advanced import AdvancedProfiler
    from tandem.profilers.pytorch import PyTorchProfiler

_LAZY = {"AdvancedProfiler": "tandem.profilers.advanced", "PyTorchProfiler": "tandem.profilers.pytorch"}

__all__ = ["AdvancedProfiler", "PassThroughProfiler", "Profiler", "PyTorchProfiler", "SimpleProfiler"]

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
