"""The profiler base: what the Trainer calls around every hook, step and loop phase it times, and where the
report goes at the end of a run (Lightning's ``Profiler``)."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from tandem.utilities.rank_zero import rank_zero_info


class Profiler(ABC):
    """Times named actions. Subclass it and implement [`start`][tandem.profilers.Profiler.start] and
    [`stop`][tandem.profilers.Profiler.stop] (and [`summary`][tandem.profilers.Profiler.summary] for a report) to write
    your own.

    Args:
        dirpath: the folder of ``filename``; None: the Trainer's ``log_dir`` (set at
            [`setup`][tandem.profilers.Profiler.setup]).
        filename: write the report to ``<dirpath>/<stage>-<filename>[-<local_rank>].txt`` instead of printing
            it (the rank is added when the run has several processes). ``.txt`` is added by the profiler.

    The Trainer calls [`setup`][tandem.profilers.Profiler.setup] when a run (``fit``, ``validate``, ``test``,
    ``predict``) starts, [`start`][tandem.profilers.Profiler.start] / [`stop`][tandem.profilers.Profiler.stop] around
    each action, and [`describe`][tandem.profilers.Profiler.describe] when the run ends.

    Example:
        ```python
        class CountingProfiler(Profiler):
            def __init__(self):
                super().__init__()
                self.calls = collections.Counter()

            def start(self, action_name):
                self.calls[action_name] += 1

            def stop(self, action_name):
                pass

            def summary(self):
                return "\\n".join(f"{name}: {n}" for name, n in self.calls.most_common())
        ```
    """

    def __init__(self, dirpath: str | os.PathLike | None = None, filename: str | None = None) -> None:
        self.dirpath = dirpath
        self.filename = filename
        self._output_file: TextIO | None = None
        self._write_stream: Callable[[str], Any] | None = None
        self._local_rank: int | None = None
        self._stage: str | None = None

    @abstractmethod
    def start(self, action_name: str) -> None:
        """Start timing ``action_name``."""

    @abstractmethod
    def stop(self, action_name: str) -> None:
        """Stop timing ``action_name`` (started with [`start`][tandem.profilers.Profiler.start])."""

    def summary(self) -> str:
        """The report (empty: nothing to report)."""
        return ""

    @contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        """Time the block as ``action_name``.

        Example:
            ```python
            with profiler.profile("load training data"):
                data = load()
            ```
        """
        try:
            self.start(action_name)
            yield action_name
        finally:
            self.stop(action_name)

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """Before a run: its stage (``"fit"``, ``"validate"``, ``"test"``, ``"predict"``), this process's local
        rank (None when the run has one process) and the Trainer's log folder (the default ``dirpath``)."""
        self._stage = stage
        self._local_rank = local_rank
        self.dirpath = self.dirpath or log_dir

    def teardown(self, stage: str | None) -> None:
        """After a run: close the report file."""
        self._write_stream = None
        if self._output_file is not None:
            self._output_file.close()
            self._output_file = None

    def describe(self) -> None:
        """Write the report: to the file when ``filename`` is set, else to the console on local rank 0. Then
        tear down (the Trainer calls this at the end of each run; a profiler used alone may call it too)."""
        self._prepare_streams()
        summary = self.summary()
        if summary and self._write_stream is not None:
            self._write_stream(summary)
        if self._output_file is not None:
            self._output_file.flush()
        self.teardown(stage=self._stage)

    @property
    def local_rank(self) -> int:
        return 0 if self._local_rank is None else self._local_rank

    def __del__(self) -> None:
        if "_output_file" in self.__dict__:  # not when __init__ failed
            self.teardown(stage=self._stage)

    # ------------------------------------------------------------------ for subclasses
    def _prepare_filename(self, action_name: str | None = None, extension: str = ".txt", split_token: str = "-") -> str:
        """``<stage>-<filename>[-<local_rank>][-<action_name>]<extension>``."""
        parts = [self._stage, self.filename, None if self._local_rank is None else str(self._local_rank), action_name]
        return split_token.join(p for p in parts if p) + extension

    def _prepare_streams(self) -> None:
        if self._write_stream is not None:
            return
        if self.filename and self.dirpath:
            path = Path(self.dirpath, self._prepare_filename())
            path.parent.mkdir(parents=True, exist_ok=True)
            self._output_file = open(path, "a")  # noqa: SIM115 - closed in teardown
            self._write_stream = self._output_file.write
        else:
            self._write_stream = self._rank_zero_info

    def _rank_zero_info(self, message: str) -> None:
        if self._local_rank in (None, 0):
            rank_zero_info(message)

    def _stats_to_str(self, stats: dict[str, str]) -> str:
        """A report of one section per action (the advanced and PyTorch profilers')."""
        lines = [(f"{self._stage.upper()} " if self._stage else "") + "Profiler Report"]
        rank = f" rank: {self._local_rank}" if self._local_rank is not None else ""
        for action, text in stats.items():
            lines += [f"Profile stats for: {action}{rank}", text]
        return os.linesep.join(lines)
