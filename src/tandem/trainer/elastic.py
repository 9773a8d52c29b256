"""Elastic resume: a checkpoint written by W processes continues on W' (1 included) at the exact next sample.

The training order of an epoch is global: a :class:`~tandem.strategies.samplers.GlobalOrderSampler` draws it from
what the checkpoint records (the seed and the epoch, or the seed a RandomSampler drew for the epoch), the same on 1
or N processes, and rank r takes items r, r+N, ... of it. Global
batch k is then the block ``order[k·G : (k+1)·G]`` with ``G`` = per-device batch × processes, so a run keeps its
place by counting items of the order consumed (``batches_done · G``), not per-rank positions. A checkpoint saves
the layout it was trained with (:func:`data_layout`, in ``checkpoint["loops"]["data"]``); a resume with another
layout translates its place (:func:`continue_from`):

- the same global batch (G·accumulation kept): the run continues as if never interrupted;
- another global batch: it continues from the items consumed, and says so once;
- an order tandem cannot re-shard (a sampler of the user's on one process, an iterable dataset) resumed mid-epoch
  on another layout: an error naming why, never a silent restart of the epoch.
"""

from __future__ import annotations

import math
from typing import Any

from torch.utils.data import BatchSampler, DataLoader

from tandem.strategies.samplers import GlobalOrderSampler
from tandem.trainer.state import LoopState, StageData
from tandem.utilities.data import find_sampler, unwrapped
from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.rank_zero import rank_zero_info, rank_zero_warn


def order_sampler(data: StageData | None) -> GlobalOrderSampler | None:
    """The training loader's global-order sampler, if it draws one."""
    loader = data.loaders[0] if data is not None and data.loaders else None
    sampler = find_sampler(loader) if isinstance(loader, DataLoader) else None
    return sampler if isinstance(sampler, GlobalOrderSampler) else None


def data_layout(data: StageData | None, world_size: int, accumulate: int) -> dict[str, Any] | None:
    """How the training data is laid out: processes, items of the order per batch of one process
    (its batch size; 1 when the items are whole batches), accumulation, the order's seed (None: the order
    is the loader's own, which tandem cannot re-shard) and what else the order is made from (``order``: see
    :meth:`~tandem.strategies.samplers.GlobalOrderSampler.order_settings`). None before a fit has training data."""
    if data is None or not data.loaders:
        return None
    sampler = order_sampler(data)
    batches = unwrapped(getattr(data.loaders[0], "batch_sampler", None))
    items = batches.batch_size if type(batches) is BatchSampler else 1
    return {
        "world_size": world_size,
        "items_per_batch": items,
        "accumulate": accumulate,
        "seed": sampler.seed if sampler is not None else None,
        "order": sampler.order_settings() if sampler is not None else None,
    }


def continue_from(
    saved: dict[str, Any], now: dict[str, Any], loop: LoopState, data: StageData, announce: bool = True
) -> None:
    """Put ``loop`` (restored from a checkpoint trained with layout ``saved``) at the same place of the global
    order under layout ``now``: the checkpoint's order (its seed, how it shuffles, the epoch in progress's drawn
    seed), and the epoch's done batches counted in this run's batches. When the place falls inside one of this
    run's batches, the sampler starts there (``loop.resume_start``). ``announce=False`` (a search's trial): the
    layout changes by the search's own doing, so nothing is said about it; errors stay."""
    sampler = order_sampler(data)
    if saved["seed"] is not None and sampler is not None:
        # the checkpoint's order, even when this run was seeded or ordered otherwise
        loop.order = saved.get("order") or {"seed": saved["seed"]}
        sampler.follow(loop.order, mid_epoch=loop.batches_done > 0)
    before, after = _global_batch(saved), _global_batch(now)
    if saved["world_size"] == now["world_size"] and saved["items_per_batch"] == now["items_per_batch"]:
        if saved["accumulate"] != now["accumulate"] and announce:
            _warn_changed(saved, now, loop)
        return
    layout = f"{_describe(saved)} to {_describe(now)}"
    if saved["seed"] is None or sampler is None:
        why = (
            "the checkpoint's run drew its training order from a sampler of its own"
            if saved["seed"] is None
            else "this run's training loader draws its order from a sampler of its own (or is an iterable dataset)"
        )
        if loop.batches_done:
            raise TandemConfigError(
                f"The checkpoint stopped in the middle of epoch {loop.epoch}, and this run changes the data layout "
                f"from {layout}, but {why}: tandem cannot tell which samples the rest of the epoch holds. Resume on "
                f"{saved['world_size']} process(es) with batch size {saved['items_per_batch']}, or resume from a "
                "checkpoint saved at an epoch's end, or let tandem order the data (a DataLoader with shuffle=True or "
                "False and use_distributed_sampler=True)."
            )
        if announce:
            rank_zero_warn(
                f"Resuming with the data layout changed from {layout}: {why}, so the epochs that follow are not "
                "drawn in the order the checkpoint's run would have drawn them."
            )
        return
    consumed = loop.batches_done * before["items"]
    loop.batches_in_earlier_epochs = loop.batches_in_earlier_epochs * before["items"] // after["items"]
    if consumed % after["items"]:  # this run's batches do not tile the consumed items: start inside one
        loader = data.loaders[0]
        per_rank = sampler.remaining(consumed)
        left = per_rank // now["items_per_batch"] if loader.drop_last else math.ceil(per_rank / now["items_per_batch"])
        loop.batches_done = max(0, len(loader) - left)
        loop.resume_start = consumed
    else:
        loop.batches_done = consumed // after["items"]
    if not announce:
        return
    if before["samples"] == after["samples"]:
        rank_zero_info(
            f"Resuming a checkpoint of {layout}: the global batch ({after['samples']}) is kept, so training "
            f"continues at item {consumed} of epoch {loop.epoch} as if never interrupted."
        )
    else:
        _warn_changed(saved, now, loop, consumed)


def _global_batch(layout: dict[str, Any]) -> dict[str, int]:
    items = layout["world_size"] * layout["items_per_batch"]
    return {"items": items, "samples": items * layout["accumulate"]}


def _describe(layout: dict[str, Any]) -> str:
    accumulate = f" x {layout['accumulate']} accumulated" if layout["accumulate"] > 1 else ""
    return f"{layout['world_size']} process(es) x batch {layout['items_per_batch']}{accumulate}"


def _warn_changed(saved: dict[str, Any], now: dict[str, Any], loop: LoopState, consumed: int | None = None) -> None:
    before, after = _global_batch(saved)["samples"], _global_batch(now)["samples"]
    where = f" at item {consumed} of epoch {loop.epoch}" if consumed is not None else ""
    rank_zero_warn(
        f"The global batch changes from {before} ({_describe(saved)}) to {after} ({_describe(now)}): training "
        f"continues{where} from the checkpoint's place in the data, but its steps are not those the checkpoint's run "
        "would have taken. Keep per-device batch x processes x accumulate_grad_batches equal to continue exactly."
    )
