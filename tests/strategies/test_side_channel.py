"""The side channel: its collective check with two real processes (agreement, a mismatch, a blocked rank, an
ended rank); the entry point and the pre-emption vote without processes; the signed store, and what values an
outsider writes do to the watcher, the hang watch, the check and the vote (two channels of one process over a
HashStore). A real fit under forgery: ``test_side_channel_forgery.py``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import launch_free_env
from tandem.strategies.side_channel.channel import SideChannel, open_channel
from tandem.strategies.side_channel.group import close_channel, current_channel
from tandem.strategies.side_channel.places import CallSite, entry_point, error_summary
from tandem.strategies.side_channel.preemption import preemption_vote
from tandem.strategies.side_channel.store import _REPORT_LIMIT, SignedStore
from tandem.utilities.exceptions import CollectiveMismatchError
from tandem.utilities.preemption import PREEMPTION

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
    monkeypatch.setattr("tandem.strategies.side_channel.group._CHANNEL", None)


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
    channel = open_channel(dist.HashStore(), rank=0, world_size=1, run_id="unit", secret=b"k" * 32)
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
from tandem.strategies.side_channel import channel, group

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
store = dist.TCPStore("127.0.0.1", port, 1, True, wait_for_workers=False)
slow = dist.TCPStore("127.0.0.1", port, 1, False)  # a connection of its own: the main thread is not held up

post = channel.SideChannel._post_beat
def slow_post(self, *args):  # the watcher's beat is a stream of C++ store calls (a busy store)
    if threading.current_thread() is self._watcher:
        for _ in range(2000):
            slow.set("busy", "x" * 100)
    post(self, *args)
channel.SideChannel._post_beat = slow_post
channel._BEAT_S = 0.0  # the watcher's pace
channel.open_channel(store, rank=0, world_size=1, run_id="exit", secret=group.new_secret())
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


# ---------------------------------------------------------------------------------------------- signed values


SECRET = b"s" * 32


def test_a_signed_value_reads_back_only_at_its_own_key_and_with_the_jobs_secret():
    raw = dist.HashStore()
    store = SignedStore(raw, SECRET)
    store.set("job/teardown", "rank 1 failed")
    assert store.get("job/teardown") == "rank 1 failed"
    assert store.get("job/absent") is None
    raw.set("job/stopping", raw.get("job/teardown"))  # a signed value moved to another key
    assert store.get("job/stopping") is None
    assert SignedStore(raw, b"t" * 32).get("job/teardown") is None  # another job's secret
    for malformed in (b"", b"\xff\x00\x01", b"0" * 64 + b"rank 1 failed", b"\xff" * 200):
        raw.set("job/hang", malformed)
        assert store.get("job/hang") is None


def test_a_value_not_signed_by_the_job_is_ignored_and_reported_once_per_key(capsys):
    raw = dist.HashStore()
    store = SignedStore(raw, SECRET)
    raw.set("job/teardown", b"0" * 64 + b"forged")
    assert [store.get("job/teardown"), store.clone().get("job/teardown")] == [None, None]
    reported = capsys.readouterr().err.splitlines()
    assert reported == [
        "[tandem] ignored job/teardown in the process group's store: its value is not signed by this job (an outsider "
        "wrote it, or it is malformed); the job goes on as if the key were absent."
    ]
    for n in range(100):  # a flood of forged keys: a bounded number of lines
        raw.set(f"job/flood/{n}", b"forged")
        assert store.get(f"job/flood/{n}") is None
    reported = capsys.readouterr().err.splitlines()
    assert len(reported) == _REPORT_LIMIT - 1
    assert reported[-1].endswith(f"Further such keys are not reported ({_REPORT_LIMIT} were).")


def test_the_first_signed_writer_wins_over_an_outsider_who_wrote_first():
    raw = dist.HashStore()
    rank0, rank1 = SignedStore(raw, SECRET), SignedStore(raw, SECRET)
    raw.set("job/check/1/tag", b"forged tag")
    assert rank0.first("job/check/1/tag", "0\nbarrier") == "0\nbarrier"
    assert rank1.first("job/check/1/tag", "1\nbarrier") == "0\nbarrier"  # the first signed value stays
    raw.set("job/check/1/verdict", b"0" * 64 + b"The ranks entered different collectives")
    assert rank1.first("job/check/1/verdict", "ok") == "ok"
    assert rank0.get("job/check/1/verdict") == "ok"


def test_records_skip_whatever_an_outsider_appended():
    raw = dist.HashStore()
    store = SignedStore(raw, SECRET)
    assert store.records("job/differ") == []
    raw.append("job/differ", b"\0" + b"0" * 64 + b"1\nforged")
    store.append("job/differ", "1\nbroadcast")
    raw.append("job/differ", b"no NUL around me")  # it does not glue to the records around it
    store.append("job/differ", "2\nbarrier")
    assert store.records("job/differ") == ["1\nbroadcast", "2\nbarrier"]


@pytest.fixture
def fast_beats(monkeypatch):
    """Beats every 20 ms; a pre-emption request and os._exit recorded, never acted on."""
    for module in ("beat", "channel", "collective_check", "hang", "preemption", "skipped_batch"):  # each its own pace
        monkeypatch.setattr(f"tandem.strategies.side_channel.{module}._BEAT_S", 0.02)
    monkeypatch.setattr(PREEMPTION, "signum", None)
    monkeypatch.setattr(PREEMPTION, "teardown", None)
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    return exits


def _channel(store, rank: int, world_size: int = 2) -> SideChannel:
    return SideChannel(store, rank, world_size, run_id="unit", secret=SECRET)


def _wait(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_malformed_and_unsigned_values_never_end_the_watcher(fast_beats, capfd):
    raw = dist.HashStore()
    channel = _channel(raw, rank=1)
    try:
        channel.hang_timeout = 0.1
        prefix = channel.prefix
        raw.set(f"{prefix}/beat/0", b"\xff\x00\x01 not a beat")
        raw.set(f"{prefix}/preempt/0/signal", b"0" * 64 + b"15")
        raw.set(f"{prefix}/teardown", b"forged")
        raw.set(f"{prefix}/hang", b"0" * 64 + b"rank 0 declared a hang")
        raw.add(f"{prefix}/moved", -(1 << 62))  # "a hang was declared", as the counter says
        assert _wait(lambda: channel.beat(1) is not None)
        beats = channel.beat(1).number
        assert _wait(lambda: channel.beat(1).number > beats + 5)  # the watcher beats on
        assert channel._watcher.is_alive() and fast_beats == []  # it did not end the process either
        assert channel.beat(0) is None and channel.torn_down() is None and PREEMPTION.signum is None
        err = capfd.readouterr().err
        assert f"[tandem] ignored {prefix}/hang in the process group's store" in err
        assert err.count(f"{prefix}/hang ") == 1 and f"{prefix}/preempt/0/signal" in err
        assert "skipped a beat" not in err
    finally:
        channel.close()


def test_the_hang_watch_ignores_an_unsigned_beat_and_a_held_back_count_and_still_sees_a_hang(fast_beats, monkeypatch):
    declared: list[list] = []
    monkeypatch.setattr(SideChannel, "_declare_hang", lambda self, beats, stalled: declared.append(beats))
    raw = dist.HashStore()
    channel = _channel(raw, rank=0)
    try:
        channel.place = lambda: ("train", 0, 3, 3)  # rank 0 sits at one place: its beats say it has not moved
        channel.hang_timeout = 0.1
        beat1 = f"{channel.prefix}/beat/1"
        raw.set(beat1, b"\xff\x00 not a beat")
        time.sleep(0.5)  # rank 1's beat is not the job's: no hang can be told from it
        assert declared == [] and channel._watcher.is_alive()
        moving = "1\n0.0\nrunning\n0.0\ntraining_step (train.py:3)\ntrain 0 4 4\ntraining_step\n\n"  # rank 1 moves
        channel.store.set(beat1, moving)  # the counter stays put (an outsider holds it back): the beat decides
        time.sleep(0.5)
        assert declared == []
        channel.store.set(beat1, "2\n60.0\nrunning\n60.0\nall_reduce (torch)\ntrain 0 4 4\ntraining_step\n\n")
        assert _wait(lambda: declared != [])  # both ranks still, signed: a hang
        assert [beat.place for beat in declared[0]] == ["train 0 3 3", "train 0 4 4"]
    finally:
        channel.close()


def _check_on_both(channels: list[SideChannel], n: int) -> list[str | None]:
    """Rank 0's check ``n`` in a thread, rank 1's here: what each raised (None: it passed)."""
    outcome: list[str | None] = [None, None]

    def check(rank: int) -> None:
        try:
            channels[rank].collective_check.check(CallSite("barrier@Trainer.fit", "train.py:1 in main"), 60.0)
        except Exception as error:
            outcome[rank] = repr(error)

    other = threading.Thread(target=check, args=(0,))
    other.start()
    check(1)
    other.join(30)
    assert not other.is_alive() and [c.collective_check.count for c in channels] == [n, n]
    return outcome


def test_a_collective_check_whose_count_an_outsider_changed_still_agrees(fast_beats):
    raw = dist.HashStore()
    channels = [_channel(raw, rank=0), _channel(raw, rank=1)]
    prefix = channels[0].prefix
    try:
        for n in (1, 2, 3):
            raw.set(f"{prefix}/check/{n}/tag", b"0" * 64 + b"1\nbroadcast@forged\nforged.py:1 in main")
            raw.append(f"{prefix}/check/{n}/differ", b"\0" + b"0" * 64 + b"1\nbroadcast@forged\nforged.py:1 in main")
            raw.set(f"{prefix}/check/{n}/verdict", b"0" * 64 + b"The ranks entered different collectives: forged")
        raw.add(f"{prefix}/check/1/arrived", -5)  # held back: no rank counts itself last
        raw.add(f"{prefix}/check/2/arrived", 1)  # pushed up: the first rank counts itself last
        raw.add(f"{prefix}/check/3/arrived", -1)
        for n in (1, 2, 3):
            assert _check_on_both(channels, n) == [None, None]
    finally:
        for channel in channels:
            channel.close()


def test_a_pre_emption_vote_whose_count_an_outsider_held_back_still_agrees(fast_beats, monkeypatch):
    raw = dist.HashStore()
    channels = [_channel(raw, rank=0), _channel(raw, rank=1)]
    try:
        for channel in channels:
            channel.preemption_vote.new_round()
        prefix = channels[0].prefix
        raw.add(f"{prefix}/preempt/1/posted", -3)  # held back: the ranks read the signed positions instead
        raw.set(f"{prefix}/preempt/1/stop/1", b"0" * 64 + b"99 0")  # an outsider's stop position for rank 1
        monkeypatch.setattr(PREEMPTION, "signum", 15)
        targets: list = [None, None]
        other = threading.Thread(target=lambda: targets.__setitem__(0, channels[0].preemption_vote.target((2, 5))))
        other.start()
        targets[1] = channels[1].preemption_vote.target((2, 7))
        other.join(30)
        assert targets == [(2, 7), (2, 7)]
    finally:
        for channel in channels:
            channel.close()


def test_a_summary_never_cuts_a_call_site_in_two():
    """A status or teardown reason quotes about 300 characters of an error: a CollectiveMismatchError naming a barrier
    called at module level (``in <module>``) was cut inside the call site, and its summary line read
    ``called at script.py:8 in )``. Whatever the length before it, the summary ends at a clause or sentence."""
    site = "called at script.py:8 in <module>"
    messages = [
        f"Rank 1 has waited 61 s in torch's barrier (distributed_c10d.py:5356), {'w' * (lead - 69)}, {site}, a "
        f"collective that rank 0 never entered (rank 1's last tandem collective was check 8: reduce (from "
        f"smallest_and_largest in Trainer.fit, {site})), while rank 0 entered broadcast (from Trainer._setup in "
        "Trainer.fit, called at script.py:9 in <module>). Every rank must enter the same collectives."
        for lead in range(230, 300)
    ]
    summaries = [error_summary(CollectiveMismatchError(m)) for m in messages]
    cut = [s for s in summaries if "in <" in s.replace(site, "") or f"stopped the job ({s})".count("in )")]
    assert cut == []
    for message, summary in zip(messages, summaries):
        assert summary.endswith(" ...") and message.startswith(summary.removeprefix("CollectiveMismatchError: ")[:-4])
        assert summary.count("(") == summary.count(")"), summary
    short = error_summary(ValueError("bad sample in rank 1"))
    assert short == "ValueError: bad sample in rank 1"


# ---------------------------------------------------------------------------------------------- the skip agreement


def backward(release: threading.Event) -> None:
    """A main thread inside a backward pass (named as the watcher names it), until ``release``."""
    release.wait(30)


def test_a_batch_skipped_on_every_rank_is_agreed(fast_beats):
    raw = dist.HashStore()
    channels = [_channel(raw, rank=0), _channel(raw, rank=1)]
    try:
        for channel in channels:
            channel.place = lambda: ("train", 0, 1, 1)
        agreed: list = ["waiting", "waiting"]
        other = threading.Thread(target=lambda: agreed.__setitem__(0, channels[0].skip_agreement.agree()))
        other.start()
        agreed[1] = channels[1].skip_agreement.agree()
        other.join(30)
        assert agreed == [None, None]  # every rank skipped batch 1: nobody is named
    finally:
        for channel in channels:
            channel.close()


def test_a_rank_in_backward_at_the_batch_another_skipped_is_named(fast_beats):
    """Rank 1 returned None at batch 1; rank 0 is in its backward pass. While rank 0's backward is an earlier batch's
    (it is behind), rank 1 waits for it; once rank 0 is in backward at batch 1, rank 1 names it."""
    raw = dist.HashStore()
    release = threading.Event()
    in_backward = threading.Thread(target=backward, args=(release,))
    in_backward.start()
    channels = [
        SideChannel(raw, 0, 2, run_id="unit", secret=SECRET, main_thread=in_backward),
        _channel(raw, rank=1),
    ]
    try:
        place = ["train", 0, 0, 0]
        channels[0].place = lambda: tuple(place)
        channels[1].place = lambda: ("train", 0, 1, 1)
        found: list = ["waiting"]
        waiting = threading.Thread(target=lambda: found.__setitem__(0, channels[1].skip_agreement.agree()))
        waiting.start()
        time.sleep(0.3)  # fifteen beats of rank 0 in backward at batch 0
        assert found == ["waiting"]
        place[2:] = [1, 1]  # rank 0 reached batch 1 and ran backward there
        waiting.join(30)
        assert found == [0]
    finally:
        release.set()
        in_backward.join(30)
        for channel in channels:
            channel.close()
