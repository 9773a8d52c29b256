"""SLURM's job: ranks from srun's variables, its compressed host list, and which job a pre-emption stop requeues."""

from __future__ import annotations

import os
import re
import signal

from tandem.strategies.environments.cluster_environment import _LOCAL_ADDRESS, ClusterEnvironment, _int
from tandem.strategies.environments.mpi import MPIEnvironment
from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.preemption import SIGNALS


class SLURMEnvironment(ClusterEnvironment):
    """Tasks started by ``srun`` (one process per task), and what a pre-emption stop does to the SLURM job.

    Args:
        auto_requeue: after the pre-emption stop (``last.ckpt`` saved) for ``requeue_signal``, rank 0 requeues
            the job with ``scontrol requeue`` (default). False leaves the job ended.
        requeue_signal: the signal whose stop requeues the job: ``signal.SIGUSR1`` (None, the default; SLURM
            sends it ahead of the end with ``sbatch --signal=USR1@90``) or ``signal.SIGTERM``, the two signals
            tandem stops for.

    Example:
        ```python
        Trainer(plugins=[SLURMEnvironment(auto_requeue=False)])  # stop and save on SIGUSR1, but no requeue
        ```
    """

    name = "slurm"
    variables = ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")

    def __init__(self, auto_requeue: bool = True, requeue_signal: signal.Signals | None = None) -> None:
        if not isinstance(auto_requeue, bool):
            raise TandemConfigError(f"SLURMEnvironment(auto_requeue={auto_requeue!r}) must be True or False.")
        if requeue_signal is None:
            requeue_signal = getattr(signal, "SIGUSR1", signal.SIGTERM)
        if requeue_signal not in SIGNALS:
            names = " or ".join(f"signal.{signal.Signals(s).name}" for s in SIGNALS)
            raise TandemConfigError(
                f"SLURMEnvironment(requeue_signal={requeue_signal!r}): tandem stops for pre-emption on {names} "
                "only, so only those can requeue the job. Use one of them (sbatch --signal=USR1@90 sends SIGUSR1)."
            )
        self.auto_requeue = auto_requeue
        self.requeue_signal = signal.Signals(requeue_signal)

    def __repr__(self) -> str:
        return f"SLURMEnvironment(auto_requeue={self.auto_requeue}, requeue_signal=signal.{self.requeue_signal.name})"

    @classmethod
    def detect(cls) -> bool:
        if "SLURM_PROCID" not in os.environ or _int("SLURM_NTASKS", 1) < 2:
            return False
        if os.environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
            return False
        # With MPI's variables too: srun started the ranks itself (srun --mpi=pmi2: one task per MPI rank), or an
        # mpirun inside the allocation did, and its processes inherited one SLURM_PROCID. Decided from variables
        # every process of the job has alike, so all of them take the same environment.
        mpi = MPIEnvironment.family()
        return mpi is None or os.environ.get("SLURM_STEP_NUM_TASKS") == os.environ[mpi[1]]

    def _default_address(self) -> str:
        nodelist = os.environ.get("SLURM_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", _LOCAL_ADDRESS)
        return expand_nodelist(nodelist)[0]

    def _default_port(self) -> int:
        job_id = os.environ.get("SLURM_JOB_ID", "")
        return 15000 + int(job_id[-4:]) if job_id[-4:].isdigit() else 12910


def slurm_job_to_requeue() -> str | None:
    """The SLURM job this process belongs to, as ``scontrol requeue`` names it (``<array job>_<task>`` for an
    array task), or None outside a SLURM batch job (interactive ``salloc`` shells included)."""
    if os.environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return None
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return os.environ.get("SLURM_JOB_ID") or None


def requeues(signum: int, environment: ClusterEnvironment | None = None) -> bool:
    """Whether a pre-emption stop for ``signum`` asks SLURM to requeue the job: on SIGUSR1 unless the
    environment given to the Trainer or strategy is a
    [`SLURMEnvironment`][tandem.strategies.environments.SLURMEnvironment] that says otherwise."""
    slurm = environment if isinstance(environment, SLURMEnvironment) else SLURMEnvironment()
    return slurm.auto_requeue and signum == slurm.requeue_signal


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand SLURM's compressed host list: ``"node[03-05,7],gpu1"`` → node03, node04, node05, node7, gpu1."""
    hosts: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", nodelist):
        hosts.extend(_expand_host(item.strip()))
    return [h for h in hosts if h]


def _expand_host(pattern: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    expanded: list[str] = []
    for part in match.group(1).split(","):
        lo, _, hi = part.partition("-")
        numbers = [lo] if not hi else [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
        for number in numbers:
            expanded.extend(_expand_host(f"{head}{number}{tail}"))
    return expanded
