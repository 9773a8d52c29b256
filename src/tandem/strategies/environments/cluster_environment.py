"""The base of every cluster environment: where this process sits in the job, read from its launcher's variables."""

from __future__ import annotations

import os
from typing import ClassVar

_LOCAL_ADDRESS = "127.0.0.1"


def _int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise KeyError(f"the environment variable {name} is not set")
        return default
    return int(value)


class ClusterEnvironment:
    """Where this process sits in the job: read from the variables its launcher set.

    ``creates_processes_externally`` is True when something other than tandem started the processes
    (or this process is one that tandem started): then tandem launches nothing.
    """

    name: ClassVar[str] = ""
    #: how to make the Trainer's devices and num_nodes match the job this launcher started
    shape_hint: ClassVar[str] = (
        "Set devices to the processes per node (torchrun --nproc-per-node, srun --ntasks-per-node, the ranks mpirun "
        "starts per node) and num_nodes to the number of nodes."
    )

    #: the variables the launcher sets for the world size, the global, local and node rank, which the rank
    #: properties read (None: a subclass computes that one itself)
    variables: ClassVar[tuple[str | None, str | None, str | None, str | None]] = (None, None, None, None)

    @classmethod
    def detect(cls) -> bool:
        """Whether the current environment variables describe a job of this kind."""
        raise NotImplementedError

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def world_size(self) -> int:
        return self._read(0)

    @property
    def global_rank(self) -> int:
        return self._read(1)

    @property
    def local_rank(self) -> int:
        return self._read(2)

    @property
    def node_rank(self) -> int:
        return self._read(3)

    def _read(self, index: int) -> int:
        name = self.variables[index]
        if name is None:
            raise NotImplementedError(f"{type(self).__name__} names no variable for this value")
        return _int(name)

    @property
    def main_address(self) -> str:
        """MASTER_ADDR when set, else the launcher's own rule (``_default_address``)."""
        return os.environ["MASTER_ADDR"] if "MASTER_ADDR" in os.environ else self._default_address()

    @property
    def main_port(self) -> int:
        """MASTER_PORT when set, else the launcher's own rule (``_default_port``)."""
        return _int("MASTER_PORT") if "MASTER_PORT" in os.environ else self._default_port()

    def _default_address(self) -> str:
        return _LOCAL_ADDRESS

    def _default_port(self) -> int:
        return _int("MASTER_PORT")  # none: the KeyError names the variable

    def export_rendezvous(self) -> None:
        """Put MASTER_ADDR / MASTER_PORT into this process's environment for ``init_method="env://"``."""
        os.environ["MASTER_ADDR"] = self.main_address
        os.environ["MASTER_PORT"] = str(self.main_port)

    def __repr__(self) -> str:
        try:
            where = (
                f"world_size={self.world_size}, global_rank={self.global_rank}, local_rank={self.local_rank}, "
                f"node_rank={self.node_rank}"
            )
        except (KeyError, ValueError):  # built (as a plugin) outside a job of its kind
            where = "its variables not set"
        return f"{type(self).__name__}({where})"
