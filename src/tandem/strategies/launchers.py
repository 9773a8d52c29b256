"""Starting the other processes of a DDP job, and ending all of them when one fails.

``ScriptLauncher`` ("ddp") re-runs the user's script for the other local ranks; the original process
is rank 0. Everything the script does runs on every rank, code after ``trainer.fit()`` included, as
in plain torch DDP scripts. ``SpawnLauncher`` ("ddp_spawn") runs one function in spawned processes
and brings rank 0's results back to the caller, for code that cannot be re-run as a script
(notebooks, ``python -c``): guard the script with ``if __name__ == "__main__":``.

A launcher is used as ``launcher.launch(function, *args, trainer=trainer, **kwargs)``; it returns
what ``function`` returned on this process (ScriptLauncher) or on global rank 0 (SpawnLauncher).
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing as mp
from lightning_utilities.core.apply_func import apply_to_collection
from torch.multiprocessing.spawn import ProcessContext, ProcessException

from tandem.strategies.environments import LocalEnvironment
from tandem.utilities.exceptions import TandemConfigError

_POLL_S = 0.1
_TERMINATE_GRACE_S = 5.0
_ECHO_WAIT_S = 2.0  # how long rank 0, failing, waits to see whether a started rank failed first


def script_command() -> list[str]:
    """The command that re-runs this program: ``python script.py args`` or ``python -m module args``."""
    import __main__

    spec = getattr(__main__, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", "__mp_main__"):
        name = spec.name[: -len(".__main__")] if spec.name.endswith(".__main__") else spec.name
        return [sys.executable, "-m", name, *sys.argv[1:]]
    main_file = getattr(__main__, "__file__", None)
    if main_file is None or sys.argv[0] in ("", "-c"):
        raise TandemConfigError(
            "strategy='ddp' starts the other ranks by re-running your script, but this program has no script "
            "(an interactive session, a notebook or python -c). Use strategy='ddp_spawn', or run a script."
        )
    return [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]


# ---------------------------------------------------------------------------------------------- script


@dataclass
class _Child:
    rank: int
    proc: subprocess.Popen


class _Watchdog:
    """The ranks this process started, watched until they end: one failing ends the whole job."""

    def __init__(self) -> None:
        self.children: list[_Child] = []
        self.stopping = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self, children: list[_Child]) -> None:
        self.children = children
        self._thread = threading.Thread(target=self._watch, name="tandem-ddp-watchdog", daemon=True)
        self._thread.start()
        atexit.register(self.wait)
        previous_hook = sys.excepthook

        def excepthook(*exc_info: Any) -> None:  # rank 0 failed after launch() returned
            self.stop()
            previous_hook(*exc_info)

        sys.excepthook = excepthook

    def failed_child(self) -> _Child | None:
        return next((c for c in self.children if c.proc.poll() not in (None, 0)), None)

    def wait_for_failure(self, seconds: float) -> _Child | None:
        """A started rank that failed, waiting up to ``seconds`` for one while any is still running."""
        deadline = time.monotonic() + seconds
        while self.children and not self.stopping:
            failed = self.failed_child()
            if failed is not None or time.monotonic() > deadline:
                return failed
            if all(c.proc.poll() is not None for c in self.children):
                return None
            time.sleep(_POLL_S / 2)
        return None

    def _watch(self) -> None:
        while not self.stopping:
            failed = self.failed_child()
            if failed is not None:
                self.fail(failed)
            if all(c.proc.poll() == 0 for c in self.children):
                return
            time.sleep(_POLL_S)

    def fail(self, child: _Child, echo: BaseException | None = None) -> None:
        """Report the failed rank, end the others, and end this process (it may be stuck in a collective)."""
        with self._lock:
            if self.stopping:
                return
            code = child.proc.returncode
            if code < 0:
                how, exit_code = f"was killed by {signal.Signals(-code).name}", 128 - code
            else:
                how, exit_code = f"exited with code {code}", code
            line = f"[tandem] rank {child.rank} {how}; stopping the other ranks."
            if echo is not None:
                first = str(echo).strip().splitlines()[0] if str(echo).strip() else ""
                line += f" (rank 0 then raised {type(echo).__name__}: {first[:200]})"
            print(line, file=sys.stderr, flush=True)
            self.stop()
            sys.stdout.flush()
            os._exit(exit_code)

    def stop(self) -> None:
        """Terminate every started rank still running; kill those that ignore it."""
        self.stopping = True
        alive = [c.proc for c in self.children if c.proc.poll() is None]
        for proc in alive:
            proc.terminate()
        deadline = time.monotonic() + _TERMINATE_GRACE_S
        for proc in alive:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def wait(self) -> None:
        """At exit, rank 0 waits for the ranks it started (they die with it); a failure still ends the job."""
        if self._thread is not None:
            self._thread.join()


_WATCHDOG = _Watchdog()  # one per process: a script's later Trainers reuse the ranks started by the first


def processes_started() -> bool:
    """Whether this process already started the other local ranks of its script."""
    return bool(_WATCHDOG.children)


def _die_with_parent(parent_pid: int, libc: Any) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child between fork and exec
        if libc is not None:
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


@functools.cache  # once per process, however many Trainers launch
def _watch_parent(pid: int) -> None:
    """Where PR_SET_PDEATHSIG is missing: a started rank ends itself when its launcher is gone."""

    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="tandem-parent-watch", daemon=True).start()


class ScriptLauncher:
    """Start local ranks 1..N-1 by re-running this script with the rank variables set; this process is rank 0.

    Args:
        environment: the :class:`LocalEnvironment` of this job.
        num_processes: processes per node.
    """

    is_interactive_compatible = False

    def __init__(self, environment: LocalEnvironment, num_processes: int) -> None:
        self.environment = environment
        self.num_processes = num_processes

    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        if self.environment.creates_processes_externally:  # a rank that a launcher started
            if self.environment.launcher_pid is not None and sys.platform != "linux":
                _watch_parent(self.environment.launcher_pid)
        elif not _WATCHDOG.children and self.num_processes > 1:
            self._start_children()
        try:
            return function(*args, **kwargs)
        except BaseException as error:
            failed = _WATCHDOG.wait_for_failure(0.0 if isinstance(error, KeyboardInterrupt) else _ECHO_WAIT_S)
            if failed is not None:  # most likely an echo of that rank's failure (a closed connection)
                _WATCHDOG.fail(failed, echo=error)
            _WATCHDOG.stop()
            raise

    def _start_children(self) -> None:
        command = script_command()
        libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
        children = []
        for local_rank in range(1, self.num_processes):
            proc = subprocess.Popen(
                command,
                env=self.environment.child_environment(local_rank),
                preexec_fn=_die_with_parent(os.getpid(), libc),
            )
            children.append(_Child(self.environment.node_rank * self.num_processes + local_rank, proc))
        _WATCHDOG.start(children)


# ---------------------------------------------------------------------------------------------- spawn


def _to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu()


def collect(trainer: Any) -> dict[str, Any]:
    """What rank 0 of ``ddp_spawn`` sends back: trained weights, callback metrics, checkpoint paths."""
    payload: dict[str, Any] = {
        "state_dict": {k: v.detach().cpu() for k, v in trainer.strategy.full_module_state_dict().items()},
        "callback_metrics": apply_to_collection(dict(trainer.callback_metrics), torch.Tensor, _to_cpu),
    }
    checkpoint = getattr(trainer, "checkpoint_callback", None)
    if checkpoint is not None:
        payload["checkpoint"] = {
            name: getattr(checkpoint, name)
            for name in ("best_model_path", "last_model_path", "best_model_score")
            if hasattr(checkpoint, name)
        }
        payload["checkpoint"] = apply_to_collection(payload["checkpoint"], torch.Tensor, _to_cpu)
    return payload


def apply(trainer: Any, payload: dict[str, Any], module: torch.nn.Module | None) -> None:
    """Put rank 0's results into the calling process: weights into ``module``, the rest into ``trainer``."""
    if module is not None:
        module.load_state_dict(payload["state_dict"])
    trainer.callback_metrics.clear()
    trainer.callback_metrics.update(payload["callback_metrics"])
    checkpoint = getattr(trainer, "checkpoint_callback", None)
    if checkpoint is not None:
        for name, value in payload.get("checkpoint", {}).items():
            setattr(checkpoint, name, value)


