"""Trainer(strategy="ddp", devices=2) end to end. Run as a script: it starts rank 1 by re-running itself.

Every scenario named on the command line runs on every rank, one after the other in the same process
group, and each rank saves what it saw to ``<out>/<scenario>-rank<r>.pt`` for the test to check:

    equivalence  ranks seeded differently; SGD+momentum and Adam, accumulate 1 and 2; shuffle=True sharding;
                 and a hand-written DistributedDataParallel loop on the same process group
    evaluation   validate / test / predict over 101 samples (uneven); unequal training batch counts
    logging      sync_dist mean / sum / max / min; progress bar, self.print and TensorBoard on rank 0 only;
                 DataModule.prepare_data once per node, setup on every rank; synced values paired by name
                 (logged in different orders, on one rank only, a rank with no evaluation batch)
    decisions    ModelCheckpoint + EarlyStopping monitoring a metric that differs per rank
    resume       2 epochs + resume from last.ckpt to 4 == 4 epochs (shuffle, dropout, Adam); one file per save
    elastic      2 epochs shuffled, a checkpoint mid-epoch 1 (the test resumes it on one process, batch doubled);
                 and the one-process checkpoint the test wrote before the launch, resumed on 2 ranks
    prediction_writer  a BasePredictionWriter writing one file per rank: predictions and their dataset indices
    uneven       data of unknown length, 8 training batches on rank 0 and 5 on rank 1 (accumulate 1 and 3, a
                 limit), and 4 and 1 evaluation batches: fit, validate, test and predict
    true_half    precision="bf16-true": bfloat16 parameters, inputs and gradient all-reduce; the loss falls
    follow       ddp_follow_runs.py's patterns (DDP that follows the module), a fit each (in ``<out>/follow``)
    existing_group  existing_group.py's fit under tandem's own launch (one torch thread, as there): the weights of
               its fits in a process group someone else initialised (the script itself, Ray Train) must equal
    dirpath      tests/callbacks/scripts/ddp_dirpath.py: a ModelCheckpoint dirpath each rank builds from the clock
               and its pid, then test(ckpt_path="best") (in ``<out>/dirpath``)
    mismatch     (last: it ends in an error on every rank) a torchmetrics Metric logged on one rank only

``--hang-after`` bounds each scenario.
"""

from __future__ import annotations

import argparse
import faulthandler
import io
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import ddp_follow_runs
import existing_group as existing_group_programs
import torch
import torch.distributed as dist
import torch.nn.functional as F
from ddp_trainer_common import (
    BATCH,
    ELASTIC_STEP,
    EVAL_BATCH,
    EVAL_SAMPLES,
    TRAIN_SAMPLES,
    Net,
    RankSamples,
    SaveAtStep,
    dataset,
    elastic_trainer,
    weights,
)
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import tandem
from tandem.callbacks import BasePredictionWriter, EarlyStopping, ModelCheckpoint
from tandem.strategies import DDPStrategy
from tandem.strategies import strategy as strategy_module

QUIET = dict(
    accelerator="cpu",
    devices=2,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
)


def launched_rank() -> int:
    """The rank before the first fit (rank 1 is this script re-run with RANK set)."""
    return int(os.environ.get("RANK", "0"))


class Recorder(tandem.Callback):
    """What a rank saw: the weights and optimizer state when training starts, and each batch's samples."""

    def __init__(self) -> None:
        self.start: dict[str, torch.Tensor] = {}
        self.optimizer_start: dict[str, Any] = {}
        self.samples: list[list[float]] = []

    def on_train_start(self, trainer: tandem.Trainer, module: tandem.TrainingModule) -> None:
        self.start = weights(module)
        self.optimizer_start = trainer.optimizers[0].state_dict()

    def on_train_batch_start(self, trainer: tandem.Trainer, module: tandem.TrainingModule, batch: Any, i: int) -> None:
        self.samples.append(batch[0][:, 0].tolist())


# ---------------------------------------------------------------------------------------------- equivalence


def hand_written_ddp(epochs: int) -> dict[str, torch.Tensor]:
    """The torch recipe: DistributedDataParallel + DistributedSampler + SGD, on tandem's process group."""
    torch.manual_seed(launched_rank())  # DDP broadcasts rank 0's weights
    model = Net("sgd")
    ddp = DistributedDataParallel(model)
    data = dataset(TRAIN_SAMPLES)
    sampler = DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=model.hparams.lr, momentum=0.9)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return weights(model)


