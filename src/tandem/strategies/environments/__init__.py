"""The environment contract, read in this package and nowhere else.

A distributed job is described by environment variables. Whoever starts the processes sets them:
torchrun / torch.distributed.run, SLURM's srun, or tandem's own launcher when it starts the other
ranks of a script (``strategy="ddp"``) or spawns them (``strategy="ddp_spawn"``).

torchrun (detected by ``TORCHELASTIC_RUN_ID``):

```text
RANK             global rank of this process, 0 .. WORLD_SIZE-1
LOCAL_RANK       rank of this process on its node
WORLD_SIZE       number of processes in the job
GROUP_RANK       index of this node
MASTER_ADDR      address of the rank-0 host for the process-group rendezvous
MASTER_PORT      TCP port on that host (torchrun's own store)
TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_USE_AGENT_STORE
                 with restarts allowed and the agent's store shared with the workers (torch's
                 default since 2.5), a restarted job can read the previous attempt's keys and
                 fail or hang in init_process_group (pytorch/pytorch#135712): tandem warns. Fix:
                 ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --rdzv-backend c10d ...``
                 (or ``--standalone``); the static rendezvous always shares its store.
```

SLURM (detected when ``srun`` started more than one task, outside ``salloc``'s interactive shells,
i.e. ``SLURM_JOB_NAME`` is not ``bash`` or ``interactive``):

```text
SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID   rank, world size, local rank, node
SLURM_NODELIST   e.g. ``node[03-05,7]``; its first host is MASTER_ADDR unless MASTER_ADDR is set
MASTER_PORT      if unset: 15000 + the last four digits of SLURM_JOB_ID
SLURM_JOB_ID, SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID
                 the job that rank 0 requeues (``scontrol requeue``) after a pre-emption stop on SIGUSR1
                 (any SLURM batch job, however its processes were started; not an interactive one).
                 ``Trainer(plugins=[SLURMEnvironment(auto_requeue=False)])`` turns that off, and
                 ``requeue_signal=signal.SIGTERM`` requeues on SIGTERM instead
```

LSF's ``jsrun`` (detected by all of ``LSB_JOBID``, ``LSB_DJOB_RANKFILE``, ``JSM_NAMESPACE_LOCAL_RANK``,
``JSM_NAMESPACE_SIZE``):

```text
JSM_NAMESPACE_RANK, JSM_NAMESPACE_SIZE, JSM_NAMESPACE_LOCAL_RANK   rank, world size, local rank
LSB_DJOB_RANKFILE  one host per line, the launch node first: the host of rank r is line r + 2; the node
                   rank is that host's index among the distinct hosts; the first of them is MASTER_ADDR
MASTER_PORT      if unset: 10000 + LSB_JOBID % 1000 (Lightning's rule)
```

MPI's ``mpirun`` / ``mpiexec``, without mpi4py (detected by a rank and a size variable of one family). Inside a
SLURM allocation, SLURM's variables are read only when srun started the MPI ranks itself (``srun --mpi=pmi2``:
``SLURM_STEP_NUM_TASKS`` equals the MPI size); the processes of an ``mpirun`` there inherit one SLURM_PROCID,
so MPI's variables are read instead:

```text
Open MPI    OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _NODE_RANK
MPICH, Intel MPI (Hydra)   PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
MVAPICH2    MV2_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
MASTER_ADDR, MASTER_PORT   needed on several nodes (``mpirun -x MASTER_ADDR=<rank 0's host> -x
                 MASTER_PORT=29500``; MPICH: ``-genv``). On one node the address is 127.0.0.1 and the port,
                 unless set, is derived from the pid of the launcher's process that started this node's ranks
                 (the same for all of them): 20000 + that pid % 20000
Without a node-rank variable, ranks are taken to be placed in blocks: node rank = rank // local size.
```

Kubeflow's PyTorchJob (v1; detected by ``KUBERNETES_SERVICE_HOST`` or ``KUBERNETES_PORT`` with ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and no ``LOCAL_RANK``): one process per pod, so the node
rank is ``RANK`` and the local rank 0; ``Trainer(devices=1, num_nodes=<pods>)``. For several devices per pod,
run torchrun inside each pod (then torchrun's variables are read).

A process whose variables are partial (``RANK`` or ``WORLD_SIZE`` without ``LOCAL_RANK`` outside Kubeflow,
``LOCAL_RANK`` without ``RANK`` or ``WORLD_SIZE``, or ``PMIX_RANK`` alone: a bare PMIx launcher such as prterun
exports no world size) was started by a launcher tandem does not know: it is an error naming what is missing,
never a silent rank 0 that starts ranks of its own.

tandem's launcher (otherwise). The first process is rank 0 of its node; it exports to the ranks it
starts RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT and
TANDEM_LAUNCHER_PID (its own pid: a started rank ends itself when that process is gone) and
TANDEM_ERROR_FILE (where the started rank writes the traceback of an error that ends it, for rank 0 to
report). A process with LOCAL_RANK set was started by a launcher and starts nothing. With one node, MASTER_ADDR
defaults to 127.0.0.1 and a free MASTER_PORT is picked; with several nodes, set MASTER_ADDR,
MASTER_PORT and NODE_RANK on every node.

torchft's replica groups (``strategy="ddp_ft"``; `ReplicaGroupEnvironment`).
Each replica group is a job of its own, described by one of the launchers above; these say where it sits among the
others (the names torchft's own examples read):

```text
TORCHFT_LIGHTHOUSE   the lighthouse's address, e.g. http://localhost:29510
REPLICA_GROUP_ID     this group's id, 0 .. NUM_REPLICA_GROUPS-1 (default 0)
NUM_REPLICA_GROUPS   how many groups the job has at most (default 1): each step's data is that many shares
TANDEM_FT_RESTARTS   set by ``python -m tandem.strategies.ft_launch``: how often the group was started again
```

Also read here:

```text
OMP_NUM_THREADS     when set, tandem leaves torch's thread count alone; otherwise each process
                    uses max(1, cpus // processes on the node) threads
TANDEM_GLOBAL_SEED  set by seed_everything; seeds the DistributedSampler's shuffling (else 0)
```
"""

from tandem.strategies.environments.cluster_environment import ClusterEnvironment
from tandem.strategies.environments.existing_group import ProcessGroupEnvironment
from tandem.strategies.environments.kubeflow import KubeflowEnvironment
from tandem.strategies.environments.local import LocalEnvironment
from tandem.strategies.environments.lsf import LSFEnvironment
from tandem.strategies.environments.mpi import MPIEnvironment
from tandem.strategies.environments.replica_group import ReplicaGroupEnvironment
from tandem.strategies.environments.selection import rank_from_environment, select_environment
from tandem.strategies.environments.slurm import SLURMEnvironment, requeues, slurm_job_to_requeue
from tandem.strategies.environments.torchelastic import TorchElasticEnvironment

__all__ = [
    "ClusterEnvironment",
    "KubeflowEnvironment",
    "LSFEnvironment",
    "LocalEnvironment",
    "MPIEnvironment",
    "ProcessGroupEnvironment",
    "ReplicaGroupEnvironment",
    "SLURMEnvironment",
    "TorchElasticEnvironment",
    "rank_from_environment",
    "requeues",
    "select_environment",
    "slurm_job_to_requeue",
]
