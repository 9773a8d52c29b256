"""NaN and inf in training: found where tandem reads values anyway, decided alike on every rank, and never
written into a checkpoint. ``Trainer(on_nonfinite=...)`` chooses the reaction.

Where tandem looks (nothing runs on the other steps):

- **The loss, at publishing steps.** Every ``log_every_n_steps`` stepping batches, when the logged values go
  to the loggers or are reduced across processes, the loss ``training_step`` returned is read too. The
  processes learn each other's verdict in the reduction that publishes the values, not in another collective.
- **The parameters, at each epoch end and before each checkpoint is written.** One fused pass
  (``torch._foreach_norm``: a NaN or inf anywhere in a tensor makes its norm NaN or inf) and one read. The
  ranks agree in the epoch end's ``should_stop`` reduction, and before a save in one reduction of one number.

Buffers are not checked (a causal mask may hold -inf on purpose), nor are the other logged values (a
perplexity may overflow, a ratio may divide by zero); those that are NaN or inf are named when the loss is.
Gradients are never checked: under "16-mixed" the GradScaler skips a step whose gradients hold inf or NaN and
lowers its scale, the weights stay finite, and an occasional non-finite loss is part of how it works. There a
non-finite loss counts only when it persists: at two publishing steps in a row.

``"raise"`` (the default) stops every rank with a [`NonFiniteError`][tandem.utilities.exceptions.NonFiniteError] naming
the step, what was found (on which ranks) and what to try. ``"warn"`` warns once and trains on, but never
writes a checkpoint whose parameters are not finite: such a save is skipped with a warning
(``trainer.save_checkpoint`` returns False), so the last good checkpoint stays. ``"rollback"`` (or a
[`Rollback`][tandem.trainer.Rollback]) checks every batch's loss at the same places and rolls every rank back
past the batch that produced a bad one (see ``tandem.trainer.rollback``); a save that meets non-finite
parameters before the check that rolls back is skipped as under ``"warn"``, and non-finite parameters found
with every loss clean raise as under ``"raise"``.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tandem.trainer.rollback import Rollback, RollbackGuard
from tandem.utilities.exceptions import bad_choice, non_finite, non_finite_advice
from tandem.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from tandem.strategies.strategy import Strategy
    from tandem.trainer.config import TrainerConfig

ON_NONFINITE = ("raise", "warn", "rollback")
_SHOWN = 5  # names listed in a message


def check_reaction(value: Any) -> str:
    """``Trainer(on_nonfinite=...)``, validated: the reaction's name (a ``Rollback`` is ``"rollback"``)."""
    if isinstance(value, Rollback):
        return "rollback"
    if not isinstance(value, str) or value not in ON_NONFINITE:
        raise bad_choice("on_nonfinite", value, ON_NONFINITE, "Or pass Rollback(...) to set how it rolls back.")
    return value


def rollback_settings(value: str | Rollback) -> Rollback | None:
    """The rollback settings ``Trainer(on_nonfinite=...)`` asks for (None: it does not roll back)."""
    if isinstance(value, Rollback):
        return value
    return Rollback() if check_reaction(value) == "rollback" else None


def loss_is_finite(loss: torch.Tensor | None) -> bool:
    """Read the loss (one host sync: called at publishing steps only). No loss (a skipped batch) is finite. The
    loss is one number (``_loss_from`` checks): read as a float, not through ``isfinite`` kernels."""
    return loss is None or math.isfinite(loss.item())


@torch.no_grad()
def nonfinite_parameters(module: nn.Module | None) -> list[str]:
    """The names of this process's parameters that hold NaN or inf (FSDP: in this rank's shards). One fused
    pass and one read when every parameter is finite."""
    if module is None:
        return []
    named = [(name, getattr(p, "to_local", lambda p=p: p)()) for name, p in module.named_parameters()]
    named = [(n, t) for n, t in named if (t.is_floating_point() or t.is_complex()) and not t.is_meta and t.numel()]
    if not named:
        return []
    norms: tuple[torch.Tensor, ...] | list[torch.Tensor] = torch._foreach_norm([t for _, t in named])
    if len({n.device for n in norms}) > 1:  # parameters on several devices (rare): compare on the CPU
        norms = [n.cpu() for n in norms]
    if bool(torch.stack(norms).isfinite().all()):
        return []
    # Rare: name them exactly (a norm can overflow where every element is finite).
    return [n for n, t in named if not bool(torch.isfinite(t).all())]


