"""strategy="ddp_ft": the share of each step's data (no processes), the install error and the configuration errors,
and one fault-tolerant fit of two replica groups, one of them SIGKILLed at a random step and started again."""

from __future__ import annotations

import collections
import csv
import json
import os
import random
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import tandem
from helpers import LAUNCH_VARIABLES, loader
from tandem.strategies.samplers import GlobalOrderSampler
from tandem.strategies.step_shares import StepShares, share_of
from tandem.utilities.exceptions import TandemConfigError

SCRIPT = Path(__file__).parent / "scripts" / "ft_fit.py"
SAMPLES, BATCH, EPOCHS = 128, 4, 2
STEPS = EPOCHS * SAMPLES // (2 * BATCH)  # two groups of one process: 8 samples a step


# ---------------------------------------------------------------------- each step's data (no processes)
@pytest.mark.parametrize("items, consumers", [(8, 2), (8, 3), (7, 2), (2, 3), (1, 4)])
def test_a_steps_shares_cover_its_items_once_and_weigh_to_their_mean(items, consumers):
    values = torch.randn(items, dtype=torch.float64)
    shares = [share_of(list(range(items)), c, consumers) for c in range(consumers)]
    trained = [i for indices, weight in shares if weight > 0 for i in indices]
    assert sorted(trained) == list(range(items))  # each item in exactly one share that counts
    # the average over the consumers of each share's mean, weighted, is the mean over all the items
    average = sum(weight * values[indices].mean() for indices, weight in shares) / consumers
    assert torch.allclose(average, values.mean())
    assert all(indices for indices, _ in shares)  # no rank gets an empty batch (one item, weight 0, instead)


def test_shares_are_decided_under_the_quorum_of_the_step_and_skipping_asks_for_none():
    asked, quorum = [], [(0, 2)]

    def ask():
        asked.append(quorum[0])
        return quorum[0]

    order = GlobalOrderSampler(range(20), num_replicas=1, rank=0, shuffle=False)
    shares = StepShares(order, batch_size=2, groups=2, processes=1, process=0, quorum=ask, drop_last=False)
    assert len(shares) == 5  # 20 items, 4 a step
    steps = iter(shares)
    for _ in range(2):  # a resume skips the done steps: no quorum is formed for them
        next(steps)
    assert asked == []
    share = next(steps)
    assert list(share) == [8, 9] and share.weight == 1.0 and asked == [(0, 2)]
    quorum[0] = (0, 1)  # the other group left: the step is loaded again, this group takes all of it
    assert share.decide() == [8, 9, 10, 11] and shares.latest is share


def test_without_torchft_the_strategy_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchft", None)  # import torchft raises ImportError
    with pytest.raises(TandemConfigError, match=r"pip install 'tandem\[ft\]'"):
        tandem.Trainer(strategy="ddp_ft", accelerator="cpu", devices=1)


# ---------------------------------------------------------------------- configuration errors (no processes)
def test_the_configuration_is_checked_before_any_process_starts(monkeypatch):
    pytest.importorskip("torchft")
    from datetime import timedelta

    from tandem.strategies import DDPFTStrategy
    from tandem.strategies.ddp_ft import _check_training_loader

    with pytest.raises(TandemConfigError, match="hang_timeout longer than quorum_timeout"):
        DDPFTStrategy(hang_timeout=timedelta(seconds=30))
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    with pytest.raises(TandemConfigError, match="TORCHFT_LIGHTHOUSE is not set"):
        DDPFTStrategy().fault_tolerance_options()
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://localhost:1")
    with pytest.raises(TandemConfigError, match="0 .. 1"):
        DDPFTStrategy(replica_group_id=2, num_replica_groups=2).fault_tolerance_options()

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    refused = {
        "num_workers=0": loader(num_workers=1),
        "cannot be shared by index": DataLoader(Stream(), batch_size=2),
        "sampler of your own": DataLoader(TensorDataset(torch.zeros(4)), sampler=[3, 2, 1, 0]),
    }
    for message, refused_loader in refused.items():
        with pytest.raises(TandemConfigError, match=message):
            _check_training_loader(refused_loader, use_distributed_sampler=True)
    with pytest.raises(TandemConfigError, match="use_distributed_sampler=False"):
        _check_training_loader(loader(), use_distributed_sampler=False)


