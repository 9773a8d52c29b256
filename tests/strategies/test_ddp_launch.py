"""``Trainer(strategy="ddp")`` started every way a job starts: tandem's launcher, torchrun on one node and on two
(loopback), simulated srun, and torchrun restarting a killed worker; how a crash, Ctrl-C and a rank that never
joins end the job; threads per process.

``strategy="ddp"`` re-runs the current command for the other ranks, so every fit runs ``scripts/launch_fit.py``
in fresh processes (CPU, gloo, free ports). Each rank saves what it saw to ``rank{r}.pt`` in the test's folder.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from helpers import launch_free_env
from tandem.strategies.environments import TorchElasticEnvironment, select_environment
from tandem.strategies.environments.machine import find_free_port
from tandem.strategies.side_channel.channel import TORN_DOWN_EXIT

SCRIPT = Path(__file__).parent / "scripts" / "launch_fit.py"


def _env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables; one torch thread per process unless ``extra`` says."""
    return launch_free_env(**{"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra})


def _python(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _popen(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Python in its own session (so a test can signal or kill its whole process group); stderr captured."""
    return subprocess.Popen(
        [sys.executable, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _torchrun(options: str, *args: str) -> list[str]:
    """``python -m torch.distributed.run`` with ``options`` and a c10d rendezvous on a free loopback port."""
    endpoint = f"--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{find_free_port()}"
    return ["-m", "torch.distributed.run", *options.split(), *endpoint.split(), *args]


def _survivors(out: Path) -> list[int]:
    """Processes (not zombies) whose command line names ``out``: every rank and agent a test started does."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(out) in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def _nothing_left(out: Path, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while _survivors(out) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _survivors(out)


def _kill_survivors(out: Path) -> None:
    for pid in _survivors(out):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def _no_strays(tmp_path):
    """What a failed or timed-out test left running is killed afterwards (torchrun's workers have their own
    session, so killing the agent does not reach them)."""
    yield
    _kill_survivors(tmp_path)


def _results(out: Path, world: int = 2) -> list[dict]:
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _assert_equal_weights(results: list[dict], reference: dict[str, torch.Tensor]) -> None:
    """Every rank ends with the reference weights, bit for bit."""
    for result in results:
        assert result["global_step"] == 12
        assert result["weights"].keys() == reference.keys()
        for name, value in reference.items():
            torch.testing.assert_close(result["weights"][name], value, atol=0, rtol=0)


def _launched_nothing(results: list[dict], environment: str) -> None:
    for result in results:
        assert result["environment"] == environment
        assert result["launcher"] == "NoneType" and result["started_ranks"] is False


def _threads() -> tuple[int, int]:
    """The torch threads tandem gives each of two processes on this machine, and a count unlike it for
    OMP_NUM_THREADS (torch caps it at the cpus)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    per_process = max(1, cpus // 2)
    return per_process, 1 if per_process > 1 else min(2, cpus)


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> list[dict]:
    """The fit under tandem's own launcher (``python launch_fit.py fit``), each rank's results. Its default_root_dir
    is computed on each rank from the clock (``runs/<time>``, a common pattern): every rank uses rank 0's run folder,
    which exists, for log_dir and the checkpoint paths. OMP_NUM_THREADS is set to a count unlike tandem's own, which
    ``test_threads_per_process`` reads: on 2 or 3 cores 2 threads against the other starts' 1 (the model is too small
    for that to change a bit of the weights), on more cores 1, as theirs."""
    out = tmp_path_factory.mktemp("tandem-launcher")
    try:
        done = _python(
            [str(SCRIPT), "fit", "--per-rank-root", "--out", str(out)], _env(OMP_NUM_THREADS=str(_threads()[1]))
        )
    except subprocess.TimeoutExpired:
        _kill_survivors(out)
        raise
    assert done.returncode == 0, done.stderr
    results = _results(out)
    assert [r["global_rank"] for r in results] == [0, 1]
    assert [r["environment"] for r in results] == ["LocalEnvironment"] * 2
    assert [r["started_ranks"] for r in results] == [True, False]  # rank 0 started rank 1
    weights = results[0]["weights"]
    _assert_equal_weights(results, weights)
    assert results[0]["default_root_dir"] == results[1]["default_root_dir"]  # rank 0's, on both ranks
    for name in ("log_dir", "ckpt_dir"):
        assert results[0][name] == results[1][name] and os.path.exists(results[1][name]), name
    assert len(list(out.glob("root-*"))) == 1  # one run folder
    assert _nothing_left(out)
    return results


@pytest.fixture(scope="module")
def reference(launched: list[dict]) -> dict[str, torch.Tensor]:
    """The tandem-launched fit's weights: every other start matches them."""
    return launched[0]["weights"]


# ---------------------------------------------------------------------------------------------- failures


@pytest.mark.timeout(150)
@pytest.mark.parametrize("crash_rank", [1, 0])
def test_exception_in_one_rank_ends_the_job(tmp_path, crash_rank):
    """The failing rank's traceback is shown, the job exits non-zero within seconds, and no process is left. Rank 0
    leaves through a Python exception (its finally blocks run) that carries the failing rank's traceback."""
    start = time.monotonic()
    done = _python([str(SCRIPT), "crash", "--crash-rank", str(crash_rank), "--out", str(tmp_path)], _env(), timeout=90)
    elapsed = time.monotonic() - start
    assert done.returncode == 1  # an uncaught Python exception in rank 0, not os._exit
    assert elapsed < 85  # seconds, not the process group's 30 minutes; generous for a busy host
    assert f"RuntimeError: boom at step 3 on rank {crash_rank}" in done.stderr, done.stderr
    assert all((tmp_path / f"pid{r}").exists() for r in (0, 1))  # both ranks were training
    assert (tmp_path / "finally0").read_text() == "ran"  # rank 0 left through a Python exception: finally ran
    raised = (tmp_path / "raised0").read_text()
    if crash_rank == 1:  # rank 0, stuck in the step's all-reduce, names the rank that failed and stops
        assert re.search(
            r"\[tandem\] rank 1 (exited with code 1|was killed by SIGABRT); stopping the other ranks", done.stderr
        ), done.stderr
        # ... and raises, in its main thread, an exception that carries rank 1's traceback
        assert re.match(
            r"RankFailedError: rank 1 (exited with code 1|was killed by SIGABRT); the other ranks were stopped. Its traceback:\n",
            raised,
        ), raised
        assert re.search(
            r"RuntimeError: boom at step 3 on rank 1\nRank 0's collective then broke \(RuntimeError: .*Connection closed "
            r"by peer.*\), because rank 1 had stopped.$",
            raised.rstrip(),
        ), raised
        assert "in on_train_batch_start" in raised
        assert "tandem.utilities.exceptions.RankFailedError: rank 1" in done.stderr
        # rank 1's traceback is printed once, by rank 0 (not also by rank 1, nor rank 0's broken collective)
        assert done.stderr.count("Traceback (most recent call last)") == 2, done.stderr  # RankFailedError's, rank 1's
    else:  # rank 0's own error is raised as it is, once; the rank it started ends at once (a SIGTERM that tears the
        # job down is no pre-emption: it did not wait for a pre-emption vote until rank 0 killed it)
        assert raised == "RuntimeError: boom at step 3 on rank 0"
        assert done.stderr.count("Traceback (most recent call last)") == 1, done.stderr
        assert eval((tmp_path / "ended0").read_text()) in ([-signal.SIGTERM], [TORN_DOWN_EXIT]), done.stderr
    assert _nothing_left(tmp_path)


@pytest.mark.timeout(150)
def test_rank_ones_traceback_is_shown_while_its_process_is_still_exiting(tmp_path):
    """Rank 1 raises in on_train_epoch_end, where rank 0 goes on into the epoch end's checked collective and finds rank
    1's failure there; rank 1's process then takes seconds to end (interpreter shutdown on a loaded host; here an
    atexit handler sleeps 8 s). Rank 0 still raises RankFailedError with rank 1's traceback, every time: the
    traceback rank 1 wrote is what says it failed, not its exit (issue 44: 1 run in 4 showed rank 0's
    CollectiveMismatchError alone, and no line of rank 1's raise)."""
    done = _python([str(SCRIPT), "slow_exit1", "--out", str(tmp_path)], _env(), timeout=120)
    assert done.returncode == 1
    raised = (tmp_path / "raised0").read_text()
    assert re.match(
        r"RankFailedError: rank 1 (failed|exited with code 1); the other ranks were stopped. Its traceback:\n", raised
    ), raised
    assert re.search(
        r'in on_train_epoch_end\n +raise ValueError\("bad sample in rank 1"\)\nValueError: bad sample', raised
    )
    assert "Rank 0 then raised CollectiveMismatchError (shown above)" in raised
    assert done.stderr.count('raise ValueError("bad sample in rank 1")') == 1, done.stderr  # once: rank 0 prints it
    assert (tmp_path / "finally0").read_text() == "ran"
    assert _nothing_left(tmp_path)


@pytest.mark.timeout(150)
def test_training_step_returning_none_on_one_rank_is_named_where_it_happened(tmp_path):
    """Rank 1's training_step returns None at batch 1 while rank 0 runs backward, whose gradient all-reduce waits for
    a backward rank 1 never runs. Rank 1 sees its None first and says so, at once; before, the job waited for the
    collective check's 60 s stall timeout and named collectives at the fit line."""
    done = _python([str(SCRIPT), "none1", "--out", str(tmp_path)], _env(), timeout=120)
    assert done.returncode == 1
    raised = (tmp_path / "raised0").read_text()
    assert raised.startswith("RankFailedError: rank 1 "), raised  # with rank 1's traceback
    assert (
        "TandemUserCodeError: rank 1's training_step returned None at batch 1 while rank 0 ran backward: skip on "
        "every rank or none." in raised
    ), raised
    assert "(loss * 0.0)" in raised and "has waited" not in done.stderr
    assert _nothing_left(tmp_path)


@pytest.mark.timeout(150)
def test_an_error_raised_on_every_rank_is_printed_once(tmp_path):
    """Every rank raises the same error at the same step: one traceback (rank 0's), naming the ranks."""
    done = _python([str(SCRIPT), "crash", "--crash-rank", "-1", "--out", str(tmp_path)], _env(), timeout=90)
    assert done.returncode == 1
    assert done.stderr.count("Traceback (most recent call last)") == 1, done.stderr
    assert done.stderr.count("RuntimeError: boom") == 1, done.stderr
    assert "[tandem] ranks 0, 1 raised this error (only rank 0's traceback is shown)." in done.stderr, done.stderr
    assert _nothing_left(tmp_path)


@pytest.mark.timeout(150)
def test_a_rank_whose_script_ends_normally_is_named(tmp_path):
    """Rank 1 calls sys.exit(0) in a hook while rank 0 goes on into the step's gradient all-reduce: rank 0 names it,
    where it exited and where rank 0 was, instead of gloo's "Connection closed by peer"."""
    done = _python([str(SCRIPT), "exit1", "--out", str(tmp_path)], _env(), timeout=90)
    assert done.returncode == 1
    raised = (tmp_path / "raised0").read_text()
    assert re.match(
        r"RankFailedError: Rank 1 ended its script normally \(sys.exit\(0\) at launch_fit.py:\d+ in "
        r"on_train_batch_start inside Trainer.fit\) while rank 0 was in torch's .*, in Trainer.fit; the collective then "
        r"failed on rank 0 with RuntimeError: .*Connection closed by peer",
        raised,
    ), raised
    assert "with the same limits (max_epochs, max_steps, limit_*_batches)" in raised
    assert re.search(r"^\[tandem\] rank 1 ended its script normally .* rank 0's collective broke\.$", done.stderr, re.M)
    assert done.stderr.count("Traceback (most recent call last)") == 1, done.stderr  # gloo's error is not shown whole
    assert _nothing_left(tmp_path)


@pytest.mark.timeout(150)
def test_a_one_rank_all_gather_names_the_users_line(tmp_path):
    """self.all_gather on rank 0 only: the collective check names the user's line, not lightning-utilities'."""
    done = _python([str(SCRIPT), "gather0", "--out", str(tmp_path)], _env(), timeout=120)
    assert done.returncode != 0
    assert re.search(
        r"while rank 0 entered all_gather \(from user code in Trainer.fit, called at launch_fit.py:\d+ in "
        r"on_train_batch_end\)",
        done.stderr,
    ), done.stderr[-3000:]
    assert "apply_func.py" not in done.stderr.split("CollectiveMismatchError")[-1]
    assert _nothing_left(tmp_path)


@pytest.mark.timeout(150)
def test_a_barrier_on_rank_zero_only_is_named_as_such_not_as_rank_1_failing(tmp_path):
    """dist.barrier() on rank 0 alone (in on_train_epoch_end): rank 1 waits in the epoch's metric reduction, finds
    rank 0 in a collective it never enters (stall timeout 3 s) and stops the job. Rank 0's error says so, naming its
    barrier and the user's line: a CollectiveMismatchError, not "rank 1 failed" ending with gloo's "Connection
    closed by peer" from the barrier that then broke."""
    done = _python([str(SCRIPT), "barrier0", "--out", str(tmp_path)], _env(), timeout=120)
    assert done.returncode == 1
    raised = (tmp_path / "raised0").read_text()
    assert re.match(
        r"CollectiveMismatchError: Rank 0 has waited \d+ s in torch's barrier \(.*\), called at launch_fit.py:\d+ in "
        r"on_train_epoch_end, a collective that rank 1 never entered .*, while rank 1 entered ",
        raised,
    ), raised
    assert "call torch.distributed collectives (dist.barrier, all_reduce) on every rank" in raised
    assert raised.rstrip().endswith("(Rank 1 found it and stopped the job.)"), raised
    assert "RankFailedError" not in raised and "Connection closed by peer" not in raised, raised
    assert "[tandem] rank 1 found the ranks in different collectives (CollectiveMismatchError)" in done.stderr
    assert done.stderr.count("Traceback (most recent call last)") == 1, done.stderr  # rank 0's: one error
    assert _nothing_left(tmp_path)


@pytest.mark.timeout(150)
def test_save_checkpoint_on_rank_zero_only_is_named_within_seconds(tmp_path):
    """The classic mistake: trainer.save_checkpoint under is_global_zero during a fit. Rank 1 goes on into the
    next step's gradient all-reduce and rank 0 waits in the save: without the collective check this waits for
    the whole process-group timeout (30 minutes). With it (stall timeout 3 s here), rank 0 names both sides."""
    start = time.monotonic()
    done = _python([str(SCRIPT), "save0", "--out", str(tmp_path)], _env(), timeout=120)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert elapsed < 130, elapsed  # seconds, not the process group's 30 minutes; generous for a busy host
    assert "CollectiveMismatchError: Rank 1 has waited" in done.stderr, done.stderr[-3000:]
    assert "while rank 0 entered" in done.stderr and "save_checkpoint" in done.stderr
    assert "called at launch_fit.py" in done.stderr  # the user's line
    assert "guard only side effects (files, prints, uploads) with trainer.is_global_zero" in done.stderr
    assert _nothing_left(tmp_path)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["test0", "test0_validate1"])
def test_trainer_call_on_rank_zero_only_is_a_clear_error(tmp_path, mode):
    """trainer.test under is_global_zero: rank 1's script ends (or it calls validate instead); rank 0 fails at
    once with tandem's message, not gloo's 'Connection closed by peer'."""
    done = _python([str(SCRIPT), mode, "--out", str(tmp_path)], _env(), timeout=120)
    assert all((tmp_path / f"fitted{r}").exists() for r in (0, 1)), done.stderr[-3000:]
    fitted = (tmp_path / "fitted0").stat().st_mtime
    assert done.returncode != 0
    assert "CollectiveMismatchError" in done.stderr, done.stderr[-3000:]
    if mode == "test0":
        assert "Rank 1 ended its script normally (after Trainer.fit returned) while rank 0 entered" in done.stderr
    else:
        assert re.search(r"rank 0 entered .*\(from .*Trainer.*, called at launch_fit.py:\d+ in main\)", done.stderr)
        assert "rank 1 entered" in done.stderr
    assert time.time() - fitted < 20  # the error comes seconds after the fit, not at a timeout
    assert _nothing_left(tmp_path)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("target", ["group", "rank0"])
def test_ctrl_c_stops_every_rank(tmp_path, target):
    """SIGINT to the job's process group (what Ctrl-C in a terminal does), or to rank 0 alone, ends rank 0 and the
    rank it started. Rank 0 alone: the SIGTERM it then sends tears the job down, so rank 1 ends at once instead of
    taking it for a pre-emption (and being killed after the grace period)."""
    proc = _popen([str(SCRIPT), "wait", "--out", str(tmp_path)], _env())
    try:
        deadline = time.monotonic() + 40
        while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        if target == "group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=15) != 0
        stderr = proc.stderr.read()
        assert "KeyboardInterrupt" in stderr
        assert stderr.count("Traceback (most recent call last)") == 1, stderr  # rank 0's only
        if target == "rank0":
            assert eval((tmp_path / "ended0").read_text()) in ([-signal.SIGTERM], [TORN_DOWN_EXIT]), stderr
        assert _nothing_left(tmp_path)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stderr.close()


@pytest.mark.timeout(240)
def test_ctrl_c_to_the_group_is_one_keyboard_interrupt_whatever_order_the_ranks_end_in(tmp_path):
    """Ctrl-C in a terminal sends SIGINT to the job's process group: every rank gets it and the ranks end in any
    order, rank 1 often first. It is one interrupt, every time: rank 0 raises KeyboardInterrupt and the job exits as
    Python does on one (killed by SIGINT), never with RankFailedError or a rank "killed by SIGINT". Ten interrupts at
    random moments of a full-speed fit (most of a step is spent in torch's backward and collectives, where the
    interrupt then lands), two jobs at a time."""
    delays = [random.Random(35 + i).uniform(0.0, 0.6) for i in range(10)]

    def interrupt(job: int) -> tuple[int, str, Path]:
        out = tmp_path / f"job{job}"
        out.mkdir()
        proc = _popen([str(SCRIPT), "spin", "--out", str(out)], _env())
        try:
            deadline = time.monotonic() + 90
            while not all((out / f"ready{r}").exists() for r in (0, 1)):
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
                time.sleep(0.05)
            time.sleep(delays[job])
            os.killpg(proc.pid, signal.SIGINT)
            return proc.wait(timeout=30), proc.stderr.read(), out
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.stderr.close()

    with ThreadPoolExecutor(2) as pool:
        ended = list(pool.map(interrupt, range(10)))
    for code, stderr, out in ended:
        assert code == -signal.SIGINT, stderr[-3000:]  # Python's exit status after an uncaught KeyboardInterrupt
        assert (out / "raised0").read_text() == "KeyboardInterrupt: ", stderr[-3000:]
        assert re.search(r"\bKeyboardInterrupt\s*$", stderr), stderr[-3000:]
        assert "RankFailedError" not in stderr and "killed by SIGINT" not in stderr, stderr[-3000:]
        assert _nothing_left(out)


@pytest.mark.timeout(150)
def test_process_group_timeout_reaches_init_process_group(tmp_path):
    """DDPStrategy(timeout=5 s): rank 0 gives up on a rank that never joins after about 5 s, not 30 minutes."""
    start = time.monotonic()
    done = _python([str(SCRIPT), "late", "--timeout", "5", "--out", str(tmp_path)], _env(), timeout=90)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert re.search(r"Timed out after \d+ seconds waiting for clients\. 1/2 clients joined", done.stderr), done.stderr
    assert 5 < elapsed < 85  # about 5 s, not 30 minutes (generous for a busy host)
    assert _nothing_left(tmp_path)  # rank 1, still asleep, was stopped with rank 0


# ---------------------------------------------------------------------------------------------- other starters


@pytest.mark.timeout(90)
def test_torchrun_single_node(tmp_path, reference):
    """torchrun starts both ranks; tandem reads its environment, starts nothing, and trains as its own launcher."""
    done = _python(_torchrun("--nproc-per-node 2", str(SCRIPT), "fit", "--out", str(tmp_path)), _env())
    assert done.returncode == 0, done.stderr
    results = _results(tmp_path)
    _launched_nothing(results, "TorchElasticEnvironment")
    assert [(r["global_rank"], r["local_rank"], r["node_rank"], r["world_size"]) for r in results] == [
        (0, 0, 0, 2),
        (1, 1, 0, 2),
    ]
    _assert_equal_weights(results, reference)
    assert _nothing_left(tmp_path)


@pytest.mark.timeout(90)
def test_torchrun_names_a_rank_that_ended_early(tmp_path):
    """torchrun, rank 1 with a smaller max_epochs: its fit returns and its script ends while rank 0 still trains.
    Rank 0 says so in a [tandem] line and a RankFailedError, not with gloo's raw "Connection closed by peer"."""
    done = _python(_torchrun("--nproc-per-node 2", str(SCRIPT), "short1", "--out", str(tmp_path)), _env())
    assert done.returncode != 0
    assert re.search(
        r"^\[tandem\] rank 1 ended its script normally \(after Trainer.fit returned\) while rank 0 was in torch's .*, "
        r"in Trainer.fit; rank 0's collective broke\.$",
        done.stderr,
        re.M,
    ), done.stderr[-4000:]
    assert "RankFailedError: Rank 1 ended its script normally (after Trainer.fit returned)" in done.stderr
    assert not re.search(r"^\[rank0\]: RuntimeError: .*Connection closed by peer", done.stderr, re.M)
    assert (tmp_path / "rank1.pt").exists()  # rank 1 did finish
    assert _nothing_left(tmp_path)


@pytest.mark.timeout(90)
def test_torchrun_two_nodes_on_loopback(tmp_path, reference):
    """Two torchrun agents (one per "node", one process each) meet at a c10d rendezvous on 127.0.0.1."""
    port = find_free_port()
    agents = []
    for node in (0, 1):
        options = f"--nnodes 2 --nproc-per-node 1 --node-rank {node} --rdzv-id job"
        endpoint = f"--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port}"
        command = ["-m", "torch.distributed.run", *options.split(), *endpoint.split(), str(SCRIPT)]
        script_args = ["fit", "--devices", "1", "--num-nodes", "2", "--out", str(tmp_path)]
        agents.append(_popen([*command, *script_args], _env()))
    try:
        errors = [agent.communicate(timeout=60)[1] for agent in agents]
        assert [agent.returncode for agent in agents] == [0, 0], errors
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
    results = _results(tmp_path)
    _launched_nothing(results, "TorchElasticEnvironment")
    assert [(r["global_rank"], r["local_rank"], r["world_size"]) for r in results] == [(0, 0, 2), (1, 0, 2)]
    assert sorted(r["node_rank"] for r in results) == [0, 1]
    _assert_equal_weights(results, reference)
    assert _nothing_left(tmp_path)


@pytest.mark.timeout(150)
def test_slurm_environment(tmp_path, reference):
    """Two tasks started the way srun starts them: tandem reads SLURM's variables and starts nothing."""
    port = str(find_free_port())
    tasks = []
    for rank in (0, 1):
        slurm = {
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0",
            "SLURM_NODELIST": "localhost",
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": "train",
            "MASTER_PORT": port,
        }
        tasks.append(_popen([str(SCRIPT), "fit", "--out", str(tmp_path)], _env(**slurm)))
    try:
        errors = [task.communicate(timeout=45)[1] for task in tasks]
        assert [task.returncode for task in tasks] == [0, 0], errors
    finally:
        for task in tasks:
            if task.poll() is None:
                os.killpg(task.pid, signal.SIGKILL)
    results = _results(tmp_path)
    _launched_nothing(results, "SLURMEnvironment")
    assert [(r["global_rank"], r["local_rank"], r["node_rank"]) for r in results] == [(0, 0, 0), (1, 1, 0)]
    _assert_equal_weights(results, reference)


@pytest.mark.timeout(90)
def test_torchrun_restart_resumes_from_last_checkpoint(tmp_path, reference):
    """The README's fault-tolerance recipe: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone
    --max-restarts=1, ModelCheckpoint(every_n_train_steps=2,
    save_last=True) in the default run folder, fit(ckpt_path="last"). Rank 1 SIGKILLs itself after step 7 on
    the first attempt; torchrun restarts both workers, which resume from the step-6 last.ckpt of version_0
    and end with the uninterrupted run's weights, bit for bit."""
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1"]
    env = _env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")  # a fresh store per attempt (see the test below)
    done = _python([*torchrun, str(SCRIPT), "restart", "--out", str(tmp_path)], env)
    assert done.returncode == 0, done.stderr
    assert "pytorch/pytorch#135712" not in done.stderr
    assert (tmp_path / "killed").exists()  # the first attempt did die
    assert "exitcode: -9" in done.stderr  # torchrun saw the SIGKILL
    first = tmp_path / "tandem_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(first, weights_only=False)["global_step"] == 6  # written by the first attempt
    results = _results(tmp_path)
    _launched_nothing(results, "TorchElasticEnvironment")
    for result in results:
        assert result["restart_count"] == "1"
        assert result["start_step"] == 6  # resumed, did not start over
        assert result["last_ckpt"] == str(tmp_path / "tandem_logs" / "version_1" / "checkpoints" / "last.ckpt")
    _assert_equal_weights(results, reference)
    assert _nothing_left(tmp_path)


# ---------------------------------------------------------------------------------------------- threads


@pytest.mark.timeout(150)
def test_threads_per_process(tmp_path, launched):
    """max(1, cpus // local processes) torch threads per rank, unless OMP_NUM_THREADS is set (as it is, to another
    count, for the tandem-launched fit)."""
    per_process, other = _threads()
    assert [r["threads"] for r in launched] == [other, other]
    env = {k: v for k, v in _env().items() if k != "OMP_NUM_THREADS"}
    done = _python([str(SCRIPT), "fit", "--steps", "1", "--out", str(tmp_path)], env)
    assert done.returncode == 0, done.stderr
    assert [r["threads"] for r in _results(tmp_path)] == [per_process, per_process]


def test_torchrun_restarts_with_a_shared_store_warn(monkeypatch):
    """torch >= 2.5 keeps torchrun's store, and the last attempt's keys, across restarts: a restarted job can fail
    or hang in init_process_group (measured: 2 of 5 restarts with c10d, 5 of 5 with the static rendezvous)."""
    torchrun = "TORCHELASTIC_RUN_ID=job RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 TORCHELASTIC_MAX_RESTARTS=1"
    for name, value in (item.split("=") for item in f"{torchrun} TORCHELASTIC_USE_AGENT_STORE=True".split()):
        monkeypatch.setenv(name, value)
    environment = select_environment(num_processes=2)
    assert isinstance(environment, TorchElasticEnvironment) and environment.restarts_share_store
    with pytest.warns(UserWarning, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        environment.export_rendezvous()
    for name, value in (("TORCHELASTIC_USE_AGENT_STORE", "False"), ("TORCHELASTIC_MAX_RESTARTS", "0")):
        with monkeypatch.context() as patch:
            patch.setenv(name, value)
            assert not environment.restarts_share_store
