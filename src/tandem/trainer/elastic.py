"""Elastic resume: a checkpoint written by W processes continues on W' (1 included) at the exact next sample.

The training order of an epoch is global: a ``GlobalOrderSampler`` draws it from
what the checkpoint records (the seed and the epoch, or the seed a RandomSampler drew for the epoch), the same on 1
or N processes, and rank r takes items r, r+N, ... of it. Global
batch k is then the block ``order[k·G : (k+1)·G]`` with ``G`` = per-device batch × processes, so a run keeps its
place by counting items of the order consumed (``batches_done · G``), not per-rank positions. A checkpoint saves
the layout it was trained with (``data_layout``, in ``checkpoint["loops"]["data"]``); a resume with another
layout translates its place (``continue_from``):

- the same global batch (G·accumulation kept): the run continues as if never interrupted;
- another global batch: it continues from the items consumed, and says so once;
- an order tandem cannot re-shard (a sampler of the user's on one process, an iterable dataset) resumed mid-epoch
  on another layout: an error naming why, never a silent restart of the epoch.

Several training loaders each have their own order; mid-epoch on another layout each continues at its place
(``Place``: its pass, the items of that pass consumed), counted from the
batches of a whole pass each recorded, and the epoch ends where the resumed layout's mode ends it.
"""

from __future__ import annotations

import math
from typing import Any

from torch.utils.data import BatchSampler, DataLoader

from tandem.strategies.samplers import GlobalOrderSampler
from tandem.trainer.combined_batches import Begun, Place, TrainingBatches
from tandem.trainer.state import LoopState, StageData
from tandem.utilities.data import find_sampler, has_len, unwrapped
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
    ``order_settings``). With several training loaders, the
    last three and the batches of a whole pass for each loader under ``"loaders"``, the mode, and where the epoch
    in progress began when not at its start (``"begun"``, after an elastic resume). None before a fit has training
    data."""
    if data is None or not data.loaders:
        return None
    several = _several(data)
    if several is not None:
        batches = data.loaders[0]
        loaders = [{**_loader_layout(d), "batches": len(d) if has_len(d) else None} for d in several]
        layout = {"world_size": world_size, "accumulate": accumulate, "mode": batches.combined.mode, "loaders": loaders}
        if batches.begun is not None:
            layout["begun"] = batches.begun.record()
        return layout
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
    """``continue_from`` for several training loaders: each follows its own recorded order (a mid-epoch
    resume: the seed of the pass each is in). Another layout mid-epoch (or an epoch begun elsewhere): each loader
    continues at its place of its global order (``_continue_places``)."""
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
    if loop.batches_done and (changed or "begun" in saved):
        _continue_places(saved, now, loop, data.loaders[0], changed)
        if changed and announce:
            _announce_places(saved, now, loop)
        return
    if (changed or saved["accumulate"] != now["accumulate"]) and announce:
        rank_zero_warn(
            f"Resuming several training loaders with the data layout changed (processes {saved['world_size']} -> "
            f"{now['world_size']}, accumulate_grad_batches {saved['accumulate']} -> {now['accumulate']}, or a "
            "loader's batch size): training continues from the next epoch's start, but its steps are not those the "
            "checkpoint's run would have taken."
        )


def _continue_places(
    saved: dict[str, Any], now: dict[str, Any], loop: LoopState, batches: TrainingBatches, changed: bool
) -> None:
    """Several loaders mid-epoch: where each stood when the checkpoint was saved (its pass, the items of its global
    order consumed, all ranks together), counted on the saved layout; each continues there on this one, and the
    epoch ends where this layout's mode ends it: ``min_size`` when a loader's pass ends, ``max_size`` when the
    last one's does, ``max_size_cycle`` when every loader has ended a pass (the shorter ones starting again).
    The epoch's done batches become this layout's count that leaves as many batches as the places have left."""
    mode = saved.get("mode", batches.combined.mode)
    if changed:
        _check_reshardable(saved, batches, loop)
    if any(layout.get("batches") is None for layout in saved["loaders"]):
        raise TandemConfigError(
            f"The checkpoint stopped in the middle of epoch {loop.epoch} with several training loaders and was "
            "written by an earlier tandem, which did not record how long each loader's pass was: tandem cannot tell "
            f"where each loader stands on another layout. Resume on {saved['world_size']} process(es) with the "
            "checkpoint's batch sizes, or from a checkpoint saved at an epoch's end."
        )
    lengths = [layout["batches"] for layout in saved["loaders"]]
    if "begun" in saved:
        begun = Begun.from_record(saved["begun"])
    else:
        begun = Begun.start(lengths, [saved["world_size"] * layout["items_per_batch"] for layout in saved["loaders"]])
    places = begun.places_at(loop.batches_done, lengths, cycling=mode == "max_size_cycle")
    left = [_batches_left(loader, place) for loader, place in zip(batches.loaders, places)]
    step = tuple(now["world_size"] * layout["items_per_batch"] for layout in now["loaders"])
    if changed:  # this layout's batches: as many done as leave the places' batches to go
        lengths_now, mode_now = [len(loader) for loader in batches.loaders], batches.combined.mode
        if mode_now == "min_size":
            to_go = min(left)
        elif mode_now == "max_size":
            to_go = max(left)
        else:  # max_size_cycle: until every loader has ended a pass; those that have are cycling
            to_go = max((n for n, place in zip(left, places) if place.cycle == 0), default=0)
        whole = _EPOCH_LENGTH[mode_now](lengths_now)
        loop.batches_in_earlier_epochs = loop.batches_in_earlier_epochs * whole // max(1, _EPOCH_LENGTH[mode](lengths))
        loop.batches_done = max(0, whole - to_go)
    batches.pending = Begun(loop.batches_done, tuple(places), tuple(left), step)


#: an epoch's batches from each loader's batches in a pass, by mode
_EPOCH_LENGTH = {"min_size": min, "max_size": max, "max_size_cycle": max}


def _batches_left(loader: DataLoader, place: Place) -> int:
    """This process's batches of ``loader`` left in a pass at ``place`` (0: the pass has ended)."""
    if place.consumed is None:
        return 0
    sampler = _global_order(loader)
    assert sampler is not None
    per_rank, size = sampler.remaining(place.consumed), _loader_layout(loader)["items_per_batch"]
    return per_rank // size if loader.drop_last else math.ceil(per_rank / size)


