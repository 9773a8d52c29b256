"""Cluster environments read from simulated environment variables; no processes."""

from __future__ import annotations

import os
import signal
import socket

import pytest

from helpers import LAUNCH_VARIABLES, clear_launch_variables
from tandem.strategies import DDPStrategy
from tandem.strategies.environments import (
    LocalEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    rank_from_environment,
    requeues,
    select_environment,
    slurm_job_to_requeue,
)
from tandem.strategies.environments.machine import find_free_port, threads_per_process
from tandem.strategies.environments.slurm import expand_nodelist
from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.seed import global_seed


@pytest.fixture
def env(monkeypatch):
    """A clean environment; ``env(NAME=value, ...)`` sets variables for this test only."""
    clear_launch_variables(monkeypatch)

    def set_variables(**variables: object) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, str(value))

    yield set_variables
    # what the code under test exported itself (export_rank): gone, so no later test sees a launcher's variables
    # (monkeypatch then restores the variables it cleared)
    for name in [n for n in os.environ if LAUNCH_VARIABLES.match(n)]:
        del os.environ[name]


def test_local_environment_for_the_first_process(env):
    environment = select_environment(num_processes=3, num_nodes=1)
    assert isinstance(environment, LocalEnvironment)
    assert not environment.creates_processes_externally
    assert (environment.world_size, environment.global_rank, environment.local_rank, environment.node_rank) == (
        3,
        0,
        0,
        0,
    )
    assert environment.main_address == "127.0.0.1"
    port = environment.main_port  # picked now and exported, so every later reader agrees
    assert os.environ["MASTER_PORT"] == str(port)
    assert environment.main_port == port


def test_local_environment_for_a_started_rank(env):
    env(
        RANK=3,
        LOCAL_RANK=1,
        WORLD_SIZE=4,
        NODE_RANK=1,
        MASTER_ADDR="10.0.0.1",
        MASTER_PORT=2345,
        TANDEM_LAUNCHER_PID=77,
    )
    environment = select_environment(num_processes=2, num_nodes=2)
    assert isinstance(environment, LocalEnvironment)
    assert environment.creates_processes_externally
    assert (environment.world_size, environment.global_rank, environment.local_rank, environment.node_rank) == (
        4,
        3,
        1,
        1,
    )
    assert (environment.main_address, environment.main_port, environment.launcher_pid) == ("10.0.0.1", 2345, 77)