class NonFiniteGuard:
    """What one Trainer found during the current fit, and how it reacts (see the module docstring).

    Args:
        reaction: ``"raise"``, ``"warn"``, ``"rollback"`` or a [`Rollback`][tandem.trainer.Rollback]
            (``Trainer(on_nonfinite=...)``).
        strategy: the Trainer's (its process count and precision shape the messages and the float16 rule).
        config: the Trainer's loop settings (``log_every_n_steps`` is named in messages).
    """

    def __init__(self, reaction: str | Rollback, strategy: Strategy, config: TrainerConfig) -> None:
        settings = rollback_settings(reaction)
        self.reaction = check_reaction(reaction)
        self._strategy, self._config = strategy, config
        self._paused = False
        #: "rollback": records every batch's loss, checks them at publishing steps and rolls back (the fit loop's)
        self.rollback = RollbackGuard(settings, strategy) if settings is not None else None
        self.reset()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Act on nothing found in the block, and forget it after: a search that drives the loss to diverge on
        purpose (the tuner's learning-rate range test) runs inside."""
        saved = dict(self.__dict__)
        self._paused = True
        if self.rollback is not None:
            self.rollback.paused = True
        try:
            yield
        finally:
            self.__dict__.update(saved)
            if self.rollback is not None:
                self.rollback.paused = False

    def reset(self) -> None:
        """A new fit: nothing found yet."""
        self.last_finite_step: int | None = None  # the latest publishing step whose loss was finite everywhere
        self.found: str | None = None  # the first finding of this fit (under "warn", training went on after it)
        self._pending: tuple[int, list[int]] | None = None  # "16-mixed": a non-finite loss waiting to persist
        self._save_warned = False  # "warn": a skipped save was reported (later ones are skipped quietly)
        if self.rollback is not None:
            self.rollback.reset()

    # ------------------------------------------------------------------ the loss, at publishing steps
    def check_loss(self, finite: list[bool], logged: Callable[[], Mapping[str, Any]], step: int) -> None:
        """Act on the losses read at publishing step ``step`` (``loss_is_finite`` of every process, in rank
        order: the same list on every rank, so every rank decides alike). ``logged``: the step's values, read only to
        name those that are not finite."""
        several = self._strategy.world_size > 1
        ranks = [rank for rank, ok in enumerate(finite) if not ok]
        if not ranks:
            self.last_finite_step, self._pending = step, None
            return
        scaled = self._strategy.precision.scaler is not None
        if scaled and self._pending is None:  # the scaler skipped the step; act if the next check sees it too
            self._pending = (step, ranks)
            return
        first, first_ranks = self._pending or (step, ranks)
        where = f" on rank(s) {sorted(set(first_ranks) | set(ranks))}" if several else ""
        found = f"the loss returned by training_step was NaN or inf at global step {first}{where}"
        if scaled:
            found += (
                f" and again at step {step}, the next step checked: the GradScaler skips such steps, and these do "
                "not recover"
            )
        found += f"{self._since(first)}."
        others = sorted(name for name, value in logged().items() if not math.isfinite(float(value)))
        if others:
            here = " on this rank" if several else ""
            found += f" Logged values that were NaN or inf at step {step}{here}: {_names(others)}."
        self._react(found)

    # ------------------------------------------------------------------ the parameters
    def check_epoch_end(self, names: list[str], anywhere: bool, epoch: int, step: int) -> None:
        """Act on the parameters checked at the end of training epoch ``epoch`` (``anywhere``: on any rank,
        agreed)."""
        if anywhere:
            found = (
                f"parameters hold NaN or inf at the end of epoch {epoch} (global step "
                f"{step}){self._since(step)}: {_names(names)}."
            )
            self._react(found)

    def refuse_save(self, names: list[str], path: str | os.PathLike, step: int) -> None:
        """The parameters hold NaN or inf (on some rank, agreed) where a checkpoint was to be written: raise, or
        warn that the save is skipped (the first time in a fit)."""
        found = (
            f"parameters hold NaN or inf at global step {step}: {_names(names)}. Checkpoint "
            f"{os.fspath(path)!r} was not written (a file already there is left as it was)."
        )
        if self.reaction == "raise":
            raise non_finite(found, self._precision)
        if self.reaction == "rollback":  # the next check finds the loss that made them so, and rolls back
            if not self._save_warned:
                rank_zero_warn(
                    f"on_nonfinite='rollback': {found} The next check of the losses rolls back to the last clean "
                    "state. Later checkpoints meeting NaN or inf parameters are skipped without a warning."
                )
        elif self.found is None:
            self._react(found)
        elif not self._save_warned:
            rank_zero_warn(
                f"on_nonfinite='warn': {found} Later checkpoints are skipped without a warning while the parameters "
                "hold NaN or inf."
            )
        self._save_warned = True

    # ------------------------------------------------------------------ reacting
    @property
    def _precision(self) -> str:
        return self._strategy.precision.precision

    def _react(self, found: str) -> None:
        if self._paused:
            return
        if self.reaction != "warn":  # "rollback" found it without a bad loss: no batch to leave out
            raise non_finite(found, self._precision)
        if self.found is None:  # warn once per fit; each skipped checkpoint warns on its own
            self.found = found
            rank_zero_warn(
                f"NaN or inf in training: {found} Training goes on (Trainer(on_nonfinite='warn')); no checkpoint is "
                f"written while the parameters hold NaN or inf. {non_finite_advice(self._precision)}"
            )

    def _since(self, step: int) -> str:
        last = self.last_finite_step
        if last is None or last >= step:
            return ""
        every = self._config.log_every_n_steps
        return f" (the check before, at step {last}, found the loss finite; it is read every {every} steps)"


def _names(names: list[str]) -> str:
    if not names:
        return "(in another rank's shard)"
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")
