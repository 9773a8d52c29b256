"""An MPI job (Open MPI, MPICH, Intel MPI, MVAPICH2): ranks from the variables each MPI family sets."""

from __future__ import annotations

import os
from typing import ClassVar

from tandem.strategies.environments.cluster_environment import _LOCAL_ADDRESS, ClusterEnvironment, _int
from tandem.utilities.exceptions import TandemConfigError


class MPIEnvironment(ClusterEnvironment):
    """Processes started by ``mpirun`` / ``mpiexec`` (Open MPI, MPICH, Intel MPI, MVAPICH2), read from the
    variables each sets; mpi4py is not needed (Lightning's ``MPIEnvironment`` asks it instead)."""

    name = "mpi"

    #: (rank, size, local rank, local size, node rank) variables of each MPI family
    FAMILIES: ClassVar[tuple[tuple[str, str, str, str, str | None], ...]] = (
        (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
            "OMPI_COMM_WORLD_NODE_RANK",
        ),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", None),
        (
            "MV2_COMM_WORLD_RANK",
            "MV2_COMM_WORLD_SIZE",
            "MV2_COMM_WORLD_LOCAL_RANK",
            "MV2_COMM_WORLD_LOCAL_SIZE",
            None,
        ),
    )

    @classmethod
    def family(cls) -> tuple[str, str, str, str, str | None] | None:
        """The variables of the MPI that started this process, or None."""
        return next((f for f in cls.FAMILIES if f[0] in os.environ and f[1] in os.environ), None)

    @classmethod
    def detect(cls) -> bool:
        return cls.family() is not None

    def _variables(self) -> tuple[str, str, str, str, str | None]:
        found = self.family()
        if found is None:
            raise KeyError("no MPI rank variables are set")
        return found

    @property
    def world_size(self) -> int:
        return _int(self._variables()[1])

    @property
    def global_rank(self) -> int:
        return _int(self._variables()[0])

    @property
    def local_rank(self) -> int:
        return _int(self._variables()[2], self.global_rank % max(1, self.local_size))  # block placement

    @property
    def local_size(self) -> int:
        _, size, _, local_size, _ = self._variables()
        return _int(local_size, _int(size))

    @property
    def node_rank(self) -> int:
        node_rank = self._variables()[4]
        if node_rank is not None and node_rank in os.environ:
            return _int(node_rank)
        return self.global_rank // max(1, self.local_size)  # ranks placed in blocks, as mpirun does by default

    @property
    def _one_node(self) -> bool:
        _, size, _, local_size, _ = self._variables()
        return local_size not in os.environ or _int(local_size) == _int(size)

    def _default_address(self) -> str:
        self._check_one_node()
        return _LOCAL_ADDRESS

    def _default_port(self) -> int:
        self._check_one_node()
        return 20000 + os.getppid() % 20000  # the launcher's process on this node: the same for all its ranks

    def _check_one_node(self) -> None:
        """Without MASTER_ADDR / MASTER_PORT, only a one-node job can agree on its rendezvous."""
        if not self._one_node:
            raise TandemConfigError(
                f"mpirun started {self.world_size} processes on several nodes ({self.local_size} on this one), and "
                "without mpi4py tandem cannot learn rank 0's host: set MASTER_ADDR (rank 0's host) and MASTER_PORT "
                "for every process, e.g. mpirun -x MASTER_ADDR=node01 -x MASTER_PORT=29500 ... (MPICH, Intel MPI: "
                "mpiexec -genv MASTER_ADDR node01 -genv MASTER_PORT 29500 ...)."
            )
