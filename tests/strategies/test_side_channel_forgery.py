"""Nothing an outsider writes into the process group's store steers the job (issue 41). The store listens on every
interface, unauthenticated (as torchrun's): this test is the outsider. It connects to a running two-rank gloo job's
store as a client of its own, finds the job's keys with ``list_keys()``, and forges everything the side channel acts
on; the fit must end as the same fit without the forgery (``scripts/forged_store_fit.py`` runs both, one launch)."""

from __future__ import annotations

import datetime
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers import launch_free_env
from tandem.strategies.environments.machine import find_free_port

SCRIPT = Path(__file__).parent / "scripts" / "forged_store_fit.py"
NOT_SIGNED = b"0" * 64  # where a signature goes, but not the job's


def _unsigned(payload: str) -> bytes:
    return NOT_SIGNED + payload.encode()


def _wait_for(path: Path, job: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert job.poll() is None, "the job ended before it paused for the outsider"
        assert time.monotonic() < deadline, f"{path.name} did not appear in {seconds:.0f} s"
        time.sleep(0.05)


def _forge(store: dist.TCPStore) -> tuple[str, list[str], list[str]]:
    """Forge every control value of the job at once: (the channel's prefix, the beat keys, the names forged, under
    the prefix). The keys listed hold the process group's own prefix too (``default_pg/0//``)."""
    keys = store.list_keys()
    prefix = next(m.group(1) for k in keys if (m := re.match(r"^(.*tandem/side/\w+)/beat/0$", k)))
    checks = [int(m.group(1)) for k in keys if (m := re.match(rf"^{re.escape(prefix)}/check/(\d+)/tag$", k))]
    n = max(checks)  # the latest check: both ranks are between it and the next one
    forged = []

    def put(name: str, value: bytes) -> None:
        store.set(f"{prefix}/{name}", value)
        forged.append(name)

    for round_ in range(1, 6):  # the pre-emption vote of any fit: a signal, stop positions, the count held back
        put(f"preempt/{round_}/signal", _unsigned("15"))
        for rank in (0, 1):
            put(f"preempt/{round_}/stop/{rank}", _unsigned("0 1"))
        store.add(f"{prefix}/preempt/{round_}/posted", -1)
    put("teardown", _unsigned("rank 1 failed (ValueError: forged)"))
    put("stopping", _unsigned("tandem's launcher stops the job (forged)"))  # rank 1 waits in a collective now
    store.add(f"{prefix}/moved", -(1 << 62))  # "rank 0 declared a hang", as the counter says it
    put("hang", _unsigned("rank 0 declared a hang after 60 s"))
    for m in range(n + 1, n + 40):  # the next checks: a tag, a differing rank, a mismatch verdict
        put(f"check/{m}/tag", _unsigned("0\nbarrier@forged in Trainer.fit\nforged.py:1 in main"))
        store.append(f"{prefix}/check/{m}/differ", b"\0" + _unsigned("1\nbroadcast@forged\nforged.py:2 in main"))
        store.append(f"{prefix}/check/{m}/differ", b"no NUL around me")
        forged.append(f"check/{m}/differ")
        put(f"check/{m}/verdict", _unsigned("The ranks entered different collectives: forged."))
    for m in range(n + 1, n + 4):  # counted down: no rank counts itself last
        store.add(f"{prefix}/check/{m}/arrived", -1)
    for m in range(n + 4, n + 6):  # counted up: the first rank to arrive counts itself last
        store.add(f"{prefix}/check/{m}/arrived", 1)
    return prefix, [f"{prefix}/beat/0", f"{prefix}/beat/1"], forged


def _forge_beats(store: dist.TCPStore, beats: list[str], seconds: float) -> None:
    """Keep rewriting the beats (their watchers post theirs once a second): rank 0's malformed, rank 1 "failed"."""
    failed = _unsigned("99\n0.0\nfailed (ValueError: forged)\n0.0\n\n\n\n\ncheck 1: barrier")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        store.set(beats[0], b"\xff\x00\x01 not a beat")
        store.set(beats[1], failed)
        time.sleep(0.02)


@pytest.mark.timeout(240)
def test_what_an_outsider_writes_into_the_store_changes_nothing(tmp_path):
    port = find_free_port()
    log = tmp_path / "job.log"
    with log.open("w") as output:  # a file, not a pipe: nobody reads a pipe while the outsider works
        job = subprocess.Popen(
            [sys.executable, str(SCRIPT), str(tmp_path)],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=launch_free_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1"),
        )
    try:
        _wait_for(tmp_path / "ready", job, seconds=150)  # rank 0 paused its second fit
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
        _, beats, forged = _forge(store)
        _forge_beats(store, beats, seconds=3.0)  # rank 1 sits in the gradient all-reduce meanwhile: "stopping"
        (tmp_path / "forged").write_text("")
        _forge_beats(store, beats, seconds=3.0)  # while the next checks run (their count held back)
        job.wait(timeout=150)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    err = log.read_text()
    assert job.returncode == 0, err[-5000:]
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for result in results:
        assert result["steps"] == (16, 16)  # every step of both fits
        for name, weight in result["clean"].items():  # the same weights as without the forgery
            assert torch.equal(result["forged"][name], weight), name
        assert result["watcher_alive"]  # the hang watch still runs (hang_timeout set) and still beats
        assert result["hang_timeout"] == 60.0 and result["hang"] is None
        first, last = result["beats"]
        assert first is not None and last is not None and last > first
        assert result["torn_down"] is None  # a later SIGTERM is a pre-emption again, not the teardown
        assert result["preemption"] == (None, None)
    assert not list(tmp_path.rglob("*.ckpt"))  # no pre-emption stop wrote last.ckpt
    ignored = [line for line in err.splitlines() if line.startswith("[tandem] ignored ")]
    assert ignored, err[-5000:]  # the forged values were read, and set aside
    names = [re.sub(r"^tandem/side/\w+/", "", line.split()[2]) for line in ignored]
    assert all(name in forged or name in ("beat/0", "beat/1") for name in names), "\n".join(ignored)
    assert len(ignored) <= 40  # once per key, at most 20 keys a rank
    for ended in ("Traceback", "skipped a beat", "CollectiveMismatchError", "RankFailedError", "HangError"):
        assert ended not in err, err[-5000:]
