"""WeightAveraging and EMAWeightAveraging: a running average of the weights, updated after optimizer steps
or epochs with ``torch.optim.swa_utils.AveragedModel``, used for validation and kept at the end of fit."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

from tandem.callbacks.callback import Callback
from tandem.utilities.exceptions import TandemConfigError, out_of_range
from tandem.utilities.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer

_AVERAGED_MODEL_KWARGS = ("avg_fn", "multi_avg_fn")


def _pairs(average: AveragedModel, module: nn.Module, buffers: bool) -> Any:
    """(averaged tensor, module tensor) pairs: the parameters, and the buffers too when ``buffers``."""
    if not buffers:
        return zip(average.module.parameters(), module.parameters())
    return zip(
        itertools.chain(average.module.parameters(), average.module.buffers()),
        itertools.chain(module.parameters(), module.buffers()),
    )


@torch.no_grad()
def copy_average_into(average: AveragedModel, module: nn.Module, buffers: bool) -> None:
    """Put the averaged values into ``module`` (its buffers too when ``buffers``, else it keeps its own)."""
    for averaged, current in _pairs(average, module, buffers):
        current.copy_(averaged.to(current.device))


@torch.no_grad()
def swap_average(average: AveragedModel, module: nn.Module, buffers: bool) -> None:
    """Exchange the averaged values and ``module``'s (twice: back as they were)."""
    for averaged, current in _pairs(average, module, buffers):
        held = current.detach().clone()
        current.copy_(averaged.to(current.device))
        averaged.copy_(held.to(averaged.device))


class WeightAveraging(Callback):
    """A running average of the module's weights (a ``torch.optim.swa_utils.AveragedModel``), updated
    after optimizer steps or training epochs as [`should_update`][tandem.callbacks.WeightAveraging.should_update]
    decides (default: after every optimizer step). The default average is the equal-weight mean (SWA); pass ``avg_fn``
    or ``multi_avg_fn`` for another (``torch.optim.swa_utils.get_ema_avg_fn(0.999)`` for an EMA), or use
    [`EMAWeightAveraging`][tandem.callbacks.EMAWeightAveraging].

    During validation the module holds the averaged weights (swapped in at ``on_validation_epoch_start``, back at
    ``on_validation_epoch_end``), and when training ends the averaged weights are copied into the module. A
    checkpoint written during fit holds the averaged weights under ``"state_dict"`` (so a plain
    ``load_state_dict`` or ``load_from_checkpoint`` gets the averaged model), the trained weights under
    ``"current_model_state"`` and the average's count under ``"averaging_state"``; resuming from it restores
    both, and a checkpoint loaded for ``validate``/``test``/``predict`` gives the module the averaged weights.

    Unlike ``AveragedModel``, ``use_buffers`` is True by default: buffers (BatchNorm statistics) are averaged
    too. With ``use_buffers=False`` only the parameters are averaged and the module keeps its own buffers
    (Lightning swaps the copy's stale buffers in; here they stay the module's). The average lives with the
    module's parameters and is built when fit starts, after ``configure_model``; sharded models (FSDP) are
    not supported.

    Args:
        device: where the averaged copy lives (``None``: the module's device; ``"cpu"`` to save device memory).
        use_buffers: average the buffers too, not only the parameters.
        **kwargs: ``avg_fn`` or ``multi_avg_fn`` for ``AveragedModel`` (the averaging rule).

    Example:
        ```python
        class EveryEpochFromTen(WeightAveraging):
            def should_update(self, step_idx=None, epoch_idx=None):
                return epoch_idx is not None and epoch_idx >= 10

        trainer = Trainer(max_epochs=20, callbacks=[EveryEpochFromTen()])
        ```
    """

    def __init__(self, device: torch.device | str | int | None = None, use_buffers: bool = True, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(_AVERAGED_MODEL_KWARGS))
        if unknown:
            raise TandemConfigError(
                f"{type(self).__name__} got unknown argument(s) {', '.join(unknown)}; it passes only "
                f"{' and '.join(_AVERAGED_MODEL_KWARGS)} on to torch.optim.swa_utils.AveragedModel."
            )
        for name, fn in kwargs.items():
            if fn is not None and not callable(fn):
                raise TandemConfigError(f"{type(self).__name__}: {name} must be callable (or None), got {fn!r}.")
        self._device = torch.device(device) if isinstance(device, str) else device
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model: AveragedModel | None = None
        self._fitting = False
        # Optimizer steps taken at the last update: 0 makes the first candidate the first optimizer step (after
        # accumulate_grad_batches batches). Epochs count from 0, so -1 lets the first epoch's end update.
        self._latest_update_step = 0
        self._latest_update_epoch = -1
        self._pending: dict[str, torch.Tensor] | None = None  # averaged state read from a checkpoint before fit start

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Whether to update the average now; called after each optimizer step with ``step_idx`` (the 0-based
        index of the step just taken) and after each training epoch with ``epoch_idx``. Override it to choose;
        the default updates after every optimizer step."""
        return step_idx is not None

    @property
    def average_model(self) -> AveragedModel | None:
        """The ``AveragedModel`` (its ``module`` holds the averaged weights, ``n_averaged`` the count); None
        outside fit."""
        return self._average_model

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: Trainer, module: TrainingModule, stage: str) -> None:
        self._fitting = stage == "fit"

    def on_fit_start(self, trainer: Trainer, module: TrainingModule) -> None:
        # here, not in setup: the module has its configure_model layers and sits on its device
        self._average_model = AveragedModel(module, device=self._device, use_buffers=self._use_buffers, **self._kwargs)
        if self._pending is not None:
            state, self._pending = self._pending, None
            self._average_model.load_state_dict(state)

    def on_train_batch_end(
        self, trainer: Trainer, module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step  # optimizer steps so far: the step just taken has index step - 1
        if step > self._latest_update_step and self.should_update(step_idx=step - 1):
            self._fit_average().update_parameters(module)
            self._latest_update_step = step

    def on_train_epoch_end(self, trainer: Trainer, module: TrainingModule) -> None:
        epoch = trainer.current_epoch
        if epoch > self._latest_update_epoch and self.should_update(epoch_idx=epoch):
            self._fit_average().update_parameters(module)
            self._latest_update_epoch = epoch

    def on_train_end(self, trainer: Trainer, module: TrainingModule) -> None:
        rank_zero_info(f"{type(self).__name__}: the module now holds the averaged weights.")
        copy_average_into(self._fit_average(), module, self._use_buffers)

    def _fit_average(self) -> AveragedModel:
        """The running fit's average (made in ``on_fit_start``)."""
        average = self._average_model
        assert average is not None  # the training hooks run after on_fit_start
        return average

    def on_validation_epoch_start(self, trainer: Trainer, module: TrainingModule) -> None:
        if self._fitting and self._average_model is not None:
            swap_average(self._average_model, module, self._use_buffers)

    def on_validation_epoch_end(self, trainer: Trainer, module: TrainingModule) -> None:
        if self._fitting and self._average_model is not None:
            swap_average(self._average_model, module, self._use_buffers)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"latest_update_step": self._latest_update_step, "latest_update_epoch": self._latest_update_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._latest_update_step = state["latest_update_step"]
        self._latest_update_epoch = state.get("latest_update_epoch", -1)

    def on_save_checkpoint(self, trainer: Trainer, module: TrainingModule, checkpoint: dict[str, Any]) -> None:
        if self._average_model is None:
            rank_zero_info(
                f"{type(self).__name__}: a checkpoint saved outside fit holds the module's weights and no "
                "averaging state (after a fit, those are the averaged weights)."
            )
            return
        if not self._use_buffers:  # the copy's buffers are stale: save the module's
            with torch.no_grad():
                for averaged, current in zip(self._average_model.module.buffers(), module.buffers()):
                    averaged.copy_(current)
        average_state = self._average_model.state_dict()
        checkpoint["current_model_state"] = checkpoint["state_dict"]
        checkpoint["state_dict"] = {k[len("module.") :]: v for k, v in average_state.items() if k.startswith("module.")}
        checkpoint["averaging_state"] = {k: v for k, v in average_state.items() if not k.startswith("module.")}

    def on_load_checkpoint(self, trainer: Trainer, module: TrainingModule, checkpoint: dict[str, Any]) -> None:
        # Called before the Trainer loads checkpoint["state_dict"] into the module.
        if not self._fitting:
            rank_zero_info(f"{type(self).__name__}: the checkpoint's averaged weights are loaded into the module.")
            return
        if "current_model_state" in checkpoint and "averaging_state" in checkpoint:
            averaged = {"module." + k: v for k, v in checkpoint["state_dict"].items()}
            self._pending = {**averaged, **checkpoint["averaging_state"]}
            checkpoint["state_dict"] = checkpoint["current_model_state"]  # the module resumes its trained weights
        else:
            rank_zero_warn(
                f"{type(self).__name__}: the checkpoint was not written with weight averaging; the average starts "
                "from its weights."
            )


