"""The environment contract, read in this module and nowhere else.

Variables tandem reads (set by torchrun / torch.distributed.run, by SLURM's srun, or by tandem's own
launcher when it starts the other ranks of a script):

    RANK             global rank of this process, 0 .. WORLD_SIZE-1
    LOCAL_RANK       rank of this process on its node
    WORLD_SIZE       number of processes in the job
    MASTER_ADDR      address of the rank-0 host for the process-group rendezvous
    MASTER_PORT      free TCP port on that host
    GROUP_RANK / NODE_RANK   index of this node (torchrun sets GROUP_RANK)
    SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NODELIST   under srun
    OMP_NUM_THREADS  when set, tandem leaves torch's thread count alone
"""

from __future__ import annotations

import os


def rank_from_environment() -> int:
    """The global rank a launcher gave this process, or 0 when none did."""
    for name in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return 0
