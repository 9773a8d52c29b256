"""The profiler that does nothing: the Trainer's default (Lightning's ``PassThroughProfiler``)."""

from __future__ import annotations

from tandem.profilers.profiler import Profiler


class PassThroughProfiler(Profiler):
    """Records nothing. The Trainer's ``profiler`` when none is asked for; with it the loops run their plain
    path, with no timing calls at all."""

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass
