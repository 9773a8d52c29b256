"""Evaluation: the loop that runs one pass over a stage's loaders (validation, test or predict), and the results table that
``validate`` / ``test`` print.

With several loaders, each runs in turn; the step and the batch hooks get ``dataloader_idx`` and values
logged from them are named ``name/dataloader_idx_N`` (Lightning's names). Results come back per loader.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from tandem.module import TrainingModule, is_overridden
from tandem.strategies.side_channel import placed
from tandem.trainer.data import check_dataloader_idx, takes_batch_idx
from tandem.trainer.dataloader_iter import DataLoaderIter, evaluation_source, warn_experimental
from tandem.trainer.hooks import running_hook
from tandem.trainer.logging.entry import LOADER_SUFFIX
from tandem.trainer.profiling import NEXT_BATCH, StrategyCalls, timed_batches
from tandem.trainer.state import EVAL_STAGES, LoopState, StageData
from tandem.utilities.data import set_sampler_epoch
from tandem.utilities.logged_values import to_float
from tandem.utilities.signature import takes_dataloader_iter

if TYPE_CHECKING:
    from tandem.trainer.loops import LoopContext
    from tandem.trainer.state import StageNames


class EvaluationLoop:
    """Runs the evaluation stages and owns their records (one ``StageData`` per stage: loaders, counts,
    the shape the user gave them in).

    Args:
        context: what the loops work with (strategy, hooks, collector, config, log sink).
        training: the training loop's state: the epoch and global step a hang's report shows.
    """

    def __init__(self, context: LoopContext, training: LoopState | None = None) -> None:
        self.context, self._training = context, training or LoopState()
        self.records: dict[str, StageData] = {fn: StageData(names) for fn, names in EVAL_STAGES.items()}
        self._source: tuple[str, Callable[[], StageData]] | None = None  # the run's stage and how to build its record
        self._loaded_at: float | None = None  # the epoch its loaders were built in (-inf: in a sanity check that
        # does not count, Lightning's rule); None: not built yet this run
        self.batch_transfer: Any = None  # the batch-transfer hooks of the module or DataModule, when overridden
        self.return_predictions = True
        # Batches run per (stage, loader) since the Trainer's entry point began, not counting the sanity check: the
        # step of the ``on_step`` values an evaluation batch logs (Lightning's, counted across a fit's validations).
        self.seen_batches: dict[tuple[str, int], int] = {}
        self._at = [0]  # the batch this rank evaluates, for a hang's report

    def attach(self, stage: str | None, load: Callable[[], StageData] | None) -> None:
        """The run's evaluation stage and how to build its record (asking for its loaders); nothing is asked for
        yet. Its record is emptied (the other stages keep theirs). ``attach(None, None)``: the run is over."""
        self._source, self._loaded_at = (stage, load) if stage is not None and load is not None else None, None
        if stage is not None:
            self.records[stage] = StageData(EVAL_STAGES[stage])

    def forget(self, stage: str) -> None:
        """``stage``'s loaders are asked for again where the run next needs them."""
        if self._source is not None and self._source[0] == stage:
            self.records[stage], self._loaded_at = StageData(EVAL_STAGES[stage]), None

    def load(self, stage: str, epoch: int | None = None, sanity: bool = False, counts: bool = True) -> None:
        """Ask for ``stage``'s loaders if this run has not yet, or, in a fit (``epoch``: the epoch in progress), if
        ``reload_dataloaders_every_n_epochs`` says so (Lightning's rule: a sanity check's asking counts only when
        its epoch validates, ``counts``). Outside a fit, the samplers get the fit's epoch, once (Lightning's)."""
        if self._source is None or self._source[0] != stage:
            return
        if getattr(self.context.config, EVAL_STAGES[stage].limit) == 0:  # the stage is off: no loader asked for
            return
        every, loaded_at = self.context.config.reload_dataloaders_every_n_epochs, self._loaded_at
        fitting = epoch is not None
        if loaded_at is not None and not (epoch is not None and every and epoch - loaded_at >= every):
            return
        self.records[stage] = self._source[1]()
        self._loaded_at = epoch if fitting and (counts or not sanity) else -math.inf
        if not fitting:
            for loader in self.records[stage].loaders:
                set_sampler_epoch(loader, self._training.epoch)

    def run(self, stage: str, sanity: bool = False, epoch: int | None = None, counts: bool = True) -> Any:
        """One pass over ``stage``'s loaders, asked for first where due (see ``load``; ``epoch``: the fit's epoch
        in progress, None outside a fit). Returns one dict of epoch metrics per loader, or the predictions (one list
        per loader when there are several; None when ``return_predictions`` is off); nothing (``[]``, or None for
        predict) when there is nothing to evaluate, and then no evaluation hook runs (Lightning's skip)."""
        context = self.context
        strategy, metrics, hooks = context.strategy, context.metrics, context.hooks
        training, at, place = self._training, self._at, "sanity_check" if sanity else stage
        at[0] = 0
        with hooks.running(place), placed(lambda: (place, training.epoch, at[0], training.global_step)):
            metrics.reset()
            if sanity:
                hooks.call("on_sanity_check_start")
            self.load(stage, epoch, sanity, counts)  # Lightning's order: in the sanity check, before the module's eval
            data = self.records[stage]
            if self._nothing_to_run(data, sanity):
                if sanity:
                    hooks.call("on_sanity_check_end")
                return None if stage == "predict" else []
            if epoch is not None:  # as Lightning: in a fit, each pass gives the samplers the epoch in progress
                for loader in data.loaders:
                    set_sampler_epoch(loader, epoch)
            strategy.before_evaluation(fitting=epoch is not None)
            return self._run_stage(stage, data, sanity)

    def _nothing_to_run(self, data: StageData, sanity: bool) -> bool:
        """No loaders, or none with a batch to run. Under several processes only what every rank agrees on counts
        (a rank's share of a small dataset may be empty while the others' are not): ``limit_*_batches=0``."""
        if not data.loaders:
            return True
        config = self.context.config
        if sanity and config.num_sanity_val_steps == 0 or getattr(config, data.names.limit) == 0:
            return True
        return self.context.strategy.world_size == 1 and data.total_batches == 0

    def _run_stage(self, stage: str, data: StageData, sanity: bool) -> Any:
        context = self.context
        strategy, metrics, hooks = context.strategy, context.metrics, context.hooks
        names = data.names
        counts = [min(context.config.sanity_steps, n) for n in data.num_batches] if sanity else data.num_batches
        module = context.module
        takes_iter = takes_dataloader_iter(getattr(module, names.step))  # the step takes its batches
        if takes_iter:
            warn_experimental(names.step)
        several = check_dataloader_idx(module, names, data.several, step=not takes_iter)
        keep = stage == "predict" and self.return_predictions
        model = strategy.model if strategy.model is not None else module
        modes = ModuleModes(model)  # every submodule's own mode, given back after the stage (Lightning's)
        # as Lightning: the first loader's iterator exists before the mode hook and on_<stage>_start, so that what
        # its creation draws from the RNG (a DataLoader's base seed) comes at Lightning's point in the sequence
        first = strategy.evaluation_batches(data.loaders[0], counts[0]) if data.loaders else None
        call_module_hook(module, names.hook("model_eval"))
        hooks.call(names.hook("start"))
        hooks.call(names.hook("epoch_start"))
        predictions: list[Any] = []
        results_of: list[int] | range = range(len(data.loaders))  # the loaders that get a results dict
        step_logs = not sanity and stage != "predict"  # with loggers or without, as Lightning
        with torch.no_grad():
            if takes_iter:  # the steps take the batches: each rank's predictions, not gathered (Lightning's)
                outputs, results_of = self._run_iterator(names, data.loaders, counts, first, several, keep, step_logs)
                predictions = outputs
            else:
                for index, (loader, count) in enumerate(zip(data.loaders, counts)):
                    metrics.dataloader_idx = index if several else None
                    batches = first if index == 0 and first is not None else strategy.evaluation_batches(loader, count)
                    outputs = self._run_loader(names, batches, (index,) if several else (), keep, step_logs)
                    if keep:  # every rank's predictions, in dataset order (a collective: all ranks run it)
                        predictions.append(strategy.gather_predictions(outputs, loader))
        metrics.dataloader_idx = None
        # as Lightning: the epoch's values are published before the epoch-end hooks (which read them in
        # callback_metrics), and what those hooks log is added after them
        epoch_metrics = metrics.epoch_metrics() if stage != "predict" else {}
        hooks.call(names.hook("epoch_end"))
        if stage != "predict" and names.hook("epoch_end") in hooks.registered:  # alike on every rank
            epoch_metrics.update(metrics.epoch_metrics())
        if epoch_metrics and not sanity:  # as Lightning: written before on_<stage>_end (its hooks find them)
            context.sink.log_metrics(epoch_metrics)
        hooks.call(names.hook("end"))
        back_to_training = names.hook("model_train")  # an override takes over from the recorded modes
        if stage != "predict" and is_overridden(module, back_to_training):
            call_module_hook(module, back_to_training)
        else:
            modes.restore(model)
        metrics.reset_metric_objects()  # as Lightning, after on_<stage>_end: its hooks may read them
        if sanity:
            hooks.call("on_sanity_check_end")
            metrics.clear_published()
        if stage == "predict":
            return (predictions if several else predictions[0]) if keep else None
        if len(data.loaders) <= 1:
            return [to_float(metrics.stage_values())]
        return [to_float(metrics.stage_values(index)) for index in results_of]

    def _run_loader(
        self, names: StageNames, batches: Iterator[Any], extra: tuple[int, ...], keep: bool, step_logs: bool
    ) -> list[Any]:
        """The ``batches`` of one loader (``Strategy.evaluation_batches``); ``extra`` is ``(dataloader_idx,)``
        when there are several loaders. With ``step_logs``, each batch's ``on_step`` values go to the loggers at the
        loader's own batch count."""
        strategy, metrics, hooks, sink = (
            self.context.strategy,
            self.context.metrics,
            self.context.hooks,
            self.context.sink,
        )
        transfer, profiler = self.batch_transfer, self.context.profiler
        step, start, end = names.step, names.hook("batch_start"), names.hook("batch_end")
        index = extra[0] if extra else 0
        with_batch_idx = takes_batch_idx(getattr(strategy.module, step))
        outputs: list[Any] = []
        run_step = strategy.run_step
        if profiler is not None:  # the profiling variant, chosen once per loader
            batches = timed_batches(batches, profiler, NEXT_BATCH[names.name])
            run_step = StrategyCalls(strategy, profiler).run_step
        at = self._at
        for batch_idx, batch in enumerate(batches):
            at[0] = batch_idx
            batch = strategy.batch_to_device(batch) if transfer is None else transfer(batch, index)
            metrics.set_batch(batch)
            hooks.call(start, batch, batch_idx, *extra)
            with running_hook(step):
                output = run_step(step, batch, batch_idx, *extra) if with_batch_idx else run_step(step, batch, *extra)
            if keep:
                outputs.append(output)
            hooks.call(end, output, batch, batch_idx, *extra)
            if step_logs:
                seen = (names.name, index)
                sink.log_metrics(metrics.evaluation_step_values(), step=self.seen_batches.get(seen, 0))
                self.seen_batches[seen] = self.seen_batches.get(seen, 0) + 1
        return outputs

    def _run_iterator(
        self,
        names: StageNames,
        loaders: list[Any],
        counts: list[int | float],
        first: Iterator[Any] | None,
        several: bool,
        keep: bool,
        step_logs: bool,
    ) -> tuple[list[list[Any]], list[int]]:
        """The stage's batches for a ``*_step(self, dataloader_iter)`` (see ``tandem.trainer.dataloader_iter``):
        the step runs again while the loaders' batches last, and may take them across a loader's end. The batch
        hooks get the last batch taken and its indices (before the step: the one the previous step took last; the
        step's values are logged under that loader's name, as Lightning's). Returns the outputs kept, per loader
        of the last batch each step took, and the loaders a step began in (those get a results dict: Lightning's)."""
        strategy, metrics, hooks, sink = (
            self.context.strategy,
            self.context.metrics,
            self.context.hooks,
            self.context.sink,
        )
        profiler = self.context.profiler
        step, start, end = names.step, names.hook("batch_start"), names.hook("batch_end")
        run_step = strategy.run_step if profiler is None else StrategyCalls(strategy, profiler).run_step

        def per_loader() -> Iterator[Iterator[Any]]:
            for index, (loader, count) in enumerate(zip(loaders, counts)):
                batches = first if index == 0 and first is not None else strategy.evaluation_batches(loader, count)
                yield batches if profiler is None else timed_batches(batches, profiler, NEXT_BATCH[names.name])

        taken = DataLoaderIter(evaluation_source(per_loader()), sum(counts))
        outputs: list[list[Any]] = [[] for _ in loaders]
        began_in: list[int] = []
        while not taken.done:
            self._at[0] = taken.fetched
            index = taken.dataloader_idx
            if not began_in or began_in[-1] != index:
                began_in.append(index)
            extra = (index,) if several else ()
            metrics.dataloader_idx = index if several else None
            metrics.set_batch(taken.batch)
            hooks.call(start, taken.batch, taken.batch_idx, *extra)
            try:
                with running_hook(step):
                    output = run_step(step, taken)
            except StopIteration:  # let out of the step: the stage's data is used up (Lightning's)
                break
            if keep:
                outputs[taken.dataloader_idx].append(output)
            hooks.call(end, output, taken.batch, taken.batch_idx, *((taken.dataloader_idx,) if several else ()))
            if step_logs:
                seen = (names.name, index)
                sink.log_metrics(metrics.evaluation_step_values(), step=self.seen_batches.get(seen, 0))
                self.seen_batches[seen] = self.seen_batches.get(seen, 0) + 1
        return outputs, began_in


