"""Every launcher tandem detects, from recorded variable sets of whole jobs: each process resolves to its own rank,
no two to rank 0, none starts ranks of its own; partial variables are an error; and a real ``mpiexec`` job (MPICH's
wheel, installed by ``make test``) trains once, not once per process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import LAUNCH_VARIABLES, clear_launch_variables, launch_free_env
from tandem.strategies.environments import (
    KubeflowEnvironment,
    LocalEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    rank_from_environment,
    select_environment,
)
from tandem.strategies.environments.machine import find_free_port
from tandem.utilities.exceptions import TandemConfigError

pytestmark = pytest.mark.timeout(120)


def _torchrun(nodes: int, per_node: int) -> list[dict]:
    return [
        dict(TORCHELASTIC_RUN_ID="r", RANK=n * per_node + i, LOCAL_RANK=i, WORLD_SIZE=nodes * per_node, GROUP_RANK=n,
             LOCAL_WORLD_SIZE=per_node, MASTER_ADDR="host0", MASTER_PORT=29500)
        for n in range(nodes) for i in range(per_node)
    ]  # fmt: skip


def _slurm(nodes: int, per_node: int) -> list[dict]:
    return [
        dict(SLURM_PROCID=n * per_node + i, SLURM_LOCALID=i, SLURM_NODEID=n, SLURM_NTASKS=nodes * per_node,
             SLURM_NODELIST="node[01-02]", SLURM_JOB_ID=4242, SLURM_JOB_NAME="train.sh")
        for n in range(nodes) for i in range(per_node)
    ]  # fmt: skip


def _open_mpi(nodes: int, per_node: int, **extra: object) -> list[dict]:
    return [
        dict(OMPI_COMM_WORLD_RANK=n * per_node + i, OMPI_COMM_WORLD_SIZE=nodes * per_node, OMPI_COMM_WORLD_LOCAL_RANK=i,
             OMPI_COMM_WORLD_LOCAL_SIZE=per_node, OMPI_COMM_WORLD_NODE_RANK=n, PMIX_RANK=n * per_node + i,
             MASTER_ADDR="node01", MASTER_PORT=29500, **extra)
        for n in range(nodes) for i in range(per_node)
    ]  # fmt: skip


def _mpich(per_node: int) -> list[dict]:  # recorded from `mpiexec -n 2 env` (MPICH 5, Hydra), one node
    return [
        dict(PMI_RANK=i, PMI_SIZE=per_node, MPI_LOCALRANKID=i, MPI_LOCALNRANKS=per_node, PMI_FD=9 + 2 * i,
             PMI_HOSTNAME="vm", HYDI_CONTROL_FD=7)
        for i in range(per_node)
    ]  # fmt: skip


def _srun_pmi2(nodes: int, per_node: int) -> list[dict]:
    size = nodes * per_node
    return [
        dict(v, PMI_RANK=v["SLURM_PROCID"], PMI_SIZE=size, SLURM_STEP_NUM_TASKS=size) for v in _slurm(nodes, per_node)
    ]


def _mvapich(nodes: int, per_node: int) -> list[dict]:  # no node-rank variable: block placement
    return [
        dict(MV2_COMM_WORLD_RANK=n * per_node + i, MV2_COMM_WORLD_SIZE=nodes * per_node, MV2_COMM_WORLD_LOCAL_RANK=i,
             MV2_COMM_WORLD_LOCAL_SIZE=per_node, MASTER_ADDR="node01", MASTER_PORT=29500)
        for n in range(nodes) for i in range(per_node)
    ]  # fmt: skip


def _lsf(rankfile: Path, nodes: int, per_node: int) -> list[dict]:
    rankfile.write_text("batch01\n" + "".join(f"node{n:02d}\n" * per_node for n in range(1, nodes + 1)))
    return [
        dict(LSB_JOBID=98765, LSB_DJOB_RANKFILE=rankfile, JSM_NAMESPACE_RANK=n * per_node + i,
             JSM_NAMESPACE_LOCAL_RANK=i, JSM_NAMESPACE_SIZE=nodes * per_node)
        for n in range(nodes) for i in range(per_node)
    ]  # fmt: skip


def _kubeflow(pods: int) -> list[dict]:
    return [
        dict(KUBERNETES_SERVICE_HOST="10.0.0.1", KUBERNETES_PORT="tcp://10.0.0.1:443", RANK=r, WORLD_SIZE=pods,
             MASTER_ADDR="job-master-0", MASTER_PORT=23456)
        for r in range(pods)
    ]  # fmt: skip


def _tandem_launcher(per_node: int) -> list[dict]:
    """Rank 0 has no variables (it starts the others), which get the full set."""
    children = [
        dict(RANK=i, LOCAL_RANK=i, WORLD_SIZE=per_node, LOCAL_WORLD_SIZE=per_node, NODE_RANK=0,
             MASTER_ADDR="127.0.0.1", MASTER_PORT=29500, TANDEM_LAUNCHER_PID=1)
        for i in range(1, per_node)
    ]  # fmt: skip
    return [{}, *children]


def _jobs(tmp_path: Path) -> dict[str, tuple[type, int, int, list[dict]]]:
    """name -> (the environment every process must resolve to, processes per node, nodes, each process's variables)"""
    in_allocation = dict(SLURM_PROCID=0, SLURM_NTASKS=4, SLURM_LOCALID=0, SLURM_NODEID=0, SLURM_JOB_ID=7)
    return {
        "torchrun 2x2": (TorchElasticEnvironment, 2, 2, _torchrun(2, 2)),
        "srun 2x2": (SLURMEnvironment, 2, 2, _slurm(2, 2)),
        "jsrun 2x3": (LSFEnvironment, 3, 2, _lsf(tmp_path / "rankfile", 2, 3)),
        "Open MPI 2x2": (MPIEnvironment, 2, 2, _open_mpi(2, 2)),
        # mpirun inside a SLURM allocation: every process inherits the batch step's SLURM_PROCID=0
        "Open MPI in sbatch 1x4": (MPIEnvironment, 4, 1, _open_mpi(1, 4, **in_allocation)),
        "MPICH 1x2": (MPIEnvironment, 2, 1, _mpich(2)),
        # srun --mpi=pmi2 starts the MPI ranks itself: SLURM's variables (and its nodelist rendezvous) are read
        "srun --mpi=pmi2 2x2": (SLURMEnvironment, 2, 2, _srun_pmi2(2, 2)),
        "MVAPICH2 2x2": (MPIEnvironment, 2, 2, _mvapich(2, 2)),
        "Kubeflow 3 pods": (KubeflowEnvironment, 1, 3, _kubeflow(3)),
        "tandem's launcher 1x3": (LocalEnvironment, 3, 1, _tandem_launcher(3)),
    }


def _resolve(monkeypatch, variables: dict, per_node: int, nodes: int) -> tuple:
    clear_launch_variables(monkeypatch)
    for name, value in variables.items():
        monkeypatch.setenv(name, str(value))
    environment = select_environment(per_node, nodes)
    shape = (environment.global_rank, environment.world_size, environment.node_rank, environment.local_rank)
    result = (type(environment), *shape, environment.creates_processes_externally, rank_from_environment())
    for name in [n for n in os.environ if LAUNCH_VARIABLES.match(n)]:
        monkeypatch.delenv(name)  # what select_environment exported (a picked port), gone before the next process
    return result


def test_every_process_of_every_launchers_job_resolves_to_its_own_rank(monkeypatch, tmp_path):
    for job, (kind, per_node, nodes, processes) in _jobs(tmp_path).items():
        resolved = [_resolve(monkeypatch, variables, per_node, nodes) for variables in processes]
        world = per_node * nodes
        assert [r[0] for r in resolved] == [kind] * world, job
        assert sorted(r[1] for r in resolved) == list(range(world)), f"{job}: ranks {[r[1] for r in resolved]}"
        assert {r[2] for r in resolved} == {world}, job
        where = sorted((r[3], r[4]) for r in resolved)  # (node, local rank): each once
        assert where == [(n, i) for n in range(nodes) for i in range(per_node)], f"{job}: {where}"
        starts = [r for r in resolved if not r[5]]  # processes that would start ranks themselves
        assert starts == ([resolved[0]] if kind is LocalEnvironment else []), job
        assert [r[6] for r in resolved] == [r[1] for r in resolved], f"{job}: the rank set at import differs"


def test_the_rendezvous_of_each_launcher(monkeypatch, tmp_path):
    jobs = _jobs(tmp_path)
    clear_launch_variables(monkeypatch)
    for name, value in jobs["jsrun 2x3"][3][4].items():
        monkeypatch.setenv(name, str(value))
    lsf = select_environment(3, 2)
    assert (lsf.main_address, lsf.main_port, lsf.node_rank) == ("node01", 10000 + 98765 % 1000, 1)
    clear_launch_variables(monkeypatch)
    for name, value in jobs["MPICH 1x2"][3][1].items():
        monkeypatch.setenv(name, str(value))
    mpich = select_environment(2)
    assert mpich.main_address == "127.0.0.1"  # one node
    assert mpich.main_port == 20000 + os.getppid() % 20000  # the same for every rank the node's launcher started
    clear_launch_variables(monkeypatch)
    for name, value in jobs["Kubeflow 3 pods"][3][2].items():
        monkeypatch.setenv(name, str(value))
    kubeflow = select_environment(1, 3)
    assert (kubeflow.main_address, kubeflow.main_port) == ("job-master-0", 23456)


def test_mpirun_on_several_nodes_without_master_addr_says_how_to_set_it(monkeypatch):
    clear_launch_variables(monkeypatch)
    variables = _open_mpi(2, 2)[0]
    del variables["MASTER_ADDR"], variables["MASTER_PORT"]
    for name, value in variables.items():
        monkeypatch.setenv(name, str(value))
    with pytest.raises(TandemConfigError, match="mpirun -x MASTER_ADDR=node01 -x MASTER_PORT=29500"):
        _ = select_environment(2, 2).main_port


@pytest.mark.parametrize(
    ("variables", "missing"),
    [
        ({"RANK": 1, "WORLD_SIZE": 2}, "but not LOCAL_RANK:"),
        ({"RANK": 0, "WORLD_SIZE": 4, "MASTER_ADDR": "h"}, "but not LOCAL_RANK:"),  # a rank 0 that would launch
        ({"LOCAL_RANK": 1}, "but not RANK, WORLD_SIZE:"),
        ({"RANK": 1}, "but not LOCAL_RANK, WORLD_SIZE:"),
    ],
)
def test_partial_variables_of_an_unknown_launcher_are_an_error_naming_what_is_missing(monkeypatch, variables, missing):
    clear_launch_variables(monkeypatch)
    for name, value in variables.items():
        monkeypatch.setenv(name, str(value))
    with pytest.raises(TandemConfigError, match=missing):
        select_environment(2)


def test_a_bare_pmix_launcher_is_an_error_not_a_rank_0_per_process(monkeypatch):
    """prterun exports PMIX_RANK and PMIX_NAMESPACE but no size: every process would have been a local rank 0."""
    clear_launch_variables(monkeypatch)
    monkeypatch.setenv("PMIX_RANK", "1")
    monkeypatch.setenv("PMIX_NAMESPACE", "prterun-node01-4242@1")
    with pytest.raises(TandemConfigError, match="PMIX_RANK=1 but no rank and size variables"):
        select_environment(2)
    for name, value in _open_mpi(2, 2)[1].items():  # Open MPI 5 exports PMIX_RANK too: read as MPI
        monkeypatch.setenv(name, str(value))
    assert select_environment(2).global_rank == 1


def test_a_lone_process_that_says_it_is_rank_0_of_1_is_fine(monkeypatch):
    clear_launch_variables(monkeypatch)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert isinstance(select_environment(1), LocalEnvironment)


def test_kubeflow_with_several_devices_per_pod_names_torchrun(monkeypatch):
    import torch

    from tandem.strategies import DDPStrategy

    clear_launch_variables(monkeypatch)
    for name, value in _kubeflow(2)[0].items():
        monkeypatch.setenv(name, str(value))
    strategy = DDPStrategy(devices=[torch.device("cpu")] * 2)
    strategy.num_nodes = 2
    with pytest.raises(TandemConfigError, match="one process per pod: use devices=1 and num_nodes=<the number of"):
        strategy.setup_environment()


MPI_SCRIPT = Path(__file__).parent / "scripts" / "mpi_run.py"
MPIEXEC = shutil.which("mpiexec", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))


@pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (make test installs MPICH's wheel)")
def test_mpiexec_with_two_processes_trains_one_job_of_two_ranks(tmp_path):
    """`mpiexec -n 2 python train.py` with `Trainer(strategy="ddp", devices=2)`: two processes, ranks 0 and 1 of one
    job, equal weights after the fit. (Before MPI was detected, each process was a rank 0 that started a rank of
    its own: four processes, the job trained twice.)"""
    env = launch_free_env(OMP_NUM_THREADS="1", MASTER_PORT=str(find_free_port()))
    done = subprocess.run(
        [MPIEXEC, "-n", "2", sys.executable, str(MPI_SCRIPT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("process-*.json"))]
    assert len(results) == 2, results  # one file per process that ran a fit
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert {r["world_size"] for r in results} == {2} and {r["environment"] for r in results} == {"MPIEnvironment"}
    assert results[0]["weights"] == results[1]["weights"]