def equivalence(out: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for optimizer in ("sgd", "adam"):
        for k in (1, 2):
            tandem.seed_everything(1000 * launched_rank())  # rank 0: seed 0, rank 1: seed 1000
            model = Net(optimizer)
            init = weights(model)
            recorder = Recorder()
            trainer = tandem.Trainer(
                strategy="ddp",
                max_epochs=2,
                accumulate_grad_batches=k,
                callbacks=[recorder],
                data_order="global",  # one process draws the same order: the comparison with it
                **QUIET,
            )
            trainer.fit(model, DataLoader(dataset(TRAIN_SAMPLES), batch_size=BATCH, shuffle=False))
            results[f"{optimizer}-k{k}"] = {
                "init": init,
                "start": recorder.start,
                "final": weights(model),
                "steps": trainer.global_step,
                "samples": recorder.samples,
            }
    results["hand_written"] = hand_written_ddp(epochs=2)
    # shuffle=True: the ranks' seeds differ, yet they must draw one permutation and split it
    recorder = Recorder()
    trainer = tandem.Trainer(strategy="ddp", max_epochs=2, callbacks=[recorder], **QUIET)
    trainer.fit(Net(), DataLoader(dataset(TRAIN_SAMPLES), batch_size=BATCH, shuffle=True))
    results["shuffled_samples"] = recorder.samples
    # shuffle=False, the default order: Lightning's training DistributedSampler shuffles all the same
    recorder = Recorder()
    trainer = tandem.Trainer(strategy="ddp", max_epochs=1, callbacks=[recorder], **QUIET)
    trainer.fit(Net(), DataLoader(dataset(TRAIN_SAMPLES), batch_size=BATCH, shuffle=False))
    results["unshuffled_default"] = recorder.samples
    return results


# ---------------------------------------------------------------------------------------------- evaluation


def evaluation(out: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Net()
    trainer = tandem.Trainer(strategy="ddp", **QUIET)
    loader = DataLoader(dataset(EVAL_SAMPLES, seed=2), batch_size=EVAL_BATCH)
    result: dict[str, Any] = {"weights": weights(model)}
    result["validate"] = trainer.validate(model, loader)
    result["test"] = trainer.test(model, loader)
    result["val_batches"] = trainer.num_val_batches
    result["predict"] = trainer.predict(model, loader)
    # one sample per batch: 51 batches on rank 0, 50 on rank 1, each logging a step-level synced value
    result["validate_batch_1"] = trainer.validate(model, DataLoader(dataset(EVAL_SAMPLES, seed=2), batch_size=1))

    # unequal training batch counts (the user shards by hand): 5 and 8 batches are evened to 5
    rank = trainer.global_rank
    mine = dataset(20 + 12 * rank, seed=3 + rank)
    uneven = tandem.Trainer(strategy="ddp", max_epochs=2, use_distributed_sampler=False, **QUIET)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        uneven.fit(Net(), DataLoader(mine, batch_size=4))
    result["uneven_steps"] = uneven.global_step
    result["uneven_warnings"] = [str(w.message) for w in caught if "different numbers" in str(w.message)]
    return result


# ---------------------------------------------------------------------------------------------- logging


class CountingDDP(DDPStrategy):
    """Counts the reductions (all its instances), and its own packed reductions the ranks agreed on and gatherings:
    the MetricCollector's values travel in a packed one when every rank sends the same names, else in a gathering."""

    reductions = 0

    def __init__(self) -> None:
        super().__init__()
        self.packed = self.gatherings = 0

    def reduce(self, tensor: torch.Tensor, reduce_op: str = "mean") -> torch.Tensor:
        CountingDDP.reductions += 1
        return super().reduce(tensor, reduce_op)

    def reduce_if_agreed(self, *args: Any) -> Any:
        reduced = super().reduce_if_agreed(*args)
        self.packed += reduced is not None
        return reduced

    def all_gather_object(self, obj: Any) -> list[Any]:
        self.gatherings += 1
        return super().all_gather_object(obj)


class Logs(Net):
    """Rank r logs v = (r + 1) * (batch_idx + 1) with weight r + 1 at every step."""

    def __init__(self) -> None:
        super().__init__()
        self.step_values: list[float] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        rank = self.trainer.global_rank
        value = float((rank + 1) * (batch_idx + 1))
        for fx in ("mean", "sum", "max", "min"):
            self.log(f"v_{fx}", value, on_step=False, on_epoch=True, sync_dist=True, reduce_fx=fx, batch_size=rank + 1)
        self.log("v_step", value, on_step=True, on_epoch=False, sync_dist=True)
        self.step_values.append(float(self.trainer.callback_metrics["v_step"]))
        return super().training_step(batch, batch_idx)

    def on_train_epoch_end(self) -> None:
        self.print(f"tandem-print epoch {self.current_epoch}")


class Unordered(Net):
    """Rank 0 logs a then b, rank 1 logs b then a; ``lonely`` is logged on rank 0 only."""

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        rank = self.trainer.global_rank
        values = {"a": 1.0 + 2 * rank, "b": 100.0 + 200 * rank}  # summed over the ranks: a 4, b 400
        for name in ("a", "b") if rank == 0 else ("b", "a"):
            self.log(f"{name}_sum", values[name], on_step=False, on_epoch=True, sync_dist=True, reduce_fx="sum")
            self.log(f"{name}_step", values[name] * (batch_idx + 1), on_step=True, on_epoch=False, sync_dist=True)
        if rank == 0:
            self.log("lonely", 5.0, on_step=True, on_epoch=True, sync_dist=True)
        return super().training_step(batch, batch_idx)


class LossOnly(Net):
    """Validation logs a synced mean and sum, no torchmetrics Metric."""

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), sync_dist=True)
        self.log("val_count", float(len(y)), sync_dist=True, reduce_fx="sum")


