"""Parsing what ``configure_optimizers`` returns into one optimizer and its scheduler configs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import ReduceLROnPlateau

from tandem.utilities.exceptions import TandemUserCodeError, bad_choice

INTERVALS = ("epoch", "step")
_SHAPES = (
    "an optimizer; {'optimizer': opt, 'lr_scheduler': scheduler}; {'optimizer': opt, 'lr_scheduler': "
    "{'scheduler': scheduler, 'interval': 'epoch' | 'step', 'frequency': 1, 'monitor': 'val_loss'}}; "
    "or ([opt], [scheduler])"
)


@dataclass
class LRSchedulerConfig:
    """One scheduler and when it steps (Lightning's names)."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None
    strict: bool = True
    name: str | None = None


def _wrong(got: Any, why: str) -> TandemUserCodeError:
    return TandemUserCodeError(f"configure_optimizers returned {got!r}: {why}. Return {_SHAPES}.")


def parse_optimizers(result: Any) -> tuple[Optimizer, list[LRSchedulerConfig]]:
    """Validate the return value of ``configure_optimizers``."""
    schedulers: Any = []
    if isinstance(result, Optimizer):
        optimizer = result
    elif isinstance(result, Mapping):
        if "optimizer" not in result:
            raise _wrong(result, "a dict needs the key 'optimizer'")
        optimizer = result["optimizer"]
        schedulers = [result["lr_scheduler"]] if result.get("lr_scheduler") is not None else []
    elif isinstance(result, Sequence) and not isinstance(result, str):
        items = list(result)
        if len(items) == 2 and isinstance(items[0], Sequence) and isinstance(items[1], Sequence):
            optimizers, schedulers = list(items[0]), list(items[1])
        else:
            optimizers = items
        if len(optimizers) != 1:
            raise _wrong(result, f"tandem trains with exactly one optimizer per module, got {len(optimizers)}")
        optimizer = optimizers[0]
    else:
        raise _wrong(result, "that is not an optimizer")
    if not isinstance(optimizer, Optimizer):
        raise _wrong(result, f"{type(optimizer).__name__} is not a torch.optim.Optimizer")
    return optimizer, [_parse_scheduler(s, optimizer) for s in schedulers]


def _parse_scheduler(entry: Any, optimizer: Optimizer) -> LRSchedulerConfig:
    if isinstance(entry, Mapping):
        if "scheduler" not in entry:
            raise _wrong(dict(entry), "an lr_scheduler dict needs the key 'scheduler'")
        unknown = set(entry) - {"scheduler", "interval", "frequency", "monitor", "strict", "name"}
        if unknown:
            raise _wrong(dict(entry), f"unknown lr_scheduler keys {sorted(unknown)}")
        config = LRSchedulerConfig(**entry)
    else:
        config = LRSchedulerConfig(scheduler=entry)
    if not hasattr(config.scheduler, "step") or not hasattr(config.scheduler, "state_dict"):
        raise _wrong(entry, f"{type(config.scheduler).__name__} is not a learning-rate scheduler")
    if config.interval not in INTERVALS:
        raise bad_choice("lr_scheduler 'interval'", config.interval, INTERVALS)
    if not isinstance(config.frequency, int) or config.frequency < 1:
        raise _wrong(entry, f"'frequency' must be an int >= 1, got {config.frequency!r}")
    if isinstance(config.scheduler, ReduceLROnPlateau) and config.monitor is None:
        raise _wrong(entry, "ReduceLROnPlateau needs a metric: add 'monitor': 'val_loss' (a key you self.log)")
    if getattr(config.scheduler, "optimizer", optimizer) is not optimizer:
        raise _wrong(entry, "the scheduler was built for a different optimizer than the one returned")
    return config
