"""tandem's own launcher: the variables rank 0 gives the ranks it starts, and what a started rank reads back."""

from __future__ import annotations

import os

from tandem.strategies.environments.cluster_environment import ClusterEnvironment, _int
from tandem.strategies.environments.machine import find_free_port

ERROR_FILE_VARIABLE = "TANDEM_ERROR_FILE"


class LocalEnvironment(ClusterEnvironment):
    """tandem's own launcher: this process is rank 0 of its node and starts the others, or it is
    one of those others (LOCAL_RANK is set).

    Args:
        num_processes: processes per node (the strategy's devices).
        num_nodes: nodes in the job.
    """

    name = "local"

    def __init__(self, num_processes: int = 1, num_nodes: int = 1) -> None:
        self.num_processes = num_processes
        self.num_nodes = num_nodes

    @classmethod
    def detect(cls) -> bool:
        return True

    @property
    def creates_processes_externally(self) -> bool:
        return "LOCAL_RANK" in os.environ

    @property
    def world_size(self) -> int:
        return _int("WORLD_SIZE", self.num_processes * self.num_nodes)

    @property
    def global_rank(self) -> int:
        return _int("RANK", self.node_rank * self.num_processes + self.local_rank)

    @property
    def local_rank(self) -> int:
        return _int("LOCAL_RANK", 0)

    @property
    def node_rank(self) -> int:
        return _int("NODE_RANK", _int("GROUP_RANK", 0))

    def _default_port(self) -> int:
        """A free port picked now and exported, so every later reader agrees."""
        os.environ["MASTER_PORT"] = str(find_free_port())
        return _int("MASTER_PORT")

    @property
    def rendezvous_given(self) -> bool:
        """Whether MASTER_ADDR, MASTER_PORT and NODE_RANK were set: several nodes need all three."""
        return all(v in os.environ for v in ("MASTER_ADDR", "MASTER_PORT")) and (
            "NODE_RANK" in os.environ or "GROUP_RANK" in os.environ
        )

    @property
    def launcher_pid(self) -> int | None:
        """The pid of the process that started this one, when tandem's launcher did."""
        value = os.environ.get("TANDEM_LAUNCHER_PID")
        return int(value) if value and value.isdigit() else None

    @property
    def error_file(self) -> str | None:
        """Where this rank, started by tandem's launcher, writes the traceback of an error that ends it."""
        return os.environ.get(ERROR_FILE_VARIABLE) or None

    def rank_variables(self, local_rank: int) -> dict[str, str]:
        """The variables that make a process local rank ``local_rank`` of this node."""
        return {
            "MASTER_ADDR": self.main_address,
            "MASTER_PORT": str(self.main_port),
            "WORLD_SIZE": str(self.world_size),
            "NODE_RANK": str(self.node_rank),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(self.num_processes),
            "RANK": str(self.node_rank * self.num_processes + local_rank),
        }

    def child_environment(self, local_rank: int, error_file: str | None = None) -> dict[str, str]:
        """The whole environment for a rank this process starts with ``subprocess``."""
        extra = {ERROR_FILE_VARIABLE: error_file} if error_file else {}
        return {**os.environ, **self.rank_variables(local_rank), "TANDEM_LAUNCHER_PID": str(os.getpid()), **extra}

    def export_rank(self, local_rank: int) -> None:
        """Make this process local rank ``local_rank`` (a spawned process, which inherits no variables)."""
        os.environ.update(self.rank_variables(local_rank))
