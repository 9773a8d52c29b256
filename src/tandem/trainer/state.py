"""Loop progress and what the Trainer is doing now. Saved in checkpoints for exact resume."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Progress:
    """Where training is. ``epoch`` counts from 0; after fit it equals the number of finished epochs."""

    epoch: int = 0
    global_step: int = 0  # optimizer steps taken (a float16 step skipped for inf/NaN counts too)
    batches_done: int = 0  # training batches finished in the current epoch
    epoch_finished: bool = False  # the epoch's batches are done; its end (validation, hooks) is running
    epoch_start_rng: dict[str, Any] | None = field(default=None, repr=False)  # RNG at iter(train loader)

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)
        if self.epoch_finished:  # saved at the epoch's end: resume with the next epoch
            self.epoch, self.batches_done, self.epoch_finished, self.epoch_start_rng = self.epoch + 1, 0, False, None


@dataclass
class TrainerState:
    """``fn``: the entry point running ("fit", "validate", "test", "predict");
    ``stage``: "train", "sanity_check", "validate", "test" or "predict"."""

    fn: str | None = None
    stage: str | None = None


@dataclass(frozen=True)
class EvalStage:
    """The names one evaluation stage uses: hooks and step (``name``), loaders, limits and counts (``short``)."""

    name: str  # "validation": validation_step, on_validation_epoch_end, ...
    short: str  # "val": val_dataloaders, num_val_batches, limit_val_batches, DataModule.val_dataloader

    @property
    def step(self) -> str:
        return f"{self.name}_step"

    @property
    def loaders_attr(self) -> str:
        return f"{self.short}_dataloaders"

    @property
    def count_attr(self) -> str:
        return f"num_{self.short}_batches"

    @property
    def limit_attr(self) -> str:
        return f"limit_{self.short}_batches"

    @property
    def datamodule_hook(self) -> str:
        return f"{self.short}_dataloader"


EVAL_STAGES = {
    "validate": EvalStage("validation", "val"),
    "test": EvalStage("test", "test"),
    "predict": EvalStage("predict", "predict"),
}