def _check_reshardable(saved: dict[str, Any], batches: TrainingBatches, loop: LoopState) -> None:
    """Each loader's order must be one tandem draws again on any layout, or the places mean nothing there."""
    for i, (layout, loader) in enumerate(zip(saved["loaders"], batches.loaders)):
        if layout["seed"] is None or _global_order(loader) is None or batches.skippables is None:
            why = (
                "the checkpoint's run drew its order from a sampler of its own"
                if layout["seed"] is None
                else "this run draws its order from a sampler of its own (or an iterable dataset)"
            )
            raise TandemConfigError(
                f"The checkpoint stopped in the middle of epoch {loop.epoch} with several training loaders, and this "
                f"run changes the data layout (processes {saved['world_size']} -> the run's, or a loader's batch "
                f"size), but for training loader {i} {why}: tandem cannot tell which of its samples the rest of the "
                f"epoch holds. Resume on {saved['world_size']} process(es) with the checkpoint's batch sizes, or from "
                "a checkpoint saved at an epoch's end, or let tandem order that loader's data (a DataLoader with "
                "shuffle=True or False and use_distributed_sampler=True)."
            )


def _announce_places(saved: dict[str, Any], now: dict[str, Any], loop: LoopState) -> None:
    pairs = list(zip(saved["loaders"], now["loaders"]))
    kept = all(
        saved["world_size"] * a["items_per_batch"] == now["world_size"] * b["items_per_batch"] for a, b in pairs
    ) and (saved["accumulate"] == now["accumulate"])
    sizes = ", ".join(f"{a['items_per_batch']} -> {b['items_per_batch']}" for a, b in pairs)
    layout = f"processes {saved['world_size']} -> {now['world_size']}, batch sizes {sizes}"
    if kept:
        rank_zero_info(
            f"Resuming several training loaders in the middle of epoch {loop.epoch} on another layout ({layout}): "
            "every loader's global batch is kept, so each continues at its next item as if never interrupted."
        )
    else:
        rank_zero_warn(
            f"Resuming several training loaders in the middle of epoch {loop.epoch} on another layout ({layout}, "
            f"accumulate_grad_batches {saved['accumulate']} -> {now['accumulate']}): each loader continues at its "
            "next item of its order, but the steps are not those the checkpoint's run would have taken. Keep each "
            "loader's batch size x processes (and accumulate_grad_batches) to continue exactly."
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
