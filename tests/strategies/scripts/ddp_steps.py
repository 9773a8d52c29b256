"""DDPStrategy without a Trainer: the ranks train a tiny model through run_step / backward /
optimizer_step, try the collectives and the samplers, and write what they saw to ``--out``.

Modes:
    train     two ranks (or whatever started us) train; collectives, data sharding, predictions
              gathering and the unused-parameter message are checked; each rank saves rank{r}.pt
    crash     rank 1 raises at step 3; rank 0 is in a collective then (or asleep, --rank0-sleeps); each rank
              writes how its launch ended to exit{rank} from a context manager
    wait      the ranks write ready{r} and train slowly until a signal ends them

:func:`run_spawn` (ddp_spawn without a Trainer: the caller gets rank 0's return value, weights and metrics back, in
``spawn.pt``; with ``crash``, rank 1 raises and the caller's error goes to ``error.txt``) runs in
``spawn_runs.py``'s process, with the other ddp_spawn scenarios.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tandem.strategies import DDPStrategy
from tandem.strategies.environments import TorchElasticEnvironment
from tandem.strategies.registry import resolve_strategy


class Regression(nn.Module):
    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.extra = nn.Linear(4, 1) if unused else None

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return ((self.linear(x) - y) ** 2).mean()

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> dict:
        x, _ = batch
        return {"double": x * 2, "index": x[:, :1].long().flatten().tolist()}


def make_strategy(devices: int, **kwargs: object) -> DDPStrategy:
    return resolve_strategy(DDPStrategy(**kwargs), "cpu", devices, 1, "32-true")


def train_steps(
    strategy: DDPStrategy,
    module: nn.Module,
    steps: int,
    crash_at: int | None = None,
    rank0_sleeps: bool = False,
    delay: float = 0.0,
) -> None:
    optimizer = torch.optim.SGD(strategy.module.parameters(), lr=0.1)
    rank = strategy.global_rank
    g = torch.Generator().manual_seed(100 + rank)  # every rank sees different data
    for step in range(steps):
        if crash_at is not None and step == crash_at:
            if rank == 1:
                raise RuntimeError(f"boom at step {step} on rank 1")
            if rank0_sleeps:
                time.sleep(60)
        batch = strategy.batch_to_device((torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)))
        loss = strategy.run_step("training_step", batch, step)
        strategy.backward(loss)
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
        time.sleep(delay)


def check_collectives(strategy: DDPStrategy) -> dict:
    rank, world = strategy.global_rank, strategy.world_size
    value = torch.tensor(float(rank + 1))
    seen = {op: strategy.reduce(value, op).item() for op in ("sum", "mean", "max", "min")}
    assert seen == {"sum": world * (world + 1) / 2, "mean": (world + 1) / 2, "max": world, "min": 1.0}, seen
    assert strategy.all_gather(torch.tensor([rank, 10 * rank])).tolist() == [[r, 10 * r] for r in range(world)]
    assert strategy.broadcast({"from": rank}, src=0) == {"from": 0}
    strategy.barrier("check")
    assert strategy.reduce_boolean_decision(rank == 0, all=True) is False
    assert strategy.reduce_boolean_decision(rank == 0, all=False) is True
    return seen


def check_data(strategy: DDPStrategy) -> dict:
    rank, world = strategy.global_rank, strategy.world_size
    x = torch.arange(11, dtype=torch.float32).unsqueeze(1).repeat(1, 4)
    data = TensorDataset(x, torch.zeros(11, 1))
    train = strategy.process_dataloader(DataLoader(data, batch_size=2), "fit")
    train_indices = [int(b[0][:, 0].tolist()[i]) for b in train for i in range(len(b[0]))]
    # unequal batch counts (the user shards by hand): evened to the smaller count, with a warning on rank 0
    by_hand = make_strategy(world, use_distributed_sampler=False)
    by_hand.setup_environment()
    mine = TensorDataset(x[: 6 + 4 * rank], torch.zeros(6 + 4 * rank, 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evened = by_hand.process_dataloader(DataLoader(mine, batch_size=2), "fit")
    # predictions: 11 samples, batch 3 -> 4 batches in dataset order on every rank
    predict = strategy.process_dataloader(DataLoader(data, batch_size=3), "predict")
    outputs = [strategy.module.predict_step(batch, i) for i, batch in enumerate(predict)]
    gathered = strategy.gather_predictions(outputs, predict)
    return {
        "train_indices": train_indices,
        "evened_batches": len(list(evened)),
        "evened_warned": any("different numbers of training batches" in str(w.message) for w in caught),
        "predict_indices": [p["index"] for p in gathered],
        "predict_double": torch.cat([p["double"] for p in gathered]),
    }


def check_unused(world: int) -> str:
    """A parameter outside the loss under find_unused_parameters=False (given: no rescue): DDP's error, told with
    the parameters' names."""
    strategy = make_strategy(world, find_unused_parameters=False)
    strategy.setup_environment()
    strategy.setup(Regression(unused=True))
    try:
        train_steps(strategy, strategy.module, steps=3)
    except RuntimeError as err:
        return str(err)
    return "no error"


