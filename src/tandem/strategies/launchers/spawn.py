"""``SpawnLauncher`` (``strategy="ddp_spawn"``, ``"ddp_notebook"``): one function in spawned or forked processes,
and the payload that brings rank 0's results back to the caller."""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import wait as wait_for_any
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from lightning_utilities.core.apply_func import apply_to_collection

from tandem.strategies.environments.local import LocalEnvironment
from tandem.strategies.launchers.pickling import _unpicklable
from tandem.strategies.launchers.records import _failure_message, _how_it_ended, _read_error_record, _write_error_record
from tandem.strategies.launchers.watchdog import _TERMINATE_GRACE_S
from tandem.strategies.side_channel import announce_teardown, error_summary
from tandem.utilities.checkpoint import atomic_save
from tandem.utilities.exceptions import Preempted, RankFailedError, TandemConfigError
from tandem.utilities.preemption import EXIT_CODES as PREEMPTED_EXIT_CODES
from tandem.utilities.preemption import PREEMPTION
from tandem.utilities.processes import end_with_parent

_PREEMPTED_WAIT_S = 60.0  # ddp_spawn: a rank stopped for a pre-emption; the others must follow within this
_SETTLE_S = 0.3  # ddp_spawn: after the first failure, how long to let the others end (and write) first
_NOT_GUARDED_EXIT = 87  # a spawned process that re-ran the user's unguarded script exits with this


def _to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu()


def collect(trainer: Any) -> dict[str, Any]:
    """What rank 0 of ``ddp_spawn`` sends back: trained weights, metrics, loop progress, checkpoint paths."""
    payload: dict[str, Any] = {
        "state_dict": {k: v.detach().cpu() for k, v in trainer.strategy.full_module_state_dict().items()},
        "callback_metrics": apply_to_collection(dict(trainer.callback_metrics), torch.Tensor, _to_cpu),
        "logged_metrics": apply_to_collection(dict(getattr(trainer, "logged_metrics", {})), torch.Tensor, _to_cpu),
    }
    payload["progress"] = trainer.fit_loop.state_dict()  # current_epoch and global_step read it afterwards
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
    logged = getattr(trainer, "logged_metrics", None)
    if isinstance(logged, dict) and "logged_metrics" in payload:
        logged.clear()
        logged.update(payload["logged_metrics"])
    trainer.fit_loop.load_state_dict(payload["progress"])
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
    folder: str,
    rng_state: dict[str, Any],
) -> None:
    """A spawned rank: the caller's RNG state (so seed_everything holds), the function, and the outcome on disk."""
    from tandem.utilities.seed import restore_rng_state

    Path(folder, f"started{local_rank}").touch()  # it got past importing the user's script
    end_with_parent()  # end with the caller
    try:
        environment.export_rank(local_rank)
        restore_rng_state(rng_state)
        result = function(*args, **kwargs)
        payload = collect(trainer) if trainer is not None else None  # every rank: gathering weights is a collective
        if environment.global_rank == 0:
            result = apply_to_collection(result, torch.Tensor, _to_cpu)
            atomic_save({"result": result, "payload": payload}, os.path.join(folder, "rank0.pt"))
    except KeyboardInterrupt:
        sys.exit(130)  # Ctrl-C reached every process; the caller reports it
    except Preempted as stopped:  # every rank stopped at the same step, last.ckpt written
        if environment.global_rank == 0:
            _write_error_record(os.path.join(folder, "preempted.txt"), f"{stopped.checkpoint}\n{stopped.message}")
        sys.exit(stopped.code)
    except BaseException as error:  # the caller raises the first failure's traceback; the others are its echoes
        _write_error_record(os.path.join(folder, f"error{local_rank}.txt"), traceback.format_exc(), error)
        announce_teardown(f"rank {environment.global_rank} failed ({error_summary(error)})")  # the others end now
        sys.exit(1)