class ModuleModes:
    """The ``training`` flag of every submodule of ``model``, recorded now, to give back with ``restore``:
    a submodule the user put in eval mode (a frozen BatchNorm, an EMA copy) stays there through the fit."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.modes = {name: sub.training for name, sub in model.named_modules()}

    def restore(self, model: torch.nn.Module) -> None:
        """Each submodule recorded gets its mode back (one added since keeps its own)."""
        modes = self.modes
        for name, sub in model.named_modules():
            mode = modes.get(name)
            if mode is not None:
                sub.training = mode


def call_module_hook(module: TrainingModule, name: str) -> Any:
    """The module's hook ``name`` (one the callbacks do not have), marked as the hook running."""
    fn = getattr(module, name, None)
    if not callable(fn):  # set to None on the instance: not called
        return None
    with running_hook(name):
        return fn()


def format_results(results: list[dict[str, float]], stage: str) -> str:
    """The table ``validate`` / ``test`` print: one row per metric, one column per loader."""
    rows = sorted({name.split(LOADER_SUFFIX)[0] for result in results for name in result})
    if not rows:
        return ""
    table = [[f"{stage.capitalize()} metric", *(f"DataLoader {i}" for i in range(len(results)))]]
    for row in rows:
        cells = [row]
        for i, result in enumerate(results):
            value = result.get(row, result.get(f"{row}{LOADER_SUFFIX}{i}"))
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
