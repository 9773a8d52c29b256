"""The side channel: its collective check with two real processes (agreement, a mismatch, a blocked rank, an
ended rank); the entry point and the pre-emption vote without processes."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import launch_free_env
from tandem.strategies import side_channel
from tandem.strategies.side_channel import (
    CallSite,
    close_channel,
    current_channel,
    entry_point,
    open_channel,
    preemption_vote,
)

SCRIPT = Path(__file__).parent / "scripts" / "side_channel_runs.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("side_channel")
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), str(out)],
            env=launch_free_env(
                RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1"
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    outputs = [p.communicate(timeout=90)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outputs)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


pytestmark = pytest.mark.timeout(120)


def test_ranks_that_enter_the_same_collectives_pass_cheaply(ranks):
    for result in ranks:
        assert result["agree_errors"] == []
        assert result["agree_us_per_check"] < 5000  # a few store round trips (about 0.1-0.5 ms on loopback)


def test_different_collectives_raise_on_every_rank_naming_both_sides(ranks):
    for result in ranks:
        message, seconds = result["different"]
        assert message is not None and seconds < 10
        assert "rank 0 entered barrier (from Strategy.save_checkpoint, called at train.py:10 in main)" in message
        assert "rank 1 entered broadcast (from Trainer._setup, called at train.py:11 in main)" in message
        assert "guard only side effects" in message


def test_a_rank_blocked_in_another_collective_is_reported_after_the_stall_timeout(ranks):
    message, seconds = ranks[0]["blocked"]
    assert message is not None
    assert message.startswith("Rank 1 has waited")
    assert "while rank 0 entered barrier (from Strategy.save_checkpoint, called at train.py:42 in main)" in message
    assert 2.0 <= seconds < 10  # the stall timeout (2 s here, 60 s by default), not the 30-minute one


def test_a_rank_whose_script_ended_is_reported_at_once(ranks):
    message, seconds = ranks[0]["exited"]
    assert message is not None and seconds < 5
    assert message.startswith("Rank 1 exited (its script ended) while rank 0 entered broadcast")


# ---------------------------------------------------------------------------------------------- no processes


@pytest.fixture
def no_channel(monkeypatch):
    """This process's side channel put aside: an earlier test may have joined a process group of one."""
    monkeypatch.setattr(side_channel, "_CHANNEL", None)


def _tag_here() -> str:
    return CallSite.here("barrier", depth=1).tag  # as a strategy's collective asks for it, from user code


def test_the_entry_point_is_the_innermost_block_that_tagged_it():
    assert _tag_here() == "barrier@user code"
    with entry_point("fit"):
        assert _tag_here() == "barrier@user code in Trainer.fit"
        with entry_point("save_checkpoint"):  # save_checkpoint inside fit reports save_checkpoint
            assert _tag_here() == "barrier@user code in Trainer.save_checkpoint"
        assert _tag_here() == "barrier@user code in Trainer.fit"
    assert _tag_here() == "barrier@user code"


def test_without_a_side_channel_the_pre_emption_vote_stops_where_it_is(no_channel):
    assert current_channel() is None
    vote = preemption_vote()
    vote.new_round()
    assert vote.target((2, 7)) == (2, 7)


def test_a_side_channel_serves_both_clients_until_it_is_closed(no_channel):
    channel = open_channel(dist.HashStore(), rank=0, world_size=1, run_id="unit")
    try:
        assert current_channel() is channel and preemption_vote() is channel.preemption_vote
        channel.collective_check.check(CallSite("barrier@Trainer.fit", "train.py:1 in main"))  # one rank agrees
        assert channel.collective_check.count == 1
        preemption_vote().new_round()
        assert preemption_vote().target((1, 3)) == (1, 3)  # the only rank: its own position
    finally:
        close_channel()
    assert current_channel() is None and preemption_vote().target((0, 1)) == (0, 1)
    assert channel.beat(0).status == "left its process group"  # what the other ranks would read


def test_the_call_site_of_a_collective_asked_through_apply_to_collection_is_the_users_line():
    """``self.all_gather`` reaches the strategy through lightning-utilities' ``apply_to_collection``: the call site
    named is the user's line, not a line of lightning_utilities."""
    from lightning_utilities.core.apply_func import apply_to_collection

    def strategy_collective(tensor: torch.Tensor) -> CallSite:  # stands where the strategy asks (depth 2, as _check)
        return CallSite.here("all_gather", depth=2)

    site = apply_to_collection(torch.ones(1), torch.Tensor, strategy_collective)  # the user's line
    line = sys._getframe().f_lineno - 1
    assert site.user == f"test_side_channel.py:{line} in {sys._getframe().f_code.co_name}"
    assert site.tag == "all_gather@user code"


_EXIT_WHILE_BEATING = """
import socket, threading, time
import torch.distributed as dist
from tandem.strategies import side_channel

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
store = dist.TCPStore("127.0.0.1", port, 1, True, wait_for_workers=False)
slow = dist.TCPStore("127.0.0.1", port, 1, False)  # a connection of its own: the main thread is not held up

post = side_channel.SideChannel._post_beat
def slow_post(self, status, blocked_for, where):  # the watcher's beat is a stream of C++ store calls (a busy store)
    if threading.current_thread() is self._watcher:
        for _ in range(2000):
            slow.set("busy", "x" * 100)
    post(self, status, blocked_for, where)
side_channel.SideChannel._post_beat = slow_post
side_channel._BEAT_S = 0.0
side_channel.open_channel(store, rank=0, world_size=1, run_id="exit")
time.sleep(0.5)
"""


def test_a_process_ends_cleanly_while_its_watcher_talks_to_the_store():
    """A daemon thread still inside a C++ store call at interpreter exit aborts the process (SIGABRT, "terminate
    called without an active exception") when the call returns during finalization; the other ranks read it as a
    crash of this rank (seen under load, when rank 0's store answers slowly). Closing the channel at exit waits for
    the watcher to finish its beat. Without that wait this script aborts nearly every time."""
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_WHILE_BEATING],
        env=launch_free_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr
