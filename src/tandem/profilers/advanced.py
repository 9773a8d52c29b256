"""The profiler that runs Python's cProfile inside each action: the functions each one spends its time in
(Lightning's ``AdvancedProfiler``)."""

from __future__ import annotations

import cProfile
import io
import os
import pstats
from collections import defaultdict
from pathlib import Path
from typing import Any

from tandem.profilers.profiler import Profiler


class AdvancedProfiler(Profiler):
    """Runs a ``cProfile.Profile`` per action and reports, for each, its functions by cumulative time. Verbose
    and slow: for finding where a hook or step spends its time, not for routine runs.

    Nested actions (a ``training_step`` inside ``run_training_batch``) are credited to the innermost one while
    it runs; the outer one records again when it returns.

    Args:
        dirpath: the folder of ``filename`` (None: the Trainer's ``log_dir``).
        filename: write the report to ``<dirpath>/<stage>-<filename>.txt`` instead of printing it.
        line_count_restriction: functions listed per action: an int (a count) or a float in [0, 1] (a fraction).
        dump_stats: also write each action's raw statistics to ``<dirpath>/<stage>-<filename>-<action>.prof``
            (for ``snakeviz`` or ``pstats``); needs ``dirpath`` or a Trainer's log folder.

    Raises:
        ValueError: an action is stopped without having been started.

    Example:
        ```python
        trainer = Trainer(profiler=AdvancedProfiler(filename="perf", line_count_restriction=10))
        ```
    """

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        filename: str | None = None,
        line_count_restriction: int | float = 1.0,
        dump_stats: bool = False,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.profiled_actions: dict[str, cProfile.Profile] = defaultdict(cProfile.Profile)
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats
        self._running: list[str] = []  # the actions started and not stopped, innermost last

    def start(self, action_name: str) -> None:
        if self._running:  # one cProfile records at a time
            self.profiled_actions[self._running[-1]].disable()
        self._running.append(action_name)
        self.profiled_actions[action_name].enable()

    def stop(self, action_name: str) -> None:
        profile = self.profiled_actions.get(action_name)
        if profile is None or action_name not in self._running:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        profile.disable()
        self._running.remove(action_name)
        if self._running:
            self.profiled_actions[self._running[-1]].enable()

    def summary(self) -> str:
        stats = {}
        for action, profile in self.profiled_actions.items():
            if self.dump_stats:
                self._dump(action, profile)
            text = io.StringIO()
            pstats.Stats(profile, stream=text).strip_dirs().sort_stats("cumulative").print_stats(
                self.line_count_restriction
            )
            stats[action] = text.getvalue()
        return self._stats_to_str(stats)

    def _dump(self, action: str, profile: cProfile.Profile) -> None:
        if not self.dirpath:
            raise ValueError(
                "AdvancedProfiler(dump_stats=True) needs a folder to write the .prof files to; pass dirpath=... "
                "or use it with a Trainer (its log folder)."
            )
        path = Path(self.dirpath, self._prepare_filename(action_name=action, extension=".prof"))
        path.parent.mkdir(parents=True, exist_ok=True)
        profile.dump_stats(str(path))

    def teardown(self, stage: str | None) -> None:
        super().teardown(stage=stage)
        for action in self._running:
            self.profiled_actions[action].disable()
        self._running.clear()
        self.profiled_actions.clear()

    def __reduce__(self) -> tuple[Any, ...]:  # a cProfile.Profile does not pickle (ddp_spawn pickles the Trainer)
        state = {
            "dirpath": self.dirpath,
            "filename": self.filename,
            "line_count_restriction": self.line_count_restriction,
        }
        return (self.__class__, (), {**state, "dump_stats": self.dump_stats})
