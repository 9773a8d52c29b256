"""Which launcher started this process: the environment that describes it, and the rank before any strategy runs."""

from __future__ import annotations

import os

from tandem.strategies.environments.cluster_environment import ClusterEnvironment
from tandem.strategies.environments.kubeflow import KubeflowEnvironment
from tandem.strategies.environments.local import LocalEnvironment
from tandem.strategies.environments.lsf import LSFEnvironment
from tandem.strategies.environments.mpi import MPIEnvironment
from tandem.strategies.environments.slurm import SLURMEnvironment
from tandem.strategies.environments.torchelastic import TorchElasticEnvironment
from tandem.utilities.exceptions import TandemConfigError


def rank_from_environment() -> int:
    """The global rank a launcher gave this process, or 0 when none did. MPI's rank is read before SLURM's: an
    mpirun inside a SLURM allocation inherits the batch step's SLURM_PROCID."""
    mpi_ranks = [family[0] for family in MPIEnvironment.FAMILIES]
    for name in ("RANK", *mpi_ranks, "JSM_NAMESPACE_RANK", "SLURM_PROCID"):
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def select_environment(num_processes: int = 1, num_nodes: int = 1) -> ClusterEnvironment:
    """The environment that describes this process: torchrun, SLURM, LSF, MPI, Kubeflow, else tandem's launcher.

    Args:
        num_processes: processes per node the strategy expects (used by tandem's launcher).
        num_nodes: nodes the strategy expects.
    """
    for cls in (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment, KubeflowEnvironment):
        if cls.detect():
            return cls()
    _check_complete()
    return LocalEnvironment(num_processes, num_nodes)


def _check_complete() -> None:
    """No known launcher was detected: refuse partial rank variables, which an unknown launcher set (a process
    taking itself for rank 0 and starting ranks of its own would train the job twice)."""
    present = [v for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if v in os.environ]
    if not present and "PMIX_RANK" in os.environ:  # prterun or another bare PMIx launcher: no size to read
        raise TandemConfigError(
            f"This process has PMIX_RANK={os.environ['PMIX_RANK']} but no rank and size variables tandem reads: it "
            "was started by a PMIx launcher (prterun, or an MPI built on PMIx alone), which exports no world size, "
            "so each process would take itself for a rank 0 and start ranks of its own. Start the job with Open "
            "MPI's mpirun, MPICH's mpiexec, srun or torchrun, or set RANK, WORLD_SIZE, LOCAL_RANK (and "
            "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) for every process."
        )
    if not present:
        return
    if "LOCAL_RANK" in os.environ:
        missing = [v for v in ("RANK", "WORLD_SIZE") if v not in os.environ]
    elif os.environ.get("RANK", "0") == "0" and os.environ.get("WORLD_SIZE", "1") == "1":
        return  # a lone process that says it is rank 0 of 1
    else:
        missing = ["LOCAL_RANK"] + [v for v in ("RANK", "WORLD_SIZE") if v not in os.environ]
    if not missing:
        return
    given = ", ".join(f"{v}={os.environ[v]}" for v in present)
    raise TandemConfigError(
        f"This process has {given} but not {', '.join(missing)}: it was started by a launcher tandem does not "
        "recognise (torchrun, srun, mpirun, jsrun and Kubeflow are detected), and guessing would make it a rank 0 "
        "that starts ranks of its own. Set RANK, WORLD_SIZE, LOCAL_RANK (and LOCAL_WORLD_SIZE, MASTER_ADDR, "
        "MASTER_PORT, NODE_RANK) for every process, start the job with torchrun, or unset them to let tandem "
        "start the ranks."
    )