class StepValues(tandem.Callback):
    """The published (synced) step values after each batch."""

    def __init__(self) -> None:
        self.seen: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.seen.append({k: float(trainer.callback_metrics[k]) for k in ("a_step", "b_step", "lonely_step")})


def paired_by_name() -> dict[str, Any]:
    torch.manual_seed(0)
    steps, strategy = StepValues(), CountingDDP()
    trainer = tandem.Trainer(strategy=strategy, max_epochs=1, log_every_n_steps=1, callbacks=[steps], **QUIET)
    trainer.fit(Unordered(), DataLoader(dataset(32), batch_size=BATCH))
    gatherings = strategy.gatherings
    epoch = {k: float(v) for k, v in trainer.callback_metrics.items() if k in ("a_sum", "b_sum", "lonely_epoch")}
    model = LossOnly()
    one_sample = trainer.validate(model, DataLoader(dataset(1, seed=2), batch_size=1))  # rank 1 has no batch
    return {
        "steps": steps.seen,
        "epoch": epoch,
        "batches": trainer.num_training_batches,
        "gatherings": gatherings,
        "one_sample": one_sample,
        "one_sample_weights": weights(model),
    }


class Prepared(tandem.DataModule):
    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.marker = folder / "prepared.txt"
        self.prepared = 0
        self.stages: list[str] = []

    def prepare_data(self) -> None:
        time.sleep(0.5)  # the other rank must wait, not run ahead into setup
        self.marker.write_text(str(os.getpid()))
        self.prepared += 1

    def setup(self, stage: str) -> None:
        assert self.marker.exists(), "setup ran before prepare_data finished on local rank 0"
        self.stages.append(stage)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(dataset(64), batch_size=BATCH)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(dataset(EVAL_SAMPLES, seed=2), batch_size=EVAL_BATCH)


