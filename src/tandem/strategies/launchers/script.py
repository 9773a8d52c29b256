"""``ScriptLauncher`` (``strategy="ddp"``): the other local ranks re-run this script; this process is rank 0."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from tandem.strategies.environments.local import LocalEnvironment
from tandem.strategies.environments.machine import find_free_port
from tandem.strategies.launchers.command import _hydra_config, child_command
from tandem.strategies.launchers.records import _is_echo, _record_uncaught_errors
from tandem.strategies.launchers.watchdog import _Child, _die_with_parent, _watch_parent, _Watchdog
from tandem.strategies.process_group import leave_process_group
from tandem.strategies.side_channel import report_for_the_job
from tandem.utilities.preemption import PREEMPTION
from tandem.utilities.processes import load_libc

_WATCHDOG = _Watchdog()  # one per process: a script's later Trainers reuse the ranks started by the first
_JOB_END_WAIT_S = 60.0  # how long a sweep's next job waits for the previous job's ranks to end


def processes_started() -> bool:
    """Whether this process already started the other local ranks of its script."""
    return bool(_WATCHDOG.children)


class ScriptLauncher:
    """Start local ranks 1..N-1 by re-running this script with the rank variables set; this process is rank 0.

    When a started rank fails, rank 0 stops the others and raises
    [`RankFailedError`][tandem.utilities.exceptions.RankFailedError] (with that rank's traceback) in its main thread,
    wherever it is: ``finally`` blocks and context managers run.

    Args:
        environment: the [`LocalEnvironment`][tandem.strategies.environments.LocalEnvironment] of this job.
        num_processes: processes per node.
    """

    def __init__(self, environment: LocalEnvironment, num_processes: int) -> None:
        self.environment = environment
        self.num_processes = num_processes

    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        if self.environment.creates_processes_externally:  # a rank that a launcher started
            if self.environment.launcher_pid is not None and sys.platform != "linux":
                _watch_parent(self.environment.launcher_pid)
            if self.environment.error_file is not None:
                _record_uncaught_errors(self.environment.error_file, self.environment.launcher_pid)
        elif self.num_processes > 1 and (not _WATCHDOG.children or self._next_hydra_job()):
            self._start_children()
        try:
            return function(*args, **kwargs)
        except BaseException as error:
            if not _WATCHDOG.children:
                raise
            failure = _WATCHDOG.failure_behind(error)
            if failure is None:
                raise
            if _is_echo(error):
                raise failure from None  # the message names the broken collective; the backend's text once
            raise failure  # noqa: B904 (rank 0's own error stays attached as the context: nothing is cut)

    def _next_hydra_job(self) -> bool:
        """A Hydra sweep (``-m``) moved on to its next job: the ranks started for the previous one ran that job
        only and ended. Leave their process group, so that this job starts its ranks and joins a new group."""
        global _WATCHDOG
        hydra_config = _hydra_config()
        if hydra_config is None or hydra_config.runtime.output_dir == _WATCHDOG.hydra_job:
            return False
        _WATCHDOG.wait_for_end(_JOB_END_WAIT_S)
        leave_process_group()
        _WATCHDOG = _Watchdog()
        if self.environment.num_nodes == 1:
            os.environ["MASTER_PORT"] = str(find_free_port())  # the last job's port may still be held
        return True

    def _start_children(self) -> None:
        hydra_config = _hydra_config()
        _WATCHDOG.hydra_job = hydra_config.runtime.output_dir if hydra_config is not None else None
        libc = load_libc()
        folder = tempfile.mkdtemp(prefix="tandem-errors-")
        children = []
        for local_rank in range(1, self.num_processes):
            rank = self.environment.node_rank * self.num_processes + local_rank
            error_file = os.path.join(folder, f"rank{rank}.txt")
            command, cwd = child_command(local_rank)
            proc = subprocess.Popen(
                command,
                cwd=cwd,
                env=self.environment.child_environment(local_rank, error_file),
                preexec_fn=_die_with_parent(os.getpid(), libc),
            )
            children.append(_Child(rank, proc, error_file))
        # SIGTERM / SIGUSR1 reach them too; only running ones (a reaped child's pid may belong to another process)
        PREEMPTION.forward_to = lambda: [child.proc.pid for child in children if child.proc.poll() is None]
        report_for_the_job()  # a teardown does not end this process: it raises the failure
        _WATCHDOG.start(children, folder)
