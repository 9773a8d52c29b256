"""torchrun's job: ranks from the variables torchrun's agent sets."""

from __future__ import annotations

import os

from tandem.strategies.environments.cluster_environment import ClusterEnvironment, _int
from tandem.utilities.rank_zero import rank_zero_warn


class TorchElasticEnvironment(ClusterEnvironment):
    """Processes started by torchrun / ``python -m torch.distributed.run``."""

    name = "torchrun"
    variables = ("WORLD_SIZE", "RANK", "LOCAL_RANK", None)

    @classmethod
    def detect(cls) -> bool:
        return all(v in os.environ for v in ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK"))

    @property
    def node_rank(self) -> int:
        return _int("GROUP_RANK", 0)

    @property
    def restarts_share_store(self) -> bool:
        """Whether a restart would reuse torchrun's store, which still holds the previous attempt's keys."""
        return _int("TORCHELASTIC_MAX_RESTARTS", 0) > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"

    def export_rendezvous(self) -> None:
        """torchrun's agent already exported them (and serves the store at MASTER_PORT); warn when its
        restarts would reuse that store."""
        if self.restarts_share_store:
            rank_zero_warn(
                f"torchrun --max-restarts={_int('TORCHELASTIC_MAX_RESTARTS')} shares its rendezvous store with "
                "the workers, so a restarted job can read the previous attempt's keys and fail or hang while it "
                "joins the process group (pytorch/pytorch#135712). Start torchrun with "
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 and the c10d rendezvous (--standalone, or --rdzv-backend "
                "c10d --rdzv-endpoint HOST:PORT)."
            )