# ---------------------------------------------------------------------- one replica group killed, started again
@pytest.fixture(scope="module")
def fault_run(tmp_path_factory):
    """Two replica groups of one process fit 2 epochs; group 1 SIGKILLs itself as the batch of a random step begins
    (after that step's quorum took it in) and is started again. Each group's steps are slow only while it is alone, so
    that the restarted group is back before the end."""
    pytest.importorskip("torchft")
    from tandem.strategies.ft_launch import ReplicaGroupsRun

    out = tmp_path_factory.mktemp("ft")
    kill_step = random.randint(2, STEPS // 2 + 2)
    command = [sys.executable, str(SCRIPT), "--out", str(out), "--samples", str(SAMPLES), "--batch-size", str(BATCH)]
    command += ["--epochs", str(EPOCHS), "--kill-group", "1", "--kill-step", str(kill_step), "--alone-sleep", "1"]
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if LAUNCH_VARIABLES.match(n)]:
            patch.delenv(name)
        patch.setenv("OMP_NUM_THREADS", "1")
        run = ReplicaGroupsRun(command, 2, max_restarts=1, heartbeat_timeout_ms=2_000, log_dir=out, cwd=out)
        run.start()
        try:
            code = run.wait(timeout=240)
        finally:
            run.stop()
    logs = "\n".join((out / f"group_{g}.log").read_text()[-3000:] for g in (0, 1))
    assert code == 0, f"kill step {kill_step}\n{logs}"
    records = [json.loads(line) for g in (0, 1) for line in (out / f"steps_{g}.jsonl").read_text().splitlines()]
    return {"out": out, "kill_step": kill_step, "events": run.events, "records": records, "logs": logs}


def _by_group(records, group, start=None):
    return [r for r in records if r["group"] == group and (start is None or r["start"] == start)]


def test_the_healthy_group_never_stops_and_the_killed_one_rejoins_within_seconds(fault_run):
    records, kill_step, events = fault_run["records"], fault_run["kill_step"], fault_run["events"]
    ended = [(e.group, e.restarts, e.returncode) for e in events if e.kind == "exited"]
    assert sorted(ended) == [(0, 0, 0), (1, 0, -9), (1, 1, 0)], ended  # killed once, started again once
    healthy = _by_group(records, 0)  # the records' times are time.monotonic(), one clock for the machine
    assert [r["step"] for r in healthy] == list(range(STEPS))
    gaps = [b["time"] - a["time"] for a, b in zip(healthy, healthy[1:])]
    assert max(gaps) < 10, f"the healthy group waited {max(gaps):.1f} s for a step (kill step {kill_step})"
    # the step the killed group left in the middle of ran again, the healthy group alone training all of it
    assert len(healthy[kill_step]["indices"]) == 2 * BATCH, healthy[kill_step]
    restarted = next(e.time for e in events if e.kind == "started" and e.group == 1 and e.restarts == 1)
    back = _by_group(records, 1, start=1)
    assert back, fault_run["logs"]
    rejoined_after = back[0]["time"] - restarted
    assert rejoined_after < 30, f"the restarted group trained its first step {rejoined_after:.1f} s after its start"
    assert [r["step"] for r in back] == list(range(back[0]["step"], STEPS))  # it continued the run's steps
    assert [r["step"] for r in _by_group(records, 1, start=0)] == list(range(kill_step))


def test_every_sample_of_each_epoch_is_trained_exactly_once(fault_run):
    trained = collections.defaultdict(list)
    for record in fault_run["records"]:
        assert record["indices"] == record["batch"]  # the batch the hooks saw is the one that was trained
        trained[record["epoch"]] += record["indices"]
    for epoch in range(EPOCHS):
        counts = collections.Counter(trained[epoch])
        assert sorted(counts) == list(range(SAMPLES)) and set(counts.values()) == {1}, (epoch, fault_run["kill_step"])


def test_both_groups_end_with_equal_weights_and_the_run_has_one_set_of_checkpoints(fault_run):
    out = fault_run["out"]
    first, second = (torch.load(out / f"weights_{g}.pt") for g in (0, 1))
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    last = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == STEPS and all(torch.equal(last["state_dict"][k], first[k]) for k in first)


def _logged(path: Path) -> dict[int, float]:
    rows = [row for row in csv.DictReader(path.open()) if row["loss_step"]]
    steps = [int(row["step"]) for row in rows]
    assert len(steps) == len(set(steps)), f"a step logged twice in {path}"
    return {int(row["step"]): float(row["loss_step"]) for row in rows}


def test_the_logged_curve_has_no_gap_or_repeat_and_the_groups_log_the_same_values(fault_run):
    out = fault_run["out"]
    healthy = _logged(out / "logs_0" / "start_0" / "metrics.csv")
    assert sorted(healthy) == list(range(STEPS))
    back = _logged(out / "logs_1" / "start_1" / "metrics.csv")
    joined = min(back)
    assert sorted(back) == list(range(joined, STEPS))  # the rejoined group's curve continues the run's
    assert {step: healthy[step] for step in back} == back  # sync_dist reduced over the quorum: the same numbers
