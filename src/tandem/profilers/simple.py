"""The profiler that times each action: mean, count, total and share of the run (Lightning's
``SimpleProfiler``)."""

from __future__ import annotations

import os
import time
from collections import defaultdict

from tandem.profilers.profiler import Profiler


class SimpleProfiler(Profiler):
    """Records how long each action takes and reports, per action, the mean duration and the total time (with
    ``extended``, also the number of calls and the percentage of the run's time), longest first.

    Args:
        dirpath: the folder of ``filename`` (None: the Trainer's ``log_dir``).
        filename: write the report to ``<dirpath>/<stage>-<filename>.txt`` instead of printing it.
        extended: add the columns "Num calls" and "Percentage %" and a "Total" row.

    Raises:
        ValueError: an action is started while it runs already, or stopped without having been started.

    Example:
        ```python
        trainer = Trainer(profiler=SimpleProfiler(filename="perf"))  # fit-perf.txt in the log folder
        trainer.fit(model)
        ```
    """

    def __init__(
        self, dirpath: str | os.PathLike | None = None, filename: str | None = None, extended: bool = True
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.current_actions: dict[str, float] = {}
        self.recorded_durations: dict[str, list[float]] = defaultdict(list)
        self.extended = extended
        self.start_time = time.monotonic()

    def start(self, action_name: str) -> None:
        if action_name in self.current_actions:
            raise ValueError(f"Attempted to start {action_name} which has already started.")
        self.current_actions[action_name] = time.monotonic()

    def stop(self, action_name: str) -> None:
        end = time.monotonic()
        if action_name not in self.current_actions:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        self.recorded_durations[action_name].append(end - self.current_actions.pop(action_name))

    def summary(self) -> str:
        sep = os.linesep
        title = (f"{self._stage.upper()} " if self._stage else "") + f"Profiler Report{sep}"
        if not self.recorded_durations:
            return title
        width = max(len(k) for k in [*self.recorded_durations, "Action", "Total"])
        columns: tuple[str, ...]
        if self.extended:
            columns = ("Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
        else:
            columns = ("Mean duration (s)", "Total time (s)")

        def row(action: str, *cells: str) -> str:
            return f"{sep}|  {action:<{width}s}\t|" + "".join(f"  {c:<15}\t|" for c in cells)

        header = row("Action", *columns)
        line = f"{sep}{'-' * len(header.expandtabs())}"
        out = title + line + header + line
        if self.extended:
            total_duration = time.monotonic() - self.start_time
            extended_report = [
                (a, sum(d) / len(d), len(d), sum(d), 100.0 * sum(d) / total_duration)
                for a, d in self.recorded_durations.items()
            ]
            extended_report.sort(key=lambda r: r[4], reverse=True)
            total_calls = sum(r[2] for r in extended_report)
            out += row("Total", "-", f"{total_calls}", f"{total_duration:.5}", "100 %") + line
            for action, mean, calls, total, share in extended_report:
                out += row(action, f"{mean:.5}", f"{calls}", f"{total:.5}", f"{share:.5}")
        else:
            report = [(a, sum(d) / len(d), sum(d)) for a, d in self.recorded_durations.items()]
            report.sort(key=lambda r: r[1], reverse=True)
            for action, mean, total in report:
                out += row(action, f"{mean:.5}", f"{total:.5}")
        return out + line + sep
