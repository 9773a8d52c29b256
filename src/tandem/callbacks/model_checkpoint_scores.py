"""The values ModelCheckpoint ranks and names its files by: global rank 0's metrics as numbers, this rank's score
of the monitored metric, and scores kept as Lightning keeps them (0-dim tensors, NaN ranked last)."""

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from tandem.trainer.trainer import Trainer


def monitor_candidates(trainer: "Trainer") -> dict[str, Any]:
    """Global rank 0's metrics, as numbers: every rank then names, ranks and deletes the same files."""
    metrics = {name: as_number(value) for name, value in trainer.callback_metrics.items()}
    metrics.setdefault("epoch", trainer.current_epoch)
    metrics["step"] = trainer.global_step
    return trainer.strategy.broadcast(metrics)


def current_score(trainer: "Trainer", metrics: Mapping[str, Any], monitor: str, mode: str) -> torch.Tensor:
    """This rank's value of the logged metric ``monitor``, as a tensor (Lightning's ``current_score``); NaN ranks
    last."""
    # each rank's own value, as Lightning's: a metric logged without sync_dist differs between ranks
    value = trainer.callback_metrics.get(monitor, metrics[monitor])
    current = value.detach().clone() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
    if torch.isnan(current):
        current = torch.tensor(math.inf if mode == "min" else -math.inf, device=current.device)
    return current


def better(a: torch.Tensor, b: torch.Tensor, mode: str) -> bool:
    return bool(a > b) if mode == "max" else bool(a < b)


def as_score_or_none(score: Any) -> torch.Tensor | None:
    """A score as Lightning keeps it (a 0-dim tensor), or None; checkpoints of earlier tandem versions hold floats."""
    return None if score is None else as_score(score)


def as_score(score: Any) -> torch.Tensor:
    """A score that is there, as Lightning keeps it (see ``as_score_or_none``)."""
    return score if isinstance(score, torch.Tensor) else torch.tensor(float(score))


def as_number(value: Any) -> int | float:
    if isinstance(value, torch.Tensor):
        return int(value.item()) if not value.is_floating_point() else float(value.item())
    return value
