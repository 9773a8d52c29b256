from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from tandem.utilities.data import extract_batch_size, find_sampler, make_skippable, rebuild_dataloader

pytestmark = pytest.mark.timeout(30)


def _loader(**kwargs):
    return DataLoader(TensorDataset(torch.arange(10.0)), **kwargs)


def test_skippable_loader_gives_the_same_order_as_the_plain_loader_and_can_skip():
    plain = _loader(batch_size=3, shuffle=True)
    wrapped, skippable = make_skippable(plain)
    torch.manual_seed(5)
    expected = [b[0].tolist() for b in plain]
    torch.manual_seed(5)
    assert [b[0].tolist() for b in wrapped] == expected
    torch.manual_seed(5)
    skippable.skip = 2
    assert [b[0].tolist() for b in wrapped] == expected[2:]
    assert len(wrapped) == 4 and isinstance(find_sampler(wrapped), RandomSampler)


def test_rebuild_keeps_loader_settings_and_refuses_custom_subclasses():
    base = _loader(batch_size=4, drop_last=True, collate_fn=lambda b: b)
    rebuilt = rebuild_dataloader(base, sampler=list(range(10))[::-1])
    assert rebuilt.batch_size == 4 and rebuilt.drop_last and rebuilt.collate_fn is base.collate_fn

    class Custom(DataLoader):
        def __init__(self, dataset, extra):
            super().__init__(dataset)

    with pytest.raises(TypeError, match="cannot rebuild it safely"):
        rebuild_dataloader(Custom(TensorDataset(torch.arange(3.0)), 1), sampler=[0])


def test_extract_batch_size_from_collections():
    assert extract_batch_size({"x": torch.zeros(5, 2), "meta": "a"}) == 5
    assert extract_batch_size([["a"], (torch.zeros(3),)]) == 3
    assert extract_batch_size(torch.tensor(1.0)) == 1
