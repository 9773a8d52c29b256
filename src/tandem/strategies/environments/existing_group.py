"""A process group someone else already initialised (Ray Train, the script itself): ranks from the group."""

from __future__ import annotations

import torch.distributed as dist

from tandem.strategies.environments.cluster_environment import ClusterEnvironment, _int


class ProcessGroupEnvironment(ClusterEnvironment):
    """A default process group that someone else already initialised (Ray Train's ``TorchTrainer``, or a
    script's own ``torch.distributed.init_process_group``): ranks come from the group itself, tandem starts
    no processes and leaves the group alone at the end.

    Args:
        num_processes: processes per node (the strategy's devices): the local rank when LOCAL_RANK is not set.
    """

    name = "existing process group"

    def __init__(self, num_processes: int = 1) -> None:
        self.num_processes = max(num_processes, 1)

    @classmethod
    def detect(cls) -> bool:
        return dist.is_available() and dist.is_initialized()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    @property
    def global_rank(self) -> int:
        return dist.get_rank()

    @property
    def local_rank(self) -> int:
        return _int("LOCAL_RANK", self.global_rank % self.num_processes)

    @property
    def node_rank(self) -> int:
        return _int("NODE_RANK", self.global_rank // self.num_processes)

    def export_rendezvous(self) -> None:
        """Nothing to export: the group is already joined."""