class Tee(io.TextIOBase):
    """Writes through to ``stream`` and keeps a copy: what this process printed."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.copy = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False


def logging(out: Path) -> dict[str, Any]:
    root = out / "logging"
    root.mkdir(exist_ok=True)
    model, data = Logs(), Prepared(out)
    strategy = CountingDDP()
    trainer = tandem.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=2,
        max_epochs=2,
        default_root_dir=root,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Tee(stdout), Tee(stderr)
    try:
        trainer.fit(model, datamodule=data)
    finally:
        printed = sys.stdout.copy.getvalue() + sys.stderr.copy.getvalue()
        sys.stdout, sys.stderr = stdout, stderr
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("v_")}
    packed, gatherings = strategy.packed, strategy.gatherings
    trainer.validate(model, datamodule=data)
    return {
        "metrics": metrics,
        "step_values": model.step_values,
        "batches": trainer.num_training_batches,
        "reductions": CountingDDP.reductions,
        "packed": packed,
        "gatherings": gatherings,
        "printed": printed,
        "prepared": data.prepared,
        "stages": data.stages,
        "log_dir": trainer.log_dir,
        "paired": paired_by_name(),
    }


# ---------------------------------------------------------------------------------------------- decisions


class RankScore(Net):
    """Logs ``score`` without sync_dist: rank 0 improves for two epochs, then worsens; rank 1 keeps improving.
    And ``drift``: rank 0 improves every epoch, rank 1 worsens (see decisions_lightning.py, Lightning's run)."""

    RANK0 = (5.0, 4.0, 4.5, 4.6, 4.7, 4.8, 4.9, 5.0)

    def on_train_epoch_end(self) -> None:
        epoch, rank = self.current_epoch, self.trainer.global_rank
        self.log("score", self.RANK0[epoch] if rank == 0 else 3.0 - 0.25 * epoch)
        self.log("drift", 5.0 - epoch if rank == 0 else 1.0 + epoch)


def decisions(out: Path) -> dict[str, Any]:
    folder = out / "decisions"
    checkpoint = ModelCheckpoint(
        dirpath=folder, monitor="score", mode="min", save_top_k=2, filename="{epoch}-{score:.2f}"
    )
    drift = ModelCheckpoint(dirpath=folder / "drift", monitor="drift", save_top_k=2, filename="{epoch}-{drift:.2f}")
    stopping = EarlyStopping("score", patience=2, mode="min")
    trainer = tandem.Trainer(
        strategy="ddp",
        max_epochs=8,
        callbacks=[checkpoint, drift, stopping],
        **{**QUIET, "enable_checkpointing": True},
    )
    trainer.fit(RankScore(), DataLoader(dataset(32), batch_size=BATCH))

    class StopOnRankOne(tandem.Callback):  # a user's stop on one rank only, mid-epoch
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_rank == 1 and trainer.current_epoch == 1 and batch_idx == 0:
                trainer.should_stop = True

    one_rank_stop = tandem.Trainer(strategy="ddp", max_epochs=8, callbacks=[StopOnRankOne()], **QUIET)
    one_rank_stop.fit(RankScore(), DataLoader(dataset(32), batch_size=BATCH))
    return {
        "one_rank_stop_epochs": one_rank_stop.current_epoch,
        "one_rank_stop_steps": one_rank_stop.global_step,
        "epochs": trainer.current_epoch,
        "stopped_epoch": stopping.stopped_epoch,
        "best_model_path": checkpoint.best_model_path,
        "best_model_score": checkpoint.best_model_score,
        "best_k_models": dict(checkpoint.best_k_models),
        "kth_value": checkpoint.kth_value,
        "drift": {
            "best_model_path": drift.best_model_path,
            "best_model_score": drift.best_model_score,
            "best_k_models": dict(drift.best_k_models),
            "kth_value": drift.kth_value,
        },
    }


# ---------------------------------------------------------------------------------------------- resume


def resume(out: Path) -> dict[str, Any]:
    writes = []
    save = strategy_module.atomic_save

    def counting_save(obj: Any, path: Any) -> None:
        writes.append(os.path.basename(path))
        save(obj, path)

    strategy_module.atomic_save = counting_save

    def run(folder: str, epochs: int, ckpt_path: str | None = None) -> tuple[Recorder, Net]:
        tandem.seed_everything(7)
        model, recorder = Net("adam", lr=0.01, dropout=0.3), Recorder()
        checkpoint = ModelCheckpoint(save_top_k=-1, save_last=True)
        trainer = tandem.Trainer(
            strategy="ddp",
            max_epochs=epochs,
            callbacks=[checkpoint, recorder],
            default_root_dir=out / folder,
            **{**QUIET, "enable_checkpointing": True},
        )
        trainer.fit(model, DataLoader(dataset(TRAIN_SAMPLES), batch_size=BATCH, shuffle=True), ckpt_path=ckpt_path)
        return recorder, model

    _, whole = run("whole", 4)
    _, first_half = run("halves", 2)
    writes_before_resume = list(writes)
    restored, resumed = run("halves", 4, ckpt_path="last")
    strategy_module.atomic_save = save
    return {
        "whole": weights(whole),
        "first_half": weights(first_half),
        "restored": restored.start,
        "restored_optimizer": restored.optimizer_start,
        "resumed": weights(resumed),
        "writes_first_half": writes_before_resume,
    }


# ---------------------------------------------------------------------------------------------- elastic


def elastic(out: Path) -> dict[str, Any]:
    """In each data order: 2 ranks x batch 4, shuffled: the whole run, saving ``elastic-two-<order>.ckpt`` mid-epoch;
    then ``elastic-one-<order>.ckpt`` (one process x batch 8, written by the test before the launch) resumed here on 2
    ranks x batch 4."""
    results: dict[str, Any] = {}
    for order in ("sampler", "global"):
        loader = DataLoader(dataset(TRAIN_SAMPLES), batch_size=BATCH, shuffle=True)
        tandem.seed_everything(11)
        model = Net("adam", lr=0.01)
        saver = SaveAtStep(ELASTIC_STEP, str(out / f"elastic-two-{order}.ckpt"))
        csv = out / f"elastic-csv-two-{order}"
        trainer = elastic_trainer(strategy="ddp", devices=2, callbacks=[saver], csv=csv, data_order=order)
        trainer.fit(model, loader)
        whole = weights(model)
        tandem.seed_everything(99)  # the checkpoint's order and weights, whatever this run's seed
        model = Net("adam", lr=0.01)
        trainer = elastic_trainer(strategy="ddp", devices=2, csv=out / f"elastic-csv-one-{order}", data_order=order)
        trainer.fit(model, loader, ckpt_path=out / f"elastic-one-{order}.ckpt")
        results[order] = {"whole": whole, "from_one": weights(model), "global_step": trainer.global_step}
    return results


# ---------------------------------------------------------------------------------------------- prediction_writer


class PredictionFiles(BasePredictionWriter):
    """Lightning's multi-device recipe: each rank saves its predictions and their dataset indices to its own file."""

    def __init__(self, folder: Path) -> None:
        super().__init__("batch_and_epoch")
        self.folder = folder
        self.batch_writes: list[list[int]] = []

    def write_on_batch_end(self, trainer, module, prediction, batch_indices, batch, batch_idx, dataloader_idx) -> None:
        self.batch_writes.append(list(batch_indices))

    def write_on_epoch_end(self, trainer, module, predictions, batch_indices) -> None:
        state = {"predictions": predictions, "batch_indices": batch_indices}
        torch.save(state, self.folder / f"predictions-rank{trainer.global_rank}.pt")


def prediction_writer(out: Path) -> dict[str, Any]:
    folder = out / "predictions"
    folder.mkdir(exist_ok=True)
    writer = PredictionFiles(folder)
    torch.manual_seed(0)
    trainer = tandem.Trainer(strategy="ddp", callbacks=[writer], **QUIET)
    returned = trainer.predict(Net(), DataLoader(dataset(EVAL_SAMPLES, seed=2), batch_size=EVAL_BATCH))
    return {"batch_writes": writer.batch_writes, "returned": returned}


# ---------------------------------------------------------------------------------------------- uneven

UNEVEN_TRAIN, UNEVEN_EVAL = (8 * BATCH, 5 * BATCH), (4 * EVAL_BATCH, EVAL_BATCH)  # samples per rank


def uneven(out: Path) -> dict[str, Any]:
    """Loaders of unknown length giving the ranks different numbers of batches: training, with validation at
    each epoch end, must end every epoch on all ranks together; evaluation runs each rank's own batches."""
    result: dict[str, Any] = {}

    class Validations(tandem.Callback):
        def __init__(self) -> None:
            self.at: list[int] = []

        def on_validation_start(self, trainer: tandem.Trainer, module: tandem.TrainingModule) -> None:
            self.at.append(trainer.global_step)

    for k in (1, 3):  # 5 batches and k=3: rank 1 runs out in the second accumulation window
        torch.manual_seed(0)
        model, recorder, validations = Net(), Recorder(), Validations()
        trainer = tandem.Trainer(
            strategy="ddp",
            max_epochs=2,
            accumulate_grad_batches=k,
            val_check_interval=5 if k == 1 else 2,  # k=1: batch 5 is the evened epoch's last: validated once
            callbacks=[recorder, validations],
            **QUIET,
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(
                model,
                DataLoader(RankSamples(UNEVEN_TRAIN, seed=4), batch_size=BATCH),
                DataLoader(RankSamples(UNEVEN_EVAL, seed=5), batch_size=EVAL_BATCH),
            )
        result[f"k{k}"] = {
            "steps": trainer.global_step,
            "final": weights(model),
            "samples": recorder.samples,
            "grads_left": [n for n, p in model.named_parameters() if p.grad is not None],
            "validated_at": list(validations.at),  # (the validate call below adds to it)
            "val": {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")},
            "warnings": [str(w.message) for w in caught if "different numbers" in str(w.message)],
        }
    limited = tandem.Trainer(strategy="ddp", max_epochs=1, limit_train_batches=4, limit_val_batches=0, **QUIET)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        limited.fit(Net(), DataLoader(RankSamples(UNEVEN_TRAIN, seed=4), batch_size=BATCH))
    result["limited"] = {"steps": limited.global_step, "warnings": [str(w.message) for w in caught]}
    evaluation = DataLoader(RankSamples(UNEVEN_EVAL, seed=5), batch_size=EVAL_BATCH)
    result["validate"] = trainer.validate(model, evaluation)
    result["test"] = trainer.test(model, evaluation)
    result["predict"] = trainer.predict(model, evaluation)
    return result


# ---------------------------------------------------------------------------------------------- mismatch


def true_half(out: Path) -> dict[str, Any]:
    tandem.seed_everything(1000 * launched_rank())  # ranks seeded differently: DDP starts them from rank 0's
    losses, inputs = [], set()

    class Record(tandem.Callback):
        def on_train_batch_start(self, trainer: tandem.Trainer, module: tandem.TrainingModule, batch: Any, i: int):
            inputs.add((batch[0].dtype, batch[1].dtype))

        def on_train_epoch_end(self, trainer: tandem.Trainer, module: tandem.TrainingModule) -> None:
            losses.append(float(trainer.callback_metrics["train_loss_epoch"]))

    class EpochLoss(Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = F.cross_entropy(self(batch[0]), batch[1])
            self.log("train_loss_epoch", loss, on_step=False, on_epoch=True, sync_dist=True)
            return loss

    trainer = tandem.Trainer(
        strategy="ddp", max_epochs=3, precision="bf16-true", limit_val_batches=0, callbacks=[Record()], **QUIET
    )
    with trainer.init_module():
        model = EpochLoss()
    built = {p.dtype for p in model.parameters()}
    trainer.fit(model, DataLoader(dataset(TRAIN_SAMPLES), batch_size=BATCH))
    return {
        "built": built,
        "final": weights(model),
        "inputs": inputs,
        "losses": losses,
        "default_dtype": torch.get_default_dtype(),
    }


# ---------------------------------------------------------------------------------------------- follow


def follow(out: Path) -> dict[str, Any]:
    """Each pattern of ``ddp_follow_runs.py``, one fit after the other: what this rank ended with, by pattern."""
    (out / "follow").mkdir(exist_ok=True)  # both ranks make it: the first one does
    tandem.seed_everything(0)
    rank = dist.get_rank()
    return {p: ddp_follow_runs.fit(p, devices=2, rank=rank, root=out / "follow") for p in ddp_follow_runs.PATTERNS}


# ---------------------------------------------------------------------------------------------- existing_group


def existing_group(out: Path) -> dict[str, Any]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the fits it is compared with run with OMP_NUM_THREADS=1
    try:
        return {"weights": weights(existing_group_programs.fit())}
    finally:
        torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------- dirpath


def dirpath(out: Path) -> dict[str, Any]:
    callback_scripts = str(Path(__file__).resolve().parents[2] / "callbacks" / "scripts")
    sys.path.insert(0, callback_scripts)
    try:
        import ddp_dirpath
    finally:
        sys.path.remove(callback_scripts)
    return ddp_dirpath.run(out / "dirpath")


def mismatch(out: Path) -> dict[str, Any]:
    """Net logs a torchmetrics accuracy in validation; with one sample, rank 1 never logs it. Every rank
    must raise the same clear error (not hang in torchmetrics' collective). Run last: rank 0's error
    ends the job."""
    trainer = tandem.Trainer(strategy="ddp", **QUIET)
    started = time.perf_counter()
    try:
        trainer.validate(Net(), DataLoader(dataset(1, seed=2), batch_size=1))
    except Exception as error:  # noqa: BLE001 - the test checks its type and text
        return {"error": f"{type(error).__name__}: {error}", "error_seconds": time.perf_counter() - started}
    return {"error": None}


SCENARIOS = {
    f.__name__: f
    for f in (
        equivalence,
        evaluation,
        logging,
        decisions,
        resume,
        elastic,
        prediction_writer,
        uneven,
        true_half,
        follow,
        existing_group,
        dirpath,
        mismatch,
    )
}

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--hang-after", type=float, default=120.0, help="print every thread's stack and exit")
    arguments = parser.parse_args()
    folder = Path(arguments.out)
    for name in arguments.scenarios:
        faulthandler.dump_traceback_later(arguments.hang_after, exit=True)  # a hang fails with its stack shown
        started = time.perf_counter()
        result = SCENARIOS[name](folder)
        result["seconds"] = time.perf_counter() - started
        result["world_size"] = dist.get_world_size()
        torch.save(result, folder / f"{name}-rank{dist.get_rank()}.pt")
