"""torchft's replica groups (``strategy="ddp_ft"``): where this group sits among the others, and the environment of
a group started from this process."""

from __future__ import annotations

import os

from tandem.strategies.environments.cluster_environment import _int


class ReplicaGroupEnvironment:
    """Where this replica group sits among the others of a fault-tolerant job (``strategy="ddp_ft"``): torchft's
    variables, read when the strategy sets up (a group's ranks inside it come from its own launcher's environment)."""

    @property
    def lighthouse(self) -> str | None:
        """The lighthouse's address (``TORCHFT_LIGHTHOUSE``), or None when it is not set."""
        return os.environ.get("TORCHFT_LIGHTHOUSE") or None

    @property
    def group_id(self) -> int:
        return _int("REPLICA_GROUP_ID", 0)

    @property
    def num_groups(self) -> int:
        return _int("NUM_REPLICA_GROUPS", 1)

    @staticmethod
    def quiet_lighthouse() -> None:
        """torchft's lighthouse logs every quorum request at INFO: warnings only in this process, unless RUST_LOG is
        set (before torchft is imported)."""
        os.environ.setdefault("RUST_LOG", "warn")

    #: a job's rendezvous, which a replica group started from this process must not inherit: each has its own
    RENDEZVOUS = (
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "TORCHELASTIC_RUN_ID",
    )

    @classmethod
    def group_environment(cls, lighthouse: str, group_id: int, num_groups: int, restarts: int) -> dict[str, str]:
        """The environment of replica group ``group_id`` started from this process (``ft_launch``): this process's,
        less any job's rendezvous, with torchft's variables and ``TANDEM_FT_RESTARTS`` (how often the group was
        started again before)."""
        inherited = {k: v for k, v in os.environ.items() if k not in cls.RENDEZVOUS}
        return {
            "RUST_LOG": "warn",  # torchft's manager logs every quorum at INFO; RUST_LOG set outside wins
            **inherited,
            "TORCHFT_LIGHTHOUSE": lighthouse,
            "REPLICA_GROUP_ID": str(group_id),
            "NUM_REPLICA_GROUPS": str(num_groups),
            "TANDEM_FT_RESTARTS": str(restarts),
        }
