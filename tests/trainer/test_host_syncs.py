"""Between logging steps tandem reads no more device values on the host than the hand-written loop does.

Each configuration (``sync_counting.SETUPS``: automatic and manual optimization, with and without accumulation,
clipping, a per-step scheduler and ``on_nonfinite="rollback"``) runs twice in the same test: through
``Trainer.fit`` and as the matching hand-written PyTorch loop, both counted by ``sync_counting.HostReads`` over the
same steady-state batches (4 to 11 of 12, no logging step among them). A read is a host-device sync on a GPU
(``.item()``, ``bool(t)``, ``.tolist()``, a copy to the CPU, ``nonzero``). The float16 configurations use
``GradScaler("cpu")`` and float16 autocast on the CPU, as on a GPU: the hand loop reads once a step, in
``scaler.step`` (its found-inf check); 32-true and bf16-mixed read nothing. ``benchmarks/gpu_check.py`` runs the
same pairs on CUDA under torch's profiler.
"""

from __future__ import annotations

import pytest
import torch

from sync_counting import AUTOCAST, SETUPS, HostReads, run_hand, run_tandem

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("precision", list(AUTOCAST))
@pytest.mark.parametrize("name", list(SETUPS))
def test_no_more_host_reads_than_the_hand_loop_between_logging_steps(precision, name):
    setup = SETUPS[name]
    ours, hand = HostReads(), HostReads()
    run_tandem(precision, setup, ours)
    run_hand(precision, setup, hand)
    steps = setup.steps()
    expected = {"scalar": steps} if precision == "16-mixed" else {}  # the found-inf check in scaler.step
    assert dict(hand.counts) == expected, hand.report()  # the counter itself: torch's recipe reads once a step
    for kind in ("scalar", "copy", "nonzero"):
        assert ours.counts[kind] <= hand.counts[kind], (
            f"{kind}: tandem {ours.counts[kind]}, hand loop {hand.counts[kind]} over {steps} steps. "
            f"tandem: {ours.report()}. hand loop: {hand.report()}"
        )


def test_the_counter_sees_each_kind_of_read():
    t = torch.arange(-2.0, 3.0)
    with HostReads() as reads:
        t.sum().item()
        bool(t.sum() > 0)
        float(t[0])
        t.tolist()
        t.numpy()
        t.cpu()
        t.to("cpu")  # on the CPU the same as a move onto the device: not counted
        t.nonzero()
        t[t > 0]
        torch.masked_select(t, t > 0)
    assert dict(reads.counts) == {"scalar": 3, "copy": 3, "nonzero": 3}, reads.report()
    assert all("test_host_syncs.py" in line for _, line in reads.where), reads.report()
