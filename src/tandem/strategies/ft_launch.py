"""A fault-tolerant job on one machine: a lighthouse and N replica groups, each under its own restart loop.

    python -m tandem.strategies.ft_launch --groups 2 train.py --max-epochs 3

starts torchft's lighthouse in this process, then each group as ``python train.py --max-epochs 3`` with
``TORCHFT_LIGHTHOUSE``, ``REPLICA_GROUP_ID`` and ``NUM_REPLICA_GROUPS`` set (the script trains with
``Trainer(strategy="ddp_ft")``; a group of several processes starts them itself, as any tandem DDP script does). A group
whose process ends with an error or a signal is started again, at most ``--max-restarts`` times, and joins the others
with their state (``TANDEM_FT_RESTARTS`` tells it how often it was started again). The command ends with 0 when every
group has ended well, or with the exit code of the first group that ran out of restarts (the others are stopped).

On several machines, start ``torchft_lighthouse --min_replicas 1 --join_timeout_ms 60000`` on one, and each group with
its own launcher (torchrun, srun) under a restart loop, with the three variables set.

`ReplicaGroupsRun` is the same from Python (the tests and ``benchmarks/fault_tolerance.py`` use it): it
records when each group started and ended (`ReplicaGroupsRun.events`).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tandem.strategies.environments.replica_group import ReplicaGroupEnvironment
from tandem.strategies.replica_groups import require_torchft

_POLL_S = 0.05
_STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class GroupEvent:
    """Group ``group`` ``"started"`` (its ``restarts``-th restart) or ``"exited"`` (with ``returncode``: negative for
    a signal) at ``time`` (``time.monotonic()``)."""

    group: int
    kind: str
    time: float
    restarts: int
    returncode: int | None = None


class ReplicaGroupsRun:
    """A lighthouse and ``groups`` replica groups running ``command``, each started again when it fails.

    Args:
        command: the program of every group (e.g. ``[sys.executable, "train.py"]``).
        groups: how many replica groups (``NUM_REPLICA_GROUPS``).
        max_restarts: how often each group may be started again.
        min_replicas: the fewest groups a quorum holds (the lighthouse's ``--min_replicas``).
        join_timeout_ms: how long the lighthouse waits for groups that are alive but not asking to join (one in a
            validation, a checkpoint save) before it forms a quorum without them: longer than a group's longest pause
            between two steps.
        heartbeat_timeout_ms: how long a group may be silent before the lighthouse counts it dead (a dead group's
            peers wait that long at most).
        lighthouse: the address of a lighthouse already running; None starts one in this process.
        log_dir: where each group's output goes (``group_<i>.log``, every start appended); None: this process's.
        cwd: the groups' working directory.
    """

    def __init__(
        self,
        command: list[str],
        groups: int,
        *,
        max_restarts: int = 3,
        min_replicas: int = 1,
        join_timeout_ms: int = 60_000,
        heartbeat_timeout_ms: int = 2_000,
        lighthouse: str | None = None,
        log_dir: str | Path | None = None,
        cwd: str | Path | None = None,
    ) -> None:
        ReplicaGroupEnvironment.quiet_lighthouse()  # before torchft is imported
        require_torchft("python -m tandem.strategies.ft_launch")
        if groups < 1 or max_restarts < 0 or min_replicas < 1:
            raise ValueError(f"groups={groups} and min_replicas={min_replicas} must be >= 1, max_restarts >= 0")
        self.command, self.groups, self.max_restarts = list(command), groups, max_restarts
        self.min_replicas, self.join_timeout_ms, self.heartbeat_timeout_ms = (
            min_replicas,
            join_timeout_ms,
            heartbeat_timeout_ms,
        )
        self.address, self.log_dir, self.cwd = lighthouse, Path(log_dir) if log_dir else None, cwd
        self.events: list[GroupEvent] = []
        self.processes: dict[int, subprocess.Popen[Any]] = {}
        self.restarts = dict.fromkeys(range(groups), 0)
        self.returncode: int | None = None
        self._lighthouse: Any = None
        self._done: set[int] = set()
        self._logs: dict[int, IO[bytes]] = {}

    def start(self) -> None:
        """Start the lighthouse (unless one was given) and every group."""
        if self.address is None:
            from torchft.coordination import LighthouseServer

            self._lighthouse = LighthouseServer(
                bind="[::]:0",
                min_replicas=self.min_replicas,
                join_timeout_ms=self.join_timeout_ms,
                heartbeat_timeout_ms=self.heartbeat_timeout_ms,
            )
            self.address = self._lighthouse.address()
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        for group in range(self.groups):
            self._start(group)

    def _start(self, group: int) -> None:
        assert self.address is not None
        restarts = self.restarts[group]
        env = ReplicaGroupEnvironment.group_environment(self.address, group, self.groups, restarts)
        output: Any = None
        if self.log_dir is not None:
            if group not in self._logs:
                self._logs[group] = open(self.log_dir / f"group_{group}.log", "ab")  # noqa: SIM115 (kept open)
            output = self._logs[group]
        self.processes[group] = subprocess.Popen(
            self.command, env=env, cwd=self.cwd, stdout=output, stderr=subprocess.STDOUT if output else None
        )
        self.events.append(GroupEvent(group, "started", time.monotonic(), restarts))

    def poll(self) -> int | None:
        """Start again the groups that failed; the run's exit code once it is over, else None."""
        for group, process in list(self.processes.items()):
            if group in self._done or (code := process.poll()) is None:
                continue
            self.events.append(GroupEvent(group, "exited", time.monotonic(), self.restarts[group], code))
            if code == 0:
                self._done.add(group)
            elif self.restarts[group] < self.max_restarts:
                self.restarts[group] += 1
                _say(
                    f"replica group {group} {_ending(code)}; starting it again ({self.restarts[group]} of {self.max_restarts})"
                )
                self._start(group)
            else:
                _say(f"replica group {group} {_ending(code)} and has no restart left; stopping the others")
                self.returncode = code if code > 0 else 128 - code
                self.stop()
                return self.returncode
        if len(self._done) == self.groups:
            self.returncode = 0
            self.stop()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Run until the job is over (restarting failed groups); raises ``TimeoutError`` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the replica groups did not finish within {timeout} s")
            time.sleep(_POLL_S)
        return code

    def kill(self, group: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to group ``group``'s process (the run starts it again as it fails)."""
        self.processes[group].send_signal(sig)

    def stop(self) -> None:
        """End every group still running, then the lighthouse."""
        running = [p for g, p in self.processes.items() if g not in self._done and p.poll() is None]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + _STOP_GRACE_S
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in self._logs.values():
            log.close()
        self._logs = {}
        if self._lighthouse is not None:
            self._lighthouse.shutdown()
            self._lighthouse = None


def _ending(code: int) -> str:
    if code < 0:
        try:
            return f"was ended by {signal.Signals(-code).name}"
        except ValueError:
            return f"was ended by signal {-code}"
    return f"exited with code {code}"


def _say(message: str) -> None:
    print(f"[tandem.ft_launch] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tandem.strategies.ft_launch",
        description="Start a lighthouse and N replica groups of a script that trains with strategy='ddp_ft', each "
        "started again when it fails.",
    )
    parser.add_argument("--groups", type=int, default=2, help="replica groups (default 2)")
    parser.add_argument("--max-restarts", type=int, default=3, help="restarts of each group (default 3)")
    parser.add_argument("--min-replicas", type=int, default=1, help="fewest groups in a quorum (default 1)")
    parser.add_argument("--join-timeout-ms", type=int, default=60_000, help="wait for groups alive but busy")
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=2_000, help="silence before a group is dead")
    parser.add_argument("--lighthouse", default=None, help="a running lighthouse's address (default: start one)")
    parser.add_argument("script", help="the training script (run with this Python)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    options = parser.parse_args(argv)
    run = ReplicaGroupsRun(
        [sys.executable, options.script, *options.args],
        options.groups,
        max_restarts=options.max_restarts,
        min_replicas=options.min_replicas,
        join_timeout_ms=options.join_timeout_ms,
        heartbeat_timeout_ms=options.heartbeat_timeout_ms,
        lighthouse=options.lighthouse,
    )
    run.start()
    _say(f"lighthouse at {run.address}; {options.groups} replica groups started")
    try:
        return run.wait()
    except KeyboardInterrupt:
        run.stop()
        return 130


if __name__ == "__main__":
    sys.exit(main())
