"""The tuner under two-process DDP (the shared ``core_ddp`` launch, scenario ``tuner``)."""

from __future__ import annotations

import torch


def test_lr_find_under_ddp_gives_every_rank_rank_zeros_results_and_puts_the_weights_back(core_ddp):
    zero, one = core_ddp["tuner"]
    # each rank trained its own shard, so only the broadcast makes the recorded losses (and the suggestion) agree
    assert zero["results"] == one["results"] and len(zero["results"]["lr"]) == 20
    assert zero["lr"] == one["lr"] != 0.01  # the suggestion, set on every rank
    assert zero["restored"] and one["restored"] and zero["searched_steps"] == one["searched_steps"] == 0
    assert zero["steps"] == one["steps"] == 24  # the fit after: 3 epochs of 8 batches of 4 a rank
    assert all(torch.equal(zero["final"][k], one["final"][k]) for k in zero["final"])
    assert zero["left"] == [] and one["left"] == []  # the temporary checkpoint is gone
