"""Rolling back a bad step: ``Trainer(on_nonfinite="rollback")`` (or ``on_nonfinite=Rollback(...)``).

tandem keeps a copy of the training state in memory, taken at checks that found every loss clean: the module's
parameters and buffers, every optimizer and scheduler, the precision's scaler, the loop's counters and data
position, the epoch's logged sums and the RNG states. When a check finds a bad loss on any rank, every rank
puts that copy back and trains the batches since it again, without the batch that produced the bad loss.

Where tandem looks, and what it costs:

- **Each batch** records its loss on the device (a reference, no copy, no read).
- **At publishing steps** (every ``log_every_n_steps``, where tandem reads values anyway) each rank reads the
  losses it recorded since the last check, in one read; they travel to every rank with the logged values'
  reduction (as sums, when every loss was finite: each batch's mean over the ranks; otherwise every rank's, in a
  gathering). Every rank then finds the same first bad batch in the same list, so all decide alike.
- **At the end of each epoch's batches**, the losses not yet checked are read and gathered the same way (one
  gathering per epoch, before the epoch's validation and hooks).

A batch is bad when its loss is NaN or inf on some rank, or, with ``spike_zscore``, when its loss (the mean
over the ranks) lies more than ``spike_zscore`` standard deviations above the mean of the ``spike_window``
clean losses before it (Lightning's ``SpikeDetection`` callback stops the run instead). Only the first bad batch
of the window is skipped: the bad losses after it come from the parameters it spoiled, which the rollback takes
back. A replay that finds a bad batch again skips that one too; ``max_in_a_row`` rollbacks without a clean check
between them end the run with a [`NonFiniteError`][tandem.utilities.exceptions.NonFiniteError] listing them.

A rollback goes back at most to the start of the current epoch (a copy is taken there too): the epoch's end
(validation, callbacks, checkpoints) is never undone. Callbacks' own state is not rolled back either, and the
hooks of the batches replayed run again. A skipped batch keeps its place in the epoch: the next batch has the
next ``batch_idx``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from tandem.utilities.exceptions import NonFiniteError, out_of_range
from tandem.utilities.seed import capture_rng_state

if TYPE_CHECKING:
    from tandem.strategies.strategy import Strategy
    from tandem.trainer.logging.collector import MetricCollector
    from tandem.trainer.optimization.base import Optimization
    from tandem.trainer.state import LoopState

#: a rank's losses since the last check: (batch_idx, loss or None for a batch that returned no loss)
Window = list[tuple[int, "float | None"]]


@dataclass(frozen=True)
class Rollback:
    """How ``Trainer(on_nonfinite=Rollback(...))`` rolls back; ``on_nonfinite="rollback"`` is ``Rollback()``.

    Args:
        spike_zscore: also roll back a loss spike: a batch whose loss (the mean over the ranks) is more than this
            many standard deviations above the mean of the ``spike_window`` clean losses before it (the standard
            deviation counts as at least 1% of that mean, so a flat stretch does not make every wiggle a spike).
            None (the default): only a NaN or inf loss rolls back.
        spike_window: how many recent clean losses the spike rule compares with; it acts once it has that many.
        every_n_checks: copy the training state at every n-th clean check (the checks are the publishing steps,
            every ``log_every_n_steps``; a copy is also taken at each epoch's start). Higher: less time spent
            copying, a longer replay after a rollback.
        max_in_a_row: this many rollbacks without a clean check between them end the run with a
            ``NonFiniteError`` listing them.

    Example:
        ```python
        trainer = Trainer(on_nonfinite=Rollback(spike_zscore=6.0, spike_window=50), log_every_n_steps=10)
        ```
    """

    spike_zscore: float | None = None
    spike_window: int = 20
    every_n_checks: int = 1
    max_in_a_row: int = 3

    def __post_init__(self) -> None:
        if self.spike_zscore is not None and not self.spike_zscore > 0:
            raise out_of_range("Rollback(spike_zscore)", self.spike_zscore, "a number > 0, or None for no spike rule")
        for name in ("spike_window", "every_n_checks", "max_in_a_row"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise out_of_range(f"Rollback({name})", value, "an int >= 1")


@dataclass(frozen=True)
class RollbackRecord:
    """One rollback (``trainer.rollbacks``): found at the check of global ``step`` in ``epoch``; the epoch's batch
    ``batch_idx`` (on every rank) had a bad ``loss`` (NaN or inf, or a ``spike``), said in words by ``reason``; the
    state of ``restored_step`` came back and the replay left out ``skipped`` (this batch and any skipped before
    from the same snapshot)."""

    step: int
    epoch: int
    batch_idx: int
    loss: float
    spike: bool
    reason: str
    restored_step: int = -1
    skipped: tuple[int, ...] = ()

    def __str__(self) -> str:
        batches = ", ".join(str(b) for b in self.skipped)
        return (
            f"found at global step {self.step} (epoch {self.epoch}): {self.reason}; back to step "
            f"{self.restored_step}, replaying without batch(es) {batches}"
        )

    def metrics(self) -> dict[str, float]:
        """What the loggers get for it, at the step it was found: the batch skipped, the step restored, the loss
        and why (``rollback/spike``: 1 for a spike, 0 for NaN or inf)."""
        return {
            "rollback/skipped_batch": float(self.batch_idx),
            "rollback/restored_step": float(self.restored_step),
            "rollback/loss": float(self.loss),
            "rollback/spike": float(self.spike),
        }


@dataclass
class _Snapshot:
    """The training state at a clean check (tensors copied; taken and restored by ``RollbackGuard``)."""

    loop: dict[str, Any]
    rng: dict[str, Any]
    metrics: dict[str, Any]
    tensors: list[torch.Tensor]
    optimizers: list[tuple[Any, list[Any]]]
    schedulers: list[dict[str, Any]]
    precision: dict[str, Any]
    losses: list[float]  # the spike rule's recent clean losses
    skipped: set[int] = field(default_factory=set)  # batches left out of replays from this snapshot


class RollbackGuard:
    """Records each batch's loss, finds the first bad batch of each checked window (alike on every rank), keeps
    the snapshot and rolls back to it. The fit loop calls it; see the module docstring.

    Args:
        settings: the user's [`Rollback`][tandem.trainer.Rollback].
        strategy: the Trainer's (under a float16 GradScaler, which skips the steps whose gradients hold inf or NaN
            itself, a non-finite loss is the scaler's business and not rolled back).
    """

    def __init__(self, settings: Rollback, strategy: Strategy) -> None:
        self.settings, self._strategy = settings, strategy
        self.history: list[RollbackRecord] = []  # every rollback of the current fit
        self.paused = False  # a search that diverges on purpose (the tuner's) runs unguarded
        self._window: list[tuple[int, torch.Tensor | None]] = []  # this rank's batches since the last check
        self.reset()

    def reset(self) -> None:
        """A new fit: nothing recorded, no snapshot, no history."""
        self.history.clear()
        self._window.clear()
        self._losses: list[float] = []  # the spike rule's recent clean (mean) losses
        self._snapshot: _Snapshot | None = None
        self._clean_checks = 0  # since the latest snapshot
        self._in_a_row = 0

    # ------------------------------------------------------------------ every batch
    def recording(self, optimize: Callable[[Any, int], tuple[Any, Any]]) -> Callable[[Any, int], tuple[Any, Any]]:
        """``optimize`` (the optimization of a batch), recording each batch's loss on its device."""
        window = self._window

        def run(batch: Any, batch_idx: int) -> tuple[Any, Any]:
            output, loss = optimize(batch, batch_idx)
            window.append((batch_idx, None if loss is None else loss.detach()))
            return output, loss

        return run

    # ------------------------------------------------------------------ checks
    @property
    def unchecked(self) -> bool:
        """Batches ran since the last check (the same on every rank: every rank records every batch)."""
        return bool(self._window)

    def read(self) -> Window:
        """This rank's losses since the last check, read in one go (the check's one host sync)."""
        window, self._window[:] = list(self._window), []
        tensors = [loss for _, loss in window if loss is not None]
        if tensors and any(t.dim() for t in tensors):  # a loss that is not a scalar: its sum
            tensors = [t.sum() for t in tensors]
        values = iter(torch.stack(tensors).float().tolist() if tensors else [])
        return [(batch_idx, None if loss is None else next(values)) for batch_idx, loss in window]

    def decide(self, windows: list[Window], step: int, epoch: int) -> RollbackRecord | None:
        """The first bad batch of the windows every rank read (rank order: the same list everywhere; or one window
        of the ranks' mean losses, when every loss was finite), or None. A clean window's losses join the spike
        rule's recent losses."""
        if self.paused:
            return None
        settings, recent = self.settings, self._losses
        scaled = self._strategy.precision.scaler is not None
        for position, (batch_idx, _) in enumerate(windows[0]):
            values = [window[position][1] for window in windows]
            bad = [(rank, v) for rank, v in enumerate(values) if v is not None and not math.isfinite(v)]
            if bad and not scaled:
                where = f" on rank(s) {[rank for rank, _ in bad]}" if len(windows) > 1 else ""
                loss = bad[0][1]
                reason = f"the loss of batch {batch_idx} was {loss}{where}"
                return RollbackRecord(step, epoch, batch_idx, loss, False, reason)
            given = [v for v in values if v is not None and math.isfinite(v)]
            if len(given) < len(values) - values.count(None) or not given:  # the scaler's skipped step
                continue
            loss = sum(given) / len(given)
            if settings.spike_zscore is not None and len(recent) >= settings.spike_window:
                mean = math.fsum(recent) / len(recent)  # not the statistics module: it pulls decimal at import
                deviation = math.sqrt(math.fsum((v - mean) ** 2 for v in recent) / len(recent))
                spread = max(deviation, 0.01 * abs(mean), 1e-12)
                zscore = (loss - mean) / spread
                if zscore > settings.spike_zscore:
                    reason = (
                        f"the loss of batch {batch_idx} spiked to {loss:.6g}, {zscore:.1f} standard deviations above "
                        f"the mean {mean:.6g} of the {len(recent)} before (spike_zscore={settings.spike_zscore})"
                    )
                    return RollbackRecord(step, epoch, batch_idx, loss, True, reason)
            recent.append(loss)
            del recent[: -settings.spike_window]
        self._in_a_row = 0
        return None

    # ------------------------------------------------------------------ snapshots
    def snapshot_due(self) -> bool:
        """After a clean check: is this the check to copy the state at (every ``every_n_checks``-th)?"""
        self._clean_checks += 1
        return self._snapshot is None or self._clean_checks >= self.settings.every_n_checks

    def take(self, strategy: Strategy, optimization: Optimization, loop: LoopState, metrics: MetricCollector) -> None:
        """Copy the training state (at a clean check, or an epoch's start). Copies go into the previous
        snapshot's tensors when their shapes match (no new memory after the first)."""
        old = self._snapshot
        tensors = _module_tensors(strategy.module)
        if old is not None and _same_shapes(old.tensors, tensors):
            torch._foreach_copy_(old.tensors, tensors)
            kept = old.tensors
        else:
            kept = [t.clone() for t in tensors]
        optimizers = [
            _copy_tree(o.state_dict(), old.optimizers[i] if old is not None and i < len(old.optimizers) else None)
            for i, o in enumerate(optimization.optimizers)
        ]
        self._snapshot = _Snapshot(
            loop=loop.state_dict(),  # plain values and the epoch's RNG state, which is replaced, never changed
            rng=capture_rng_state(),
            metrics=metrics.state_dict(),  # its tensors are replaced, never changed in place
            tensors=kept,
            optimizers=optimizers,
            schedulers=[copy.deepcopy(c.scheduler.state_dict()) for c in optimization.lr_scheduler_configs],
            precision=copy.deepcopy(strategy.precision.state_dict()),
            losses=list(self._losses),
        )
        self._clean_checks = 0

    def roll_back(
        self,
        found: RollbackRecord,
        strategy: Strategy,
        optimization: Optimization,
        loop: LoopState,
        metrics: MetricCollector,
    ) -> tuple[RollbackRecord, set[int]]:
        """Put the snapshot back (every rank, at the same point) after ``found``; returns its full record and the
        batches the replay leaves out. Raises ``NonFiniteError`` after ``max_in_a_row`` rollbacks without a clean check."""
        snapshot = self._snapshot
        assert snapshot is not None  # taken at each epoch's start
        snapshot.skipped.add(found.batch_idx)
        record = dataclasses.replace(
            found, restored_step=snapshot.loop["global_step"], skipped=tuple(sorted(snapshot.skipped))
        )
        self.history.append(record)
        self._in_a_row += 1
        if self._in_a_row >= self.settings.max_in_a_row:
            listed = "; ".join(f"{i + 1}. {r}" for i, r in enumerate(self.history[-self._in_a_row :]))
            raise NonFiniteError(
                f"Training rolled back {self._in_a_row} times in a row without a clean check between them "
                f"(Rollback(max_in_a_row={self.settings.max_in_a_row})): {listed}. Skipping batches does not help "
                "here: the bad values come from the training itself. Try a lower learning rate or gradient "
                "clipping (Trainer(gradient_clip_val=1.0)); trainer.rollbacks lists every rollback of the fit."
            )
        with torch.no_grad():
            torch._foreach_copy_(_module_tensors(strategy.module), snapshot.tensors)
        for optimizer, (spec, leaves) in zip(optimization.optimizers, snapshot.optimizers):
            optimizer.zero_grad(set_to_none=True)
            optimizer.load_state_dict(tree_unflatten([_fresh(leaf) for leaf in leaves], spec))
        optimization.has_gradients = False
        for config, state in zip(optimization.lr_scheduler_configs, snapshot.schedulers):
            config.scheduler.load_state_dict(copy.deepcopy(state))
        strategy.precision.load_state_dict(copy.deepcopy(snapshot.precision))
        loop.load_state_dict(snapshot.loop)
        loop.resume_rng = snapshot.rng  # restored once the replay's batch order is drawn again
        metrics.reset(snapshot.metrics)
        self._losses = list(snapshot.losses)
        self._window.clear()
        return record, set(snapshot.skipped)


def _module_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The module's parameters and buffers (each once), as plain tensors to copy from and into."""
    return [t.detach() for t in (*module.parameters(), *module.buffers())]


def _same_shapes(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype for x, y in zip(a, b))


def _copy_tree(state: Any, old: tuple[Any, list[Any]] | None) -> tuple[Any, list[Any]]:
    """An optimizer's state dict as (structure, leaves), its tensors copied (into ``old``'s when they fit)."""
    leaves, spec = tree_flatten(state)
    if old is not None and old[0] == spec:
        targets = [(o, n) for o, n in zip(old[1], leaves) if isinstance(n, torch.Tensor)]
        if all(isinstance(o, torch.Tensor) and o.shape == n.shape and o.dtype == n.dtype for o, n in targets):
            if targets:
                torch._foreach_copy_([o for o, _ in targets], [n.detach() for _, n in targets])
            return spec, [o if isinstance(n, torch.Tensor) else copy.deepcopy(n) for o, n in zip(old[1], leaves)]
    return spec, [leaf.detach().clone() if isinstance(leaf, torch.Tensor) else copy.deepcopy(leaf) for leaf in leaves]


def _fresh(leaf: Any) -> Any:
    """A snapshot leaf to load: tensors copied (an optimizer may keep and update what it loads in place)."""
    return leaf.clone() if isinstance(leaf, torch.Tensor) else copy.deepcopy(leaf)


def skipping(batches: Iterable[Any], start: int, skipped: set[int]) -> Iterator[tuple[int, Any]]:
    """``enumerate(batches, start)`` without the batches at the indices ``skipped``."""
    return ((i, batch) for i, batch in enumerate(batches, start=start) if i not in skipped)
