"""Evaluation: one pass over a stage's loaders (validation, test or predict), and the results table that
``validate`` / ``test`` print.

With several loaders, each runs in turn; the step and the batch hooks get ``dataloader_idx`` and values
logged from them are named ``name/dataloader_idx_N`` (Lightning's names). Results come back per loader.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

import torch

from tandem.trainer.data import check_dataloader_idx, takes_batch_idx
from tandem.utilities.logged_values import to_float

if TYPE_CHECKING:
    from tandem.trainer.state import StageNames
    from tandem.trainer.trainer import Trainer

_SUFFIX = "/dataloader_idx_"


def run_evaluation(trainer: Trainer, stage: str, sanity: bool = False) -> Any:
    """One pass over ``stage``'s loaders. Returns one dict of epoch metrics per loader, or the predictions
    (one list per loader when there are several; None when ``return_predictions`` is off)."""
    strategy, metrics, data = trainer.strategy, trainer._metrics, trainer._eval[stage]
    names, module = data.names, strategy.module
    counts = [min(trainer._sanity_steps, n) for n in data.num_batches] if sanity else data.num_batches
    several = check_dataloader_idx(module, names, data.several)
    keep = stage == "predict" and trainer._return_predictions
    was_training = module.training
    module.eval()
    metrics.stage = stage
    trainer.state.stage = "sanity_check" if sanity else stage
    metrics.reset()
    if sanity:
        trainer._call("on_sanity_check_start")
    trainer._call(names.hook("start"))
    trainer._call(names.hook("epoch_start"))
    predictions: list[Any] = []
    with torch.no_grad():
        for index, (loader, count) in enumerate(zip(data.loaders, counts)):
            metrics.dataloader_idx = index if several else None
            outputs = _run_loader(trainer, names, loader, count, (index,) if several else (), keep)
            if keep:  # every rank's predictions, in dataset order (a collective: all ranks run it)
                predictions.append(strategy.gather_predictions(outputs, loader))
    metrics.dataloader_idx = None
    trainer._call(names.hook("epoch_end"))
    epoch_metrics = metrics.epoch_metrics() if stage != "predict" else {}
    trainer._call(names.hook("end"))
    if sanity:
        trainer._call("on_sanity_check_end")
        metrics.clear_published()
    elif epoch_metrics:
        trainer.log_metrics(epoch_metrics)
    module.train(was_training)
    if stage == "predict":
        return (predictions if several else predictions[0]) if keep else None
    return per_dataloader(to_float(metrics.stage_values()), len(data.loaders))


def _run_loader(
    trainer: Trainer, names: StageNames, loader: Any, count: int | float, extra: tuple[int, ...], keep: bool
) -> list[Any]:
    """The batches of one loader; ``extra`` is ``(dataloader_idx,)`` when there are several loaders."""
    strategy, metrics, transfer = trainer.strategy, trainer._metrics, trainer._batch_transfer
    step, start, end = names.step, names.hook("batch_start"), names.hook("batch_end")
    index = extra[0] if extra else 0
    with_batch_idx = takes_batch_idx(getattr(strategy.module, step))
    outputs: list[Any] = []
    for batch_idx, batch in enumerate(strategy.evaluation_batches(loader, count)):  # FSDP keeps ranks in step
        batch = strategy.batch_to_device(batch) if transfer is None else transfer(batch, index)
        metrics.set_batch(batch)
        trainer._call(start, batch, batch_idx, *extra)
        metrics.hook = step
        if with_batch_idx:
            output = strategy.run_step(step, batch, batch_idx, *extra)
        else:
            output = strategy.run_step(step, batch, *extra)
        if keep:
            outputs.append(output)
        trainer._call(end, output, batch, batch_idx, *extra)
    return outputs


def per_dataloader(values: dict[str, float], count: int) -> list[dict[str, float]]:
    """One dict per loader, as Lightning returns them: the loader's own ``/dataloader_idx_N`` values and
    every value without a suffix (logged in epoch-end hooks)."""
    if count <= 1:
        return [values]
    return [{k: v for k, v in values.items() if _SUFFIX not in k or k.endswith(f"{_SUFFIX}{i}")} for i in range(count)]


def format_results(results: list[dict[str, float]], stage: str) -> str:
    """The table ``validate`` / ``test`` print: one row per metric, one column per loader."""
    rows = sorted({name.split(_SUFFIX)[0] for result in results for name in result})
    if not rows:
        return ""
    table = [[f"{stage.capitalize()} metric", *(f"DataLoader {i}" for i in range(len(results)))]]
    for row in rows:
        cells = [row]
        for i, result in enumerate(results):
            value = result.get(row, result.get(f"{row}{_SUFFIX}{i}"))
            cells.append("" if value is None else f"{value:.6g}")
        table.append(cells)
    widths = [max(len(r[c]) for r in table) + 4 for c in range(len(table[0]))]
    try:  # some terminals cannot print the box-drawing line
        bar = "─" if "─".encode(sys.stdout.encoding or "utf-8") else "-"
    except (UnicodeEncodeError, LookupError):
        bar = "-"
    line = bar * min(sum(widths), shutil.get_terminal_size(fallback=(100, 30)).columns)
    lines = [line, "".join(h.center(w) for h, w in zip(table[0], widths)).rstrip(), line]
    lines += ["".join(c.center(w) for c, w in zip(r, widths)).rstrip() for r in table[1:]]
    lines.append(line)
    return os.linesep.join(lines)