class EMAWeightAveraging(WeightAveraging):
    """An exponential moving average of the weights: ``average = decay * average + (1 - decay) * weights``
    (the first update copies the weights), as [`WeightAveraging`][tandem.callbacks.WeightAveraging] swaps in for
    validation, keeps at the end of fit and saves in checkpoints.

    The average is updated after optimizer step ``step_idx`` (0-based) when ``step_idx % update_every_n_steps
    == 0`` and ``step_idx >= update_starting_at_step`` (if set); and after epoch ``epoch_idx`` when
    ``update_starting_at_epoch`` is set and ``epoch_idx >= update_starting_at_epoch``.

    Args:
        device: where the averaged copy lives (``None``: the module's device).
        use_buffers: average the buffers (BatchNorm statistics) too.
        decay: the weight of the old average, in [0, 1].
        update_every_n_steps: update after every n-th optimizer step (0: never after steps).
        update_starting_at_step: the first optimizer step (0-based) that may update.
        update_starting_at_epoch: also update at the end of each epoch from this one on.
        **kwargs: further ``AveragedModel`` arguments (``multi_avg_fn``).

    Example:
        ```python
        trainer = Trainer(callbacks=[EMAWeightAveraging(decay=0.999, update_starting_at_step=1000)])
        ```
    """

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        use_buffers: bool = True,
        decay: float = 0.999,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 <= decay <= 1:
            raise out_of_range("EMAWeightAveraging: decay", decay, "a float in [0.0, 1.0] (typically 0.99 to 0.9999)")
        if (
            isinstance(update_every_n_steps, bool)
            or not isinstance(update_every_n_steps, int)
            or update_every_n_steps < 0
        ):
            raise out_of_range(
                "EMAWeightAveraging: update_every_n_steps", update_every_n_steps, "an int >= 0 (0: no step updates)"
            )
        super().__init__(device=device, use_buffers=use_buffers, **kwargs, avg_fn=get_ema_avg_fn(decay=decay))
        self.decay = decay
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        if step_idx is not None:
            started = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
            if started and self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0:
                return True
        if epoch_idx is not None:
            return self.update_starting_at_epoch is not None and epoch_idx >= self.update_starting_at_epoch
        return False
