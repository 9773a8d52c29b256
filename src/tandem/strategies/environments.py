"""The environment contract, read in this module and nowhere else.

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

from __future__ import annotations

import os
import re
import signal
import socket
from typing import ClassVar

import torch.distributed as dist

from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.preemption import SIGNALS
from tandem.utilities.rank_zero import rank_zero_warn

_LOCAL_ADDRESS = "127.0.0.1"
ERROR_FILE_VARIABLE = "TANDEM_ERROR_FILE"


def rank_from_environment() -> int:
    """The global rank a launcher gave this process, or 0 when none did. MPI's rank is read before SLURM's: an
    mpirun inside a SLURM allocation inherits the batch step's SLURM_PROCID."""
    mpi_ranks = [family[0] for family in MPIEnvironment.FAMILIES]
    for name in ("RANK", *mpi_ranks, "JSM_NAMESPACE_RANK", "SLURM_PROCID"):
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return 0


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


class LSFEnvironment(ClusterEnvironment):
    """Processes started by LSF's ``jsrun`` (Lightning's ``LSFEnvironment``)."""

    name = "lsf"
    variables = ("JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK", None)

    @classmethod
    def detect(cls) -> bool:
        required = ("LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE")
        return all(v in os.environ for v in required)

    @property
    def node_rank(self) -> int:
        hosts = self._rank_hosts()
        return list(dict.fromkeys(hosts)).index(hosts[self.global_rank])

    def _default_address(self) -> str:
        return self._rank_hosts()[0]

    def _default_port(self) -> int:
        job_id = os.environ["LSB_JOBID"]
        return 10000 + int(job_id) % 1000 if job_id.isdigit() else 12910  # Lightning's rule

    def _rank_hosts(self) -> list[str]:
        """The host of each rank: the rank file's lines after the first (the launch node)."""
        path = os.environ["LSB_DJOB_RANKFILE"]
        try:
            with open(path) as file:
                hosts = [line.strip() for line in file if line.strip()][1:]
        except OSError as error:
            raise TandemConfigError(f"LSF: cannot read LSB_DJOB_RANKFILE={path!r}: {error.strerror}.") from error
        if len(hosts) < self.world_size:
            raise TandemConfigError(
                f"LSF: LSB_DJOB_RANKFILE={path!r} names {len(hosts)} rank host(s) after the launch node, but "
                f"JSM_NAMESPACE_SIZE is {self.world_size}: start the job with jsrun, one rank per line."
            )
        return hosts


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


class KubeflowEnvironment(ClusterEnvironment):
    """A Kubeflow PyTorchJob (v1): one process per pod, with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` set by the operator and no ``LOCAL_RANK`` (Lightning's ``KubeflowEnvironment``). Several
    devices per pod: run torchrun inside the pod."""

    name = "kubeflow"
    variables = ("WORLD_SIZE", "RANK", None, "RANK")  # one process per pod: the node rank is the rank
    shape_hint = (
        "A Kubeflow PyTorchJob runs one process per pod: use devices=1 and num_nodes=<the number of pods>; for "
        "several devices per pod, run torchrun inside each pod (then devices=<processes per pod>)."
    )

    @classmethod
    def detect(cls) -> bool:
        in_kubernetes = "KUBERNETES_SERVICE_HOST" in os.environ or "KUBERNETES_PORT" in os.environ
        required = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        return in_kubernetes and all(v in os.environ for v in required) and "LOCAL_RANK" not in os.environ

    @property
    def local_rank(self) -> int:
        return 0


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


def find_free_port(host: str = _LOCAL_ADDRESS) -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def threads_per_process(local_processes: int) -> int | None:
    """torch threads for each of ``local_processes`` on this machine, or None when OMP_NUM_THREADS decides."""
    if "OMP_NUM_THREADS" in os.environ:
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // max(1, local_processes))