def test_local_environment_exports_rank_variables_for_children(env):
    env(NODE_RANK=1, MASTER_ADDR="10.0.0.1", MASTER_PORT=2345)
    environment = LocalEnvironment(num_processes=2, num_nodes=2)
    assert environment.rendezvous_given
    child = environment.child_environment(local_rank=1)
    assert {k: child[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "NODE_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "2345",
    }
    assert child["TANDEM_LAUNCHER_PID"] == str(os.getpid())
    assert "LOCAL_RANK" not in os.environ  # only the child's copy has it
    environment.export_rank(1)  # what a spawned process does for itself
    assert environment.creates_processes_externally and environment.global_rank == 3


def test_torchrun_environment(env):
    env(
        TORCHELASTIC_RUN_ID="abc",
        RANK=5,
        LOCAL_RANK=1,
        WORLD_SIZE=8,
        GROUP_RANK=2,
        LOCAL_WORLD_SIZE=2,
        MASTER_ADDR="host0",
        MASTER_PORT=29500,
    )
    environment = select_environment(num_processes=2, num_nodes=4)
    assert isinstance(environment, TorchElasticEnvironment)
    assert environment.creates_processes_externally
    assert (environment.world_size, environment.global_rank, environment.local_rank, environment.node_rank) == (
        8,
        5,
        1,
        2,
    )
    assert (environment.main_address, environment.main_port) == ("host0", 29500)


def test_rank_variables_without_torchelastic_are_not_torchrun(env):
    env(RANK=1, LOCAL_RANK=1, WORLD_SIZE=2)
    assert not TorchElasticEnvironment.detect()
    assert isinstance(select_environment(2), LocalEnvironment)


def _slurm(env, **extra: object) -> None:
    variables = dict(
        SLURM_PROCID=5,
        SLURM_NTASKS=8,
        SLURM_LOCALID=1,
        SLURM_NODEID=2,
        SLURM_NODELIST="node[03-05,7]",
        SLURM_JOB_ID=12345678,
        SLURM_JOB_NAME="train.sh",
    )
    variables.update(extra)
    env(**variables)


def test_slurm_environment(env):
    _slurm(env)
    environment = select_environment(num_processes=2, num_nodes=4)
    assert isinstance(environment, SLURMEnvironment)
    assert environment.creates_processes_externally
    assert (environment.world_size, environment.global_rank, environment.local_rank, environment.node_rank) == (
        8,
        5,
        1,
        2,
    )
    assert environment.main_address == "node03"  # the first host of the nodelist
    assert environment.main_port == 15000 + 5678  # from the job id, the same on every node
    environment.export_rendezvous()
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("node03", "20678")


def test_the_slurm_job_to_requeue_after_a_preemption(env):
    assert slurm_job_to_requeue() is None  # not in a SLURM job
    env(SLURM_JOB_ID=77, SLURM_JOB_NAME="train.sh")  # one task (sbatch python train.py): still requeued
    assert slurm_job_to_requeue() == "77"
    env(SLURM_ARRAY_JOB_ID=70, SLURM_ARRAY_TASK_ID=3)  # an array task is requeued by its own name
    assert slurm_job_to_requeue() == "70_3"
    env(SLURM_JOB_NAME="interactive")  # salloc's shell: never
    assert slurm_job_to_requeue() is None


def test_slurm_master_variables_win(env):
    _slurm(env, MASTER_ADDR="login1", MASTER_PORT=4242)
    environment = SLURMEnvironment()
    assert (environment.main_address, environment.main_port) == ("login1", 4242)


@pytest.mark.parametrize("extra", [{"SLURM_JOB_NAME": "bash"}, {"SLURM_JOB_NAME": "interactive"}, {"SLURM_NTASKS": 1}])
def test_slurm_not_detected_in_interactive_or_single_task_jobs(env, extra):
    _slurm(env, **extra)
    assert not SLURMEnvironment.detect()
    assert isinstance(select_environment(2), LocalEnvironment)


def test_torchrun_inside_slurm_wins(env):
    _slurm(env)
    env(TORCHELASTIC_RUN_ID="abc", RANK=0, LOCAL_RANK=0, WORLD_SIZE=2)
    assert isinstance(select_environment(2), TorchElasticEnvironment)


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node[03-05,7]", ["node03", "node04", "node05", "node7"]),
        ("node[03-05,7],gpu1", ["node03", "node04", "node05", "node7", "gpu1"]),
        ("a1,b2", ["a1", "b2"]),
        ("host", ["host"]),
        ("rack[1-2]-n[08-09]", ["rack1-n08", "rack1-n09", "rack2-n08", "rack2-n09"]),
        ("gpu[9-11].cluster", ["gpu9.cluster", "gpu10.cluster", "gpu11.cluster"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


def test_find_free_port_can_be_bound():
    port = find_free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


def test_threads_per_process(env):
    cpus = len(os.sched_getaffinity(0))
    assert threads_per_process(1) == cpus
    assert threads_per_process(cpus * 4) == 1
    env(OMP_NUM_THREADS=3)
    assert threads_per_process(2) is None  # the user decided


def test_global_seed_and_rank(env):
    assert global_seed() == 0 and rank_from_environment() == 0
    env(TANDEM_GLOBAL_SEED=42, SLURM_PROCID=3)
    assert global_seed() == 42 and rank_from_environment() == 3


def test_slurm_environment_requeue_settings_as_lightning(env):
    default = SLURMEnvironment()
    assert (default.auto_requeue, default.requeue_signal) == (True, signal.SIGUSR1)
    assert requeues(signal.SIGUSR1) and not requeues(signal.SIGTERM)  # no environment given: SIGUSR1 requeues
    assert requeues(signal.SIGUSR1, LocalEnvironment())  # a non-SLURM environment keeps the default
    assert not requeues(signal.SIGUSR1, SLURMEnvironment(auto_requeue=False))
    on_term = SLURMEnvironment(requeue_signal=signal.SIGTERM)
    assert requeues(signal.SIGTERM, on_term) and not requeues(signal.SIGUSR1, on_term)
    assert repr(SLURMEnvironment(auto_requeue=False)) == (
        "SLURMEnvironment(auto_requeue=False, requeue_signal=signal.SIGUSR1)"
    )  # built outside a SLURM job (as a plugin), its repr still works
    assert repr(TorchElasticEnvironment()) == "TorchElasticEnvironment(its variables not set)"
    with pytest.raises(TandemConfigError, match=r"requeue_signal=<Signals.SIGHUP: 1>\): tandem stops .* on signal"):
        SLURMEnvironment(requeue_signal=signal.SIGHUP)
    with pytest.raises(TandemConfigError, match="auto_requeue='no'"):
        SLURMEnvironment(auto_requeue="no")


def test_a_given_environment_wins_over_the_detected_one(env):
    _slurm(env)  # srun's variables: SLURM would be detected
    given = TorchElasticEnvironment()
    strategy = DDPStrategy(cluster_environment=given)
    assert strategy.environment is given and strategy.cluster_environment is given
    assert isinstance(DDPStrategy().environment, SLURMEnvironment)
    with pytest.raises(TandemConfigError, match="cluster_environment=.*is out of range"):
        DDPStrategy(cluster_environment="slurm")
