"""StochasticWeightAveraging: average the weights of the last epochs, with torch.optim.swa_utils."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from torch import nn
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn

from tandem.callbacks.callback import Callback
from tandem.callbacks.weight_averaging import copy_average_into
from tandem.utilities.exceptions import TandemConfigError, bad_choice, incompatible
from tandem.utilities.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer

_STRATEGIES = ("cos", "linear")


class StochasticWeightAveraging(Callback):
    """Stochastic Weight Averaging (Izmailov et al., 2018) with ``torch.optim.swa_utils``.

    From the SWA start epoch on, the learning rate follows ``torch.optim.swa_utils.SWALR`` (annealed
    over ``annealing_epochs`` to ``swa_lrs``, replacing what the module's own schedulers set), and the
    weights at the end of every epoch are averaged in a ``torch.optim.swa_utils.AveragedModel``. When
    training ends, the averaged weights are copied into the module and, if it has BatchNorm layers, their
    statistics are recomputed with one pass over the training data (``module(batch[0])`` for a tuple or
    list batch, ``module(batch)`` otherwise, as ``torch.optim.swa_utils.update_bn``; with several processes
    the statistics are averaged across them). The average, its count and the schedule are kept in
    checkpoints, so a resumed fit continues the same average.

    Args:
        swa_lrs: the SWA learning rate, one float for every parameter group or a list with one per group.
        swa_epoch_start: an int n >= 1 starts SWA at the n-th epoch (epoch index n - 1); a float in [0, 1]
            at epoch ``int(swa_epoch_start * max_epochs) - 1`` (at least 0), as Lightning counts.
        annealing_epochs: epochs over which the learning rate moves to ``swa_lrs``.
        annealing_strategy: ``"cos"`` or ``"linear"``.
        avg_fn: ``fn(averaged_param, param, num_averaged) -> new averaged_param``; default: the running mean.
        device: where the averaged copy of the weights lives (``None``: the module's device).

    Example:
        ```python
        trainer = Trainer(max_epochs=20, callbacks=[StochasticWeightAveraging(swa_lrs=1e-2, swa_epoch_start=15)])
        ```
    """

    def __init__(
        self,
        swa_lrs: float | list[float],
        swa_epoch_start: int | float = 0.8,
        annealing_epochs: int = 10,
        annealing_strategy: Literal["cos", "linear"] = "cos",
        avg_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        device: torch.device | str | None = "cpu",
    ) -> None:
        start = swa_epoch_start
        if isinstance(start, bool) or not (
            isinstance(start, int) and start >= 1 or isinstance(start, float) and 0 <= start <= 1
        ):
            raise TandemConfigError(
                f"StochasticWeightAveraging: swa_epoch_start={start!r} is out of range; expected an int >= 1 "
                "(the n-th epoch) or a float in [0.0, 1.0] (a fraction of max_epochs)."
            )
        lrs = swa_lrs if isinstance(swa_lrs, list) else [swa_lrs]
        if not lrs or any(isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0 for lr in lrs):
            raise TandemConfigError(
                f"StochasticWeightAveraging: swa_lrs={swa_lrs!r} must be a positive float, or a list of positive "
                "floats (one per parameter group)."
            )
        if isinstance(annealing_epochs, bool) or not isinstance(annealing_epochs, int) or annealing_epochs < 0:
            raise TandemConfigError(
                f"StochasticWeightAveraging: annealing_epochs={annealing_epochs!r} must be an int >= 0."
            )
        if annealing_strategy not in _STRATEGIES:
            raise bad_choice("StochasticWeightAveraging: annealing_strategy", annealing_strategy, _STRATEGIES)
        if avg_fn is not None and not callable(avg_fn):
            raise TandemConfigError("StochasticWeightAveraging: avg_fn must be callable (or None for the mean).")
        self._swa_epoch_start = swa_epoch_start
        self._swa_lrs = swa_lrs
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._avg_fn = avg_fn
        self._device = torch.device(device) if device is not None else None
        self.swa_start = 0  # the first SWA epoch (0-based), known at fit start
        self._averaged: AveragedModel | None = None
        self._scheduler: SWALR | None = None
        self._scheduled_epoch = -1  # the epoch whose learning rate the scheduler last set
        self._latest_update_epoch = -1  # the last epoch whose end weights are in the average
        self._pending: dict[str, Any] | None = None  # state restored before the module was known

    @property
    def n_averaged(self) -> int:
        """How many epochs' weights are in the average."""
        return int(self._averaged.n_averaged) if self._averaged is not None else 0

    # ------------------------------------------------------------------ hooks
    def on_fit_start(self, trainer: Trainer, module: TrainingModule) -> None:
        if len(trainer.optimizers) != 1:
            raise incompatible(
                "StochasticWeightAveraging",
                f"it schedules one optimizer and the module has {len(trainer.optimizers)}",
                "Return a single optimizer from configure_optimizers, or remove the callback.",
            )
        start = self._swa_epoch_start
        if isinstance(start, float):
            if trainer.max_epochs is None or trainer.max_epochs < 0:
                raise incompatible(
                    f"StochasticWeightAveraging(swa_epoch_start={start})",
                    "a fraction of max_epochs needs max_epochs",
                    "Set Trainer(max_epochs=...) or pass swa_epoch_start as an epoch number.",
                )
            start = int(trainer.max_epochs * start)
        self.swa_start = max(start - 1, 0)
        if self._pending is not None:
            state, self._pending = self._pending, None
            self._restore(state, trainer, module)

    def on_train_epoch_start(self, trainer: Trainer, module: TrainingModule) -> None:
        # The previous epoch's end weights join the average now, not at its end: a checkpoint written at an
        # epoch's end then holds weights and an average that agree, whatever the order of the callbacks.
        finished = trainer.current_epoch - 1
        if finished >= self.swa_start and finished > self._latest_update_epoch:
            self._update(module, finished)
        epoch = trainer.current_epoch
        if epoch < self.swa_start:
            return
        optimizer = trainer.optimizers[0]
        if self._scheduler is None:
            self._scheduler = self._make_scheduler(optimizer)
            self._scheduled_epoch = epoch
            names = [type(c.scheduler).__name__ for c in trainer.lr_scheduler_configs]
            rank_zero_info(
                f"StochasticWeightAveraging: from epoch {epoch} the learning rate follows SWALR (swa_lrs="
                f"{self._swa_lrs})" + (f"; {', '.join(names)} no longer set it." if names else ".")
            )
        elif epoch > self._scheduled_epoch:
            self._apply_lrs(optimizer, self._scheduler)  # undo what another scheduler set at the epoch's end
            self._scheduler.step()
            self._scheduled_epoch = epoch

    def on_before_optimizer_step(self, trainer: Trainer, module: TrainingModule, optimizer: Any) -> None:
        scheduler = self._scheduler
        if scheduler is not None:
            self._apply_lrs(optimizer, scheduler)  # a scheduler stepping every step must not override SWA's rate

    def on_train_end(self, trainer: Trainer, module: TrainingModule) -> None:
        finished = trainer.current_epoch - 1
        if finished >= self.swa_start and finished > self._latest_update_epoch:
            self._update(module, finished)
        averaged = self._averaged
        if averaged is None or self.n_averaged == 0:
            rank_zero_warn(
                f"StochasticWeightAveraging: training ended (epoch {finished}) before SWA started (epoch "
                f"{self.swa_start}); the module keeps its trained weights."
            )
            return
        copy_average_into(averaged, module, buffers=False)
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
            self._update_batch_norm(trainer, module)

    # ------------------------------------------------------------------ work
    def _update(self, module: nn.Module, epoch: int) -> None:
        if self._averaged is None:
            self._averaged = self._average_of(module)
        self._averaged.update_parameters(module)
        self._latest_update_epoch = epoch

    def _make_scheduler(self, optimizer: torch.optim.Optimizer) -> SWALR:
        groups = len(optimizer.param_groups)
        lrs = self._swa_lrs if isinstance(self._swa_lrs, list) else [self._swa_lrs] * groups
        if len(lrs) != groups:
            raise TandemConfigError(
                f"StochasticWeightAveraging: swa_lrs has {len(lrs)} values but the optimizer has {groups} "
                "parameter groups; give one value, or one per group."
            )
        return SWALR(
            optimizer,
            swa_lr=lrs,  # type: ignore[arg-type]  # one rate per parameter group: SWALR takes a list (its stubs say float)
            anneal_epochs=self._annealing_epochs,
            anneal_strategy=self._annealing_strategy,
        )

    def _average_of(self, module: nn.Module) -> AveragedModel:
        # torch calls avg_fn with the count as a tensor (its stubs also allow an int, which it never passes)
        avg_fn = cast("Callable[[torch.Tensor, torch.Tensor, torch.Tensor | int], torch.Tensor] | None", self._avg_fn)
        return AveragedModel(module, device=self._device, avg_fn=avg_fn, use_buffers=False)

    def _apply_lrs(self, optimizer: torch.optim.Optimizer, scheduler: SWALR) -> None:
        for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
            group["lr"] = lr

    def _update_batch_norm(self, trainer: Trainer, module: nn.Module) -> None:
        """One pass over the training data with the averaged weights, as ``update_bn``; statistics averaged
        across processes (each saw its own shard, the same number of batches)."""
        n = trainer.num_training_batches
        batches = (
            iter(trainer.train_dataloader) if math.isinf(n) else itertools.islice(trainer.train_dataloader, int(n))
        )

        def inputs() -> Iterator[Any]:
            for batch in batches:
                yield trainer.strategy.batch_to_device(batch)

        with torch.no_grad():
            update_bn(inputs(), module)
        if trainer.world_size > 1:
            norms = [
                m
                for m in module.modules()
                if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None
            ]
            stats = [t for m in norms for t in (m.running_mean, m.running_var) if t is not None]
            reduced = trainer.strategy.reduce(torch.cat([t.flatten() for t in stats]), "mean")
            for tensor, flat in zip(stats, reduced.split([t.numel() for t in stats])):
                tensor.copy_(flat.view_as(tensor))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "n_averaged": self.n_averaged,
            "latest_update_epoch": self._latest_update_epoch,
            "scheduled_epoch": self._scheduled_epoch,
            "scheduler_state": self._scheduler.state_dict() if self._scheduler is not None else None,
            "average_model_state": self._averaged.module.state_dict() if self._averaged is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pending = state  # the averaged copy is rebuilt from the module at fit start

    def _restore(self, state: dict[str, Any], trainer: Trainer, module: TrainingModule) -> None:
        self._latest_update_epoch = state["latest_update_epoch"]
        self._scheduled_epoch = state.get("scheduled_epoch", -1)
        if state["average_model_state"] is not None:
            self._averaged = self._average_of(module)
            self._averaged.module.load_state_dict(state["average_model_state"])
            self._averaged.n_averaged.fill_(state["n_averaged"])
        if state["scheduler_state"] is not None:
            optimizer = trainer.optimizers[0]
            lrs = [group["lr"] for group in optimizer.param_groups]
            self._scheduler = self._make_scheduler(optimizer)  # its first step changes the rates: put them back
            self._scheduler.load_state_dict(state["scheduler_state"])
            for group, lr in zip(optimizer.param_groups, lrs):
                group["lr"] = lr