class SpawnLauncher:
    """Run ``function`` in N spawned processes; the caller gets rank 0's return value back.

    With ``trainer`` given, rank 0 also sends back the trained weights (loaded into the first
    ``nn.Module`` among ``args``), ``trainer.callback_metrics`` and ``logged_metrics`` (updated in
    place), ``current_epoch`` / ``global_step``, and the checkpoint callback's ``best_model_path`` /
    ``last_model_path`` / ``best_model_score``. The spawned processes start from the caller's RNG state
    (``seed_everything`` holds in them), and the loggers' version folder is fixed in the caller first,
    so every stage of one Trainer logs into one folder.

    Args:
        environment: the [`LocalEnvironment`][tandem.strategies.environments.LocalEnvironment] of this job.
        num_processes: processes per node.
        start_method: a ``torch.multiprocessing`` start method; "spawn" works everywhere.
    """

    def __init__(self, environment: LocalEnvironment, num_processes: int, start_method: str = "spawn") -> None:
        self.environment = environment
        self.num_processes = num_processes
        self.start_method = start_method

    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        if self.start_method == "fork" and torch.cuda.is_initialized():
            raise TandemConfigError(
                "strategy='ddp_notebook' / 'ddp_fork' starts the ranks by forking this process, and CUDA is already "
                "initialised in it (a tensor or module was put on a GPU, or a torch.cuda call ran before the "
                "Trainer): a forked process cannot use CUDA then. Restart the kernel and keep every CUDA call "
                "inside the Trainer (the module on the CPU until fit), or use strategy='ddp_spawn' with the "
                "classes in an importable module."
            )
        if self.start_method == "spawn":
            _check_importable_by_spawn([*args, *kwargs.values(), *(getattr(trainer, "callbacks", None) or [])])
        if getattr(mp.current_process(), "_inheriting", False):
            # A spawned process imports the user's script again; without the __main__ guard that import
            # reached this line. End quietly: the caller sees the exit code and explains (once).
            raise SystemExit(_NOT_GUARDED_EXIT)
        self.environment.export_rendezvous()  # the spawned processes inherit MASTER_ADDR / MASTER_PORT
        for logger in getattr(trainer, "loggers", None) or []:
            logger.version = logger.version  # fixed here: fit, test and log_dir all name one folder
        from tandem.utilities.seed import capture_rng_state

        rng_state = capture_rng_state()
        rng_state.pop("cuda", None)  # each rank seeds its own device from torch's seed
        folder = tempfile.mkdtemp(prefix="tandem-spawn-")
        context = mp.get_context(self.start_method)
        processes: list[Any] = []
        try:
            for local_rank in range(self.num_processes):
                process = context.Process(  # type: ignore[attr-defined]  # typeshed's BaseContext (for a str) lacks it
                    target=_spawned,
                    args=(local_rank, self.environment, function, args, kwargs, trainer, folder, rng_state),
                    name=f"tandem-rank-{local_rank}",
                )
                try:
                    process.start()
                except (TypeError, AttributeError, pickle.PicklingError) as err:
                    found = _unpicklable(err, [*args, *kwargs.values(), trainer, function])
                    if found is None:
                        raise
                    raise found from None
                processes.append(process)
            PREEMPTION.forward_to = lambda: [p.pid for p in processes if p.exitcode is None]  # signals reach them
            PREEMPTION.install()
            try:
                self._wait(processes, folder)
            finally:
                PREEMPTION.uninstall()
                PREEMPTION.forward_to, PREEMPTION.signum = None, None  # the ranks stop; this process has no loop
            result_path = os.path.join(folder, "rank0.pt")
            if not os.path.exists(result_path):  # global rank 0 runs on another node
                return None
            received = torch.load(result_path, weights_only=False)
        finally:
            _stop(processes)
            shutil.rmtree(folder, ignore_errors=True)
        if trainer is not None and received["payload"] is not None:
            module = next((a for a in args if isinstance(a, torch.nn.Module)), None)
            apply(trainer, received["payload"], module)
        return received["result"]

    def _wait(self, processes: list[Any], folder: str) -> None:
        """Until every process ended; the first failure (not its echoes in the others) is raised."""
        running = list(range(len(processes)))
        ended: list[int] = []  # in the order they were seen to end
        preempted_at: float | None = None  # a rank stopped for a pre-emption: the others stop at the same step
        while running:
            timeout = None if preempted_at is None else max(0.0, preempted_at + _PREEMPTED_WAIT_S - time.monotonic())
            ready = wait_for_any([processes[i].sentinel for i in running], timeout)
            for i in list(running):
                if processes[i].sentinel in ready:
                    processes[i].join()
                    running.remove(i)
                    ended.append(i)
            codes = [processes[i].exitcode for i in ended]
            if any(code != 0 and code not in PREEMPTED_EXIT_CODES for code in codes):
                break
            if preempted_at is None and any(code in PREEMPTED_EXIT_CODES for code in codes):
                preempted_at = time.monotonic()
            if not ready and running:
                break  # a rank did not follow the others' pre-emption stop: a failure
        else:
            stopped = sorted({processes[i].exitcode for i in ended} & PREEMPTED_EXIT_CODES)
            if stopped:
                raise _preempted_error(stopped[0], folder)
            return
        deadline = time.monotonic() + _SETTLE_S  # the others may end on their own: their records help decide
        while running and time.monotonic() < deadline:
            for i in list(running):
                if processes[i].exitcode is not None:
                    running.remove(i)
                    ended.append(i)
            time.sleep(0.02)
        _stop(processes)
        failed = [i for i in ended if processes[i].exitcode not in (0, *PREEMPTED_EXIT_CODES)]
        raise self._failure(processes, failed or [i for i in range(len(processes)) if i not in ended], folder)

    def _failure(self, processes: list[Any], failed: list[int], folder: str) -> Exception:
        started = {i for i in range(len(processes)) if os.path.exists(os.path.join(folder, f"started{i}"))}
        if any(processes[i].exitcode == _NOT_GUARDED_EXIT and i not in started for i in failed):
            return TandemConfigError(
                "strategy='ddp_spawn' starts each process by importing your script again, and this script starts "
                'training as it is imported (it has no `if __name__ == "__main__":` guard). Put the code that '
                'creates the Trainer and calls fit under `if __name__ == "__main__":`, or use strategy="ddp", '
                "which runs the whole script on every rank."
            )
        records = {i: _read_error_record(os.path.join(folder, f"error{i}.txt")) for i in failed}
        # A rank killed by a signal (other than an abort, which can be the echo of another's failure) failed
        # first: the others' errors are what its disappearance caused. Else the earliest written traceback.
        killed = [i for i in failed if processes[i].exitcode < 0 and -processes[i].exitcode != signal.SIGABRT]
        with_record = sorted((r[0], i) for i, r in records.items() if r is not None)
        first = killed[0] if killed else with_record[0][1] if with_record else failed[0]
        rank = self.environment.node_rank * self.num_processes + first
        ended = _how_it_ended(processes[first].exitcode)
        return RankFailedError(_failure_message("ddp_spawn: ", rank, ended, records[first]))


