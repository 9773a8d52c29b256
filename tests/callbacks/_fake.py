"""A stand-in for the Trainer: the public attributes callbacks read, and a strategy that can play rank 1.

Two fake ranks share a ``channel``: rank 0's strategy appends every value it broadcasts, rank 1's
strategy returns those values in order, so a callback on "rank 1" sees exactly what a real broadcast
from rank 0 would give it. Run the rank-0 hook first, then the same hook on rank 1.

Import it as ``from callbacks._fake import ...`` (``tests`` is on pytest's pythonpath).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from tandem.trainer.epoch_loop import validates_only_at_epoch_ends
from tandem.utilities.checkpoint import atomic_save


class FakeStrategy:
    root_device = torch.device("cpu")

    def __init__(self, global_rank: int = 0, channel: list[Any] | None = None) -> None:
        self.global_rank = global_rank
        self.channel = channel
        self.removed: list[str] = []

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self.channel is None:
            return obj
        if self.is_global_zero:
            self.channel.append(obj)
            return obj
        return self.channel.pop(0)

    def reduce(self, tensor: torch.Tensor, op: str = "mean") -> torch.Tensor:
        return tensor

    def barrier(self, name: str | None = None) -> None:
        pass

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """One rank's vote (the fake ranks run one after the other, so they cannot vote together)."""
        return bool(decision)

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        self.removed.append(os.fspath(path))
        if self.is_global_zero:
            Path(path).unlink(missing_ok=True)


class FakeTrainer(SimpleNamespace):
    @property
    def fit_loop(self) -> SimpleNamespace:
        """The fit loop's answers, from the fake's settings (the same rule as the real loop's)."""
        val_batches = self.num_val_batches
        total = sum(val_batches) if isinstance(val_batches, (list, tuple)) else val_batches
        answer = validates_only_at_epoch_ends(self.check_val_every_n_epoch, self.val_check_interval, total)
        return SimpleNamespace(validates_only_at_epoch_ends=answer)


def fake_trainer(
    root: str | os.PathLike,
    rank: int = 0,
    channel: list[Any] | None = None,
    callbacks: list[Any] = (),
    **attrs: Any,
) -> FakeTrainer:
    """A Trainer look-alike; ``save_checkpoint`` writes ``{"global_step", "weights_only", "callbacks"}`` on rank 0."""
    trainer = FakeTrainer(
        current_epoch=0,
        global_step=0,
        callback_metrics={},
        progress_bar_metrics={},
        logged_metrics={},
        should_stop=False,
        strategy=FakeStrategy(rank, channel),
        loggers=[],
        default_root_dir=os.fspath(root),
        is_global_zero=rank == 0,
        global_rank=rank,
        world_size=1 if channel is None else 2,
        max_epochs=10,
        max_steps=-1,
        log_every_n_steps=50,
        is_log_step=False,
        num_training_batches=10,
        num_val_batches=2,
        num_test_batches=3,
        num_predict_batches=4,
        optimizers=[],
        lr_scheduler_configs=[],
        sanity_checking=False,
        state=SimpleNamespace(fn="fit", stage="train"),
        val_check_interval=1.0,
        check_val_every_n_epoch=1,
        accumulate_grad_batches=1,
        num_sanity_val_steps=2,
        fast_dev_run=False,
        ckpt_path=None,
        training=True,
        validating=False,
        testing=False,
        predicting=False,
        callbacks=list(callbacks),
        saved=[],
    )

    def save_checkpoint(path: str | os.PathLike, weights_only: bool = False) -> None:
        trainer.saved.append(os.fspath(path))
        if trainer.is_global_zero:
            state = {c.state_key: c.state_dict() for c in trainer.callbacks}
            content = {"global_step": trainer.global_step, "weights_only": weights_only}
            atomic_save({**content, "callbacks": {} if weights_only else state}, path)

    def log_metrics(metrics: dict[str, Any], step: int | None = None) -> None:  # as Trainer.log_metrics
        values = {k: float(v) for k, v in metrics.items()}
        trainer.logged_metrics.update(values)
        if values and trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(values, step=trainer.global_step if step is None else step)

    trainer.save_checkpoint = save_checkpoint
    trainer.log_metrics = log_metrics
    for name, value in attrs.items():
        setattr(trainer, name, value)
    trainer.logger = trainer.loggers[0] if trainer.loggers else None
    trainer.log_dir = trainer.logger.log_dir if trainer.logger else os.fspath(root)
    return trainer


def metrics(**values: float) -> dict[str, torch.Tensor]:
    """``callback_metrics`` as the Trainer keeps them: 0-dim tensors."""
    return {k: torch.tensor(float(v)) for k, v in values.items()}


class RecordingLogger:
    """Collects ``log_metrics`` calls; stands for any logger in ``trainer.loggers``."""

    def __init__(self, log_dir: str | None = None) -> None:
        self.log_dir = log_dir
        self.calls: list[tuple[dict[str, float], int]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.calls.append((dict(metrics), step))
