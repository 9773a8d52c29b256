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
from tandem.trainer.combined_batches import TrainingBatches
from tandem.trainer.state import LoopState, StageData
from tandem.utilities.data import find_sampler, unwrapped
from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.rank_zero import rank_zero_info, rank_zero_warn


def order_sampler(data: StageData | None) -> GlobalOrderSampler | None:
    """The training loader's global-order sampler, if it draws one (None with several training loaders)."""
    loader = data.loaders[0] if data is not None and data.loaders else None
    return _global_order(loader)


def _global_order(loader: Any) -> GlobalOrderSampler | None:
    sampler = find_sampler(loader) if isinstance(loader, DataLoader) else None
    return sampler if isinstance(sampler, GlobalOrderSampler) else None


def _several(data: StageData | None) -> list[Any] | None:
    """The training loaders of a fit that has several (read as one by TrainingBatches), else None."""
    loader = data.loaders[0] if data is not None and data.loaders else None
    return loader.loaders if isinstance(loader, TrainingBatches) else None


def data_layout(data: StageData | None, world_size: int, accumulate: int) -> dict[str, Any] | None:
    """How the training data is laid out: processes, items of the order per batch of one process
    (its batch size; 1 when the items are whole batches), accumulation, the order's seed (None: the order
    is the loader's own, which tandem cannot re-shard) and what else the order is made from (``order``: see
    :meth:`~tandem.strategies.samplers.GlobalOrderSampler.order_settings`). With several training loaders, the
    last three for each loader under ``"loaders"``. None before a fit has training data."""
    if data is None or not data.loaders:
        return None
    several = _several(data)
    if several is not None:
        return {"world_size": world_size, "accumulate": accumulate, "loaders": [_loader_layout(d) for d in several]}
    return {"world_size": world_size, "accumulate": accumulate, **_loader_layout(data.loaders[0])}


def _loader_layout(loader: Any) -> dict[str, Any]:
    sampler = _global_order(loader)
    batches = unwrapped(getattr(loader, "batch_sampler", None))
    return {
        "items_per_batch": batches.batch_size if type(batches) is BatchSampler else 1,
        "seed": sampler.seed if sampler is not None else None,
        "order": sampler.order_settings() if sampler is not None else None,
    }


def follow_order(data: StageData, order: Any) -> None:
    """A rebuilt training loader (or each of several) draws the checkpoint's order (``LoopState.order``)."""
    several = _several(data)
    pairs = zip(several, order) if several is not None and isinstance(order, list) else [(data.loaders[0], order)]
    for loader, settings in pairs:
        sampler = _global_order(loader)
        if sampler is not None and settings is not None:
            sampler.follow(settings, mid_epoch=False)


def _continue_several(
    saved: dict[str, Any], now: dict[str, Any], loop: LoopState, data: StageData, announce: bool
) -> None:
    """:func:`continue_from` for several training loaders: each follows its own recorded order (a mid-epoch
    resume: the seed of the pass each is in). Another layout continues only from an epoch's end."""
    several = _several(data) or []
    if len(saved.get("loaders", ())) != len(several):
        raise TandemConfigError(
            f"The checkpoint was trained on {len(saved.get('loaders', [1]))} training loader(s) and this fit has "
            f"{len(several) or 1}: resume with the same training loaders (the same list or dict) as the checkpoint's run."
        )
    loop.order = [
        layout["order"] or ({"seed": layout["seed"]} if layout["seed"] is not None else None)
        for layout in saved["loaders"]
    ]
    for loader, settings in zip(several, loop.order):
        sampler = _global_order(loader)
        if sampler is not None and settings is not None:
            sampler.follow(settings, mid_epoch=loop.batches_done > 0)
    changed = saved["world_size"] != now["world_size"] or any(
        a["items_per_batch"] != b["items_per_batch"] for a, b in zip(saved["loaders"], now["loaders"])
    )
    if changed and loop.batches_done:
        raise TandemConfigError(
            f"The checkpoint stopped in the middle of epoch {loop.epoch} with several training loaders, and this run "
            f"changes the data layout (processes {saved['world_size']} -> {now['world_size']}, or a loader's batch "
            "size): tandem continues several loaders mid-epoch only on the same layout. Resume on "
            f"{saved['world_size']} process(es) with the same batch sizes, or from a checkpoint saved at an epoch's end."
        )
    if (changed or saved["accumulate"] != now["accumulate"]) and announce:
        rank_zero_warn(
            f"Resuming several training loaders with the data layout changed (processes {saved['world_size']} -> "
            f"{now['world_size']}, accumulate_grad_batches {saved['accumulate']} -> {now['accumulate']}, or a "
            "loader's batch size): training continues from the next epoch's start, but its steps are not those the "
            "checkpoint's run would have taken."
        )


def continue_from(
    saved: dict[str, Any], now: dict[str, Any], loop: LoopState, data: StageData, announce: bool = True
) -> None:
    """Put ``loop`` (restored from a checkpoint trained with layout ``saved``) at the same place of the global
    order under layout ``now``: the checkpoint's order (its seed, how it shuffles, the epoch in progress's drawn
    seed), and the epoch's done batches counted in this run's batches. When the place falls inside one of this
    run's batches, the sampler starts there (``loop.resume_start``). ``announce=False`` (a search's trial): the
    layout changes by the search's own doing, so nothing is said about it; errors stay."""
    if "loaders" in saved or "loaders" in now:
        if "loaders" not in now:
            raise TandemConfigError(
                f"The checkpoint was trained on {len(saved['loaders'])} training loaders and this fit has one: resume "
                "with the same training loaders (the same list or dict) as the checkpoint's run."
            )
        _continue_several(saved, now, loop, data, announce)
        return
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