def _check_importable_by_spawn(objects: list[Any]) -> None:
    """A spawned process finds each class by importing its module; a class defined in the ``__main__`` of an
    interactive session (a notebook, ``python -c``) cannot be found that way."""
    if getattr(sys.modules.get("__main__"), "__file__", None) is not None:
        return  # a script: the spawned process imports it again (under its __main__ guard)
    found = next((type(o) for o in objects if type(o).__module__ == "__main__"), None)
    if found is not None:
        raise TandemConfigError(
            f"strategy='ddp_spawn' starts fresh processes that import each class by name, and {found.__name__} is "
            "defined in this interactive session (a notebook cell, python -c), which they cannot import. Use "
            "strategy='ddp_notebook', which forks this process so the class comes along, or move the class into a "
            ".py module and import it."
        )


def _preempted_error(code: int, folder: str) -> Preempted:
    """The caller's Preempted after every spawned rank stopped for a pre-emption signal (rank 0 said where)."""
    record = _read_error_record(os.path.join(folder, "preempted.txt"))
    checkpoint, _, message = record[1].partition("\n") if record is not None else ("", "", "")
    return Preempted(code - 128, checkpoint, message or "ddp_spawn: the ranks stopped for a pre-emption signal.")


def _stop(processes: list[Any]) -> None:
    """Terminate the processes still running; kill those that ignore it."""
    alive = [p for p in processes if p.exitcode is None and p.is_alive()]
    for process in alive:
        process.terminate()
    deadline = time.monotonic() + _TERMINATE_GRACE_S
    for process in alive:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.exitcode is None:
            process.kill()
            process.join()