def _spawned(
    local_rank: int,
    environment: LocalEnvironment,
    function: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    trainer: Any,
    result_path: str,
) -> None:
    environment.export_rank(local_rank)
    result = function(*args, **kwargs)
    payload = collect(trainer) if trainer is not None else None  # every rank: gathering the weights is a collective
    if environment.global_rank == 0:
        result = apply_to_collection(result, torch.Tensor, _to_cpu)
        torch.save({"result": result, "payload": payload}, result_path)


def _first_failure(context: ProcessContext, err: ProcessException) -> tuple[int, str]:
    """The process that failed first (the others' errors are mostly echoes) and its traceback."""
    written = [(os.path.getmtime(f), i, f) for i, f in enumerate(context.error_files) if os.path.exists(f)]
    if not written:
        return err.error_index, str(err).strip()
    _, index, path = min(written)
    with open(path, "rb") as fh:
        return index, pickle.load(fh)


class SpawnLauncher:
    """Run ``function`` in N spawned processes; the caller gets rank 0's return value back.

    With ``trainer`` given, rank 0 also sends back the trained weights (loaded into the first
    ``nn.Module`` among ``args``), ``trainer.callback_metrics`` (updated in place) and the checkpoint
    callback's ``best_model_path`` / ``last_model_path`` / ``best_model_score``.

    Args:
        environment: the :class:`LocalEnvironment` of this job.
        num_processes: processes per node.
        start_method: a ``torch.multiprocessing`` start method; "spawn" works everywhere.
    """

    is_interactive_compatible = True

    def __init__(self, environment: LocalEnvironment, num_processes: int, start_method: str = "spawn") -> None:
        self.environment = environment
        self.num_processes = num_processes
        self.start_method = start_method

    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        self.environment.export_rendezvous()  # the spawned processes inherit MASTER_ADDR / MASTER_PORT
        folder = tempfile.mkdtemp(prefix="tandem-spawn-")
        result_path = os.path.join(folder, "rank0.pt")
        try:
            context = mp.start_processes(
                _spawned,
                args=(self.environment, function, args, kwargs, trainer, result_path),
                nprocs=self.num_processes,
                join=False,
                start_method=self.start_method,
            )
            try:
                while not context.join():
                    pass
            except ProcessException as err:
                index, text = _first_failure(context, err)
                rank = self.environment.node_rank * self.num_processes + index
                raise RuntimeError(
                    f"ddp_spawn: rank {rank} failed; the other ranks were stopped. Its traceback:\n{text}"
                ) from None
            if not os.path.exists(result_path):  # global rank 0 runs on another node
                return None
            received = torch.load(result_path, weights_only=False)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if trainer is not None and received["payload"] is not None:
            module = next((a for a in args if isinstance(a, torch.nn.Module)), None)
            apply(trainer, received["payload"], module)
        return received["result"]