def run_train(args: argparse.Namespace) -> None:
    strategy = make_strategy(args.devices)
    launcher = strategy.launcher
    if args.expect_torchrun:
        assert launcher is None, launcher
        assert isinstance(strategy.environment, TorchElasticEnvironment), strategy.environment

    def work() -> None:
        strategy.setup_environment()
        rank = strategy.global_rank
        torch.manual_seed(rank)  # different initial weights: DDP broadcasts rank 0's
        strategy.setup(Regression())
        train_steps(strategy, strategy.module, steps=5)
        result = {
            "rank": rank,
            "world_size": strategy.world_size,
            "threads": torch.get_num_threads(),
            "launched_by": type(strategy.environment).__name__,
            "weights": {k: v.clone() for k, v in strategy.module.state_dict().items()},
            "collectives": check_collectives(strategy),
            **check_data(strategy),
            "unused_message": check_unused(strategy.world_size),
        }
        strategy.teardown()
        torch.save(result, Path(args.out) / f"rank{rank}.pt")

    if launcher is None:
        work()
    else:
        launcher.launch(work)


class ExitRecorder:
    """A context manager that writes how its block ended to ``path`` (it must run however the block ends)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        pass

    def __exit__(self, exc_type, exc, tb) -> None:
        self.path.write_text(f"{exc_type.__name__}: {exc}" if exc_type is not None else "no error")


def run_crash(args: argparse.Namespace) -> None:
    strategy = make_strategy(2)

    def work() -> None:
        strategy.setup_environment()
        (Path(args.out) / f"pid{strategy.global_rank}").write_text(str(os.getpid()))
        strategy.setup(Regression())
        train_steps(strategy, strategy.module, steps=50, crash_at=3, rank0_sleeps=args.rank0_sleeps)

    with ExitRecorder(Path(args.out) / f"exit{os.environ.get('RANK', '0')}"):
        strategy.launcher.launch(work)


def run_wait(args: argparse.Namespace) -> None:
    strategy = make_strategy(2)

    def work() -> None:
        strategy.setup_environment()
        strategy.setup(Regression())
        train_steps(strategy, strategy.module, steps=2)
        (Path(args.out) / f"ready{strategy.global_rank}").write_text(str(os.getpid()))
        train_steps(strategy, strategy.module, steps=10_000, delay=0.05)

    strategy.launcher.launch(work)


class FitLoop:
    """What the launcher reads and writes of a Trainer's fit loop: its state, sent back from rank 0."""

    def __init__(self) -> None:
        self.epoch, self.loaded = 0, None

    def state_dict(self) -> dict:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.loaded = state


def spawned(strategy: DDPStrategy, module: nn.Module, trainer: types.SimpleNamespace, crash: bool) -> dict:
    strategy.setup_environment()
    strategy.setup(module)
    trainer.strategy = strategy
    if crash and strategy.global_rank == 1:
        raise ValueError("spawned rank 1 fails")
    train_steps(strategy, strategy.module, steps=3)
    trainer.callback_metrics["seen_by"] = torch.tensor(float(strategy.global_rank))
    trainer.checkpoint_callback.best_model_path = f"best-from-rank{strategy.global_rank}.ckpt"
    trainer.fit_loop.epoch = 10 + strategy.global_rank
    return {
        "rank": strategy.global_rank,
        "sum": strategy.reduce(torch.tensor(1.0), "sum").item(),
        "weights": {k: v.clone() for k, v in strategy.module.state_dict().items()},
    }


def run_spawn(out: Path, crash: bool = False) -> None:
    strategy = make_strategy(2, start_method="spawn")
    module = Regression()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = types.SimpleNamespace(
        callback_metrics={"stale": 1.0},
        checkpoint_callback=types.SimpleNamespace(best_model_path=""),
        fit_loop=FitLoop(),
    )
    try:
        result = strategy.launcher.launch(spawned, strategy, module, trainer, crash, trainer=trainer)
    except RuntimeError as err:
        (out / "error.txt").write_text(str(err))
        return
    assert not crash, "rank 1 raised: the launch should have failed"
    torch.save(
        {
            "result": result,
            "before": before,
            "after": module.state_dict(),
            "callback_metrics": trainer.callback_metrics,
            "best_model_path": trainer.checkpoint_callback.best_model_path,
            "progress": trainer.fit_loop.loaded,
        },
        out / "spawn.pt",
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["train", "crash", "wait"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--expect-torchrun", action="store_true")
    parser.add_argument("--rank0-sleeps", action="store_true")
    arguments = parser.parse_args()
    {"train": run_train, "crash": run_crash, "wait": run_wait}[arguments.mode](arguments)
    sys.exit(0)
