"""Trainer(strategy="fsdp", devices=2) end to end. Run as a script: it starts rank 1 by re-running itself.

Every scenario named on the command line runs on every rank, one after the other in the same process
group; each rank saves what it saw to ``<out>/<scenario>-rank<r>.pt`` for the test to check:

    equivalence     Adam, accumulate 2, clipping by norm, two schedulers, validation mid-epoch (uneven),
                    ranks seeded differently: DDP, FSDP with a wrap policy, and FSDP with activation
                    checkpointing, no resharding after forward and CPU offload, in one process group
    evaluation      validate / test / predict over 101 samples (uneven: the ranks' FSDP forwards stay in
                    step), then another Trainer fits the sharded module; one validation sample (rank 1 has
                    no batch at all)
    init            trainer.init_module(empty_init=True) (meta parameters, materialised per shard) and a
                    module that builds and shards its layers in configure_model(); what a dropped run frees
    resume_full     2 epochs + resume from last.ckpt to 4 == 4 epochs (shuffle, dropout, Adam), full
                    checkpoints; DDP resumes from FSDP's file
    resume_sharded  the same with sharded checkpoint directories
    elastic         2 epochs shuffled (sharded checkpoints, no dropout), saving mid-epoch 1: the test resumes that
                    checkpoint on one FSDP process with the batch doubled
    export          after a sharded fit: save_checkpoint(weights_only=True) writes the whole weights; rank 0
                    alone calling the sharded module or its state_dict() gets an error naming the ways out
    true_half       precision="bf16-true" with trainer.init_module(empty_init=True): bfloat16 shards, the loss
                    falls, the checkpoint holds bfloat16 weights
    compiled        trainer.fit(torch.compile(module)) trains and validates as the eager fit
    crash           (last: it ends the job) rank 1 raises at its third step
"""

from __future__ import annotations

import argparse
import copy
import faulthandler
import gc
import os
import shutil
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ddp_trainer_common import BATCH, EVAL_BATCH, EVAL_SAMPLES, TRAIN_SAMPLES, Net, SaveAtStep, dataset
from torch import nn
from torch.utils.data import DataLoader

import tandem
from tandem.callbacks import ModelCheckpoint
from tandem.strategies import FSDPStrategy

QUIET = dict(
    accelerator="cpu",
    devices=2,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
    data_order="global",  # the order one process draws: the runs are compared with one process
)
FIT = dict(max_epochs=2, accumulate_grad_batches=2, gradient_clip_val=0.5, val_check_interval=0.5)
RESUME_SAMPLES = 96  # per rank: 12 batches of 4 an epoch
ELASTIC_STEP = 18  # the elastic scenario's checkpoint: epoch 1, after its 6th batch
EXPORT_SAMPLES = 16


def launched_rank() -> int:
    return int(os.environ.get("RANK", "0"))


class Scheduled(Net):
    """Net with a per-epoch and a per-step (every 2 steps) scheduler."""

    def configure_optimizers(self) -> Any:
        optimizer = super().configure_optimizers()
        epochly = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        stepwise = torch.optim.lr_scheduler.MultiplicativeLR(optimizer, lambda step: 0.97)
        return [optimizer], [epochly, {"scheduler": stepwise, "interval": "step", "frequency": 2}]


class Configured(Net):
    """Builds its layers in configure_model and shards each Linear itself (once: the hook runs per stage)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = None

    def configure_model(self) -> None:
        if self.net is not None:
            return
        torch.manual_seed(5)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        from torch.distributed.fsdp import fully_shard

        for layer in (self.net[0], self.net[2]):
            fully_shard(layer, mesh=self.trainer.strategy.device_mesh)


class Recorder(tandem.Callback):
    """The whole weights and optimizer state when training starts (rank 0 gets them under FSDP)."""

    def __init__(self) -> None:
        self.start: dict[str, torch.Tensor] = {}
        self.optimizer_start: dict[str, Any] = {}
        self.global_step_start = -1

    def on_train_start(self, trainer: tandem.Trainer, module: tandem.TrainingModule) -> None:
        self.start = full_weights(trainer)
        self.optimizer_start = full_optimizer_state(trainer)
        self.global_step_start = trainer.global_step


def full_weights(trainer: tandem.Trainer) -> dict[str, torch.Tensor]:
    """Every rank calls this (FSDP gathers); rank 0 gets the weights, the others ``{}`` under FSDP."""
    return {k: v.detach().clone().cpu() for k, v in trainer.strategy.full_module_state_dict().items()}


def full_optimizer_state(trainer: tandem.Trainer) -> dict[str, Any]:
    strategy = trainer.strategy
    kind = getattr(strategy, "state_dict_type", None)
    if kind is not None:
        strategy.state_dict_type = "full"  # the gathered state, in torch's numbered format
    try:
        return copy.deepcopy(strategy.optimizer_state(trainer.optimizers[0]))  # Adam's step counts in place
    finally:
        if kind is not None:
            strategy.state_dict_type = kind


def fsdp_groups(trainer: tandem.Trainer) -> int:
    from torch.distributed.fsdp import FSDPModule

    return sum(isinstance(m, FSDPModule) for m in trainer.model.modules())


def val_loader() -> DataLoader:
    return DataLoader(dataset(EVAL_SAMPLES, seed=2), batch_size=EVAL_BATCH)


# ---------------------------------------------------------------------------------------------- equivalence


def equivalence(out: Path) -> dict[str, Any]:
    strategies = {
        "ddp": lambda: "ddp",
        "fsdp": lambda: FSDPStrategy(auto_wrap_policy={nn.Linear}),
        "fsdp-ac-offload": lambda: FSDPStrategy(
            activation_checkpointing_policy={nn.Linear}, reshard_after_forward=False, cpu_offload=True
        ),
    }
    results: dict[str, Any] = {}
    for name, make in strategies.items():
        tandem.seed_everything(1000 * launched_rank())  # rank 0: seed 0, rank 1: seed 1000
        model, recorder = Scheduled("adam"), Recorder()
        trainer = tandem.Trainer(strategy=make(), callbacks=[recorder], **FIT, **{**QUIET, "num_sanity_val_steps": 2})
        trainer.fit(model, DataLoader(dataset(TRAIN_SAMPLES), batch_size=BATCH), val_loader())
        results[name] = {
            "start": recorder.start,
            "final": full_weights(trainer),
            "steps": trainer.global_step,
            "lr": trainer.optimizers[0].param_groups[0]["lr"],
            "val_loss": float(trainer.callback_metrics["val_loss"]),
            "groups": fsdp_groups(trainer) if name != "ddp" else 0,
        }
    return results


# ---------------------------------------------------------------------------------------------- evaluation


def evaluation(out: Path) -> dict[str, Any]:
    from ddp_trainer_runs import LossOnly

    torch.manual_seed(0)
    model = Net()
    trainer = tandem.Trainer(strategy=FSDPStrategy(auto_wrap_policy={nn.Linear}), **QUIET)
    result: dict[str, Any] = {"validate": trainer.validate(model, val_loader())}
    result["weights"] = full_weights(trainer)
    result["test"] = trainer.test(model, val_loader())
    result["predict"] = trainer.predict(model, val_loader())
    result["val_batches"] = trainer.num_val_batches
    # the module is still sharded (its groups left gathered by the evaluation): another Trainer trains it
    again = tandem.Trainer(strategy=FSDPStrategy(auto_wrap_policy={nn.Linear}), max_epochs=1, **QUIET)
    again.fit(model, DataLoader(dataset(32), batch_size=BATCH))
    result["steps_after_evaluation"] = again.global_step
    torch.manual_seed(0)
    lonely = LossOnly()
    one = tandem.Trainer(strategy="fsdp", **QUIET)
    result["one_sample"] = one.validate(lonely, DataLoader(dataset(1, seed=2), batch_size=1))
    result["one_sample_weights"] = full_weights(one)
    return result


def compiled(out: Path) -> dict[str, Any]:
    """The same fit eager and as ``trainer.fit(torch.compile(module))`` (backend aot_eager: no C++ builds here):
    the FSDP root compiled, its groups' hooks running between the compiled pieces; then a validation."""
    graphs: list[int] = []
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(graph: torch.fx.GraphModule, example_inputs: list) -> Any:
        graphs.append(len(graph.graph.nodes))
        return aot_eager(graph, example_inputs)

    results: dict[str, Any] = {}
    for name in ("eager", "compiled"):
        torch.manual_seed(0)
        model = Net()
        trainer = tandem.Trainer(strategy=FSDPStrategy(auto_wrap_policy={nn.Linear}), max_epochs=1, **QUIET)
        given = torch.compile(model, backend=backend) if name == "compiled" else model
        trainer.fit(given, DataLoader(dataset(TRAIN_SAMPLES), batch_size=BATCH))
        results[name] = {
            "final": full_weights(trainer),
            "validate": trainer.validate(given, val_loader(), verbose=False),
        }
    results["graphs"] = len(graphs)
    return results


# ---------------------------------------------------------------------------------------------- init


def init(out: Path) -> dict[str, Any]:
    tandem.seed_everything(1000 * launched_rank())
    recorder = Recorder()
    trainer = tandem.Trainer(
        strategy=FSDPStrategy(auto_wrap_policy={nn.Linear}), max_epochs=1, callbacks=[recorder], **QUIET
    )
    with trainer.init_module(empty_init=True):
        model = Net("sgd")
    meta = [p.is_meta for p in model.parameters()]
    metric_device = model.val_acc.tp.device.type  # torchmetrics states are built for real
    trainer.fit(model, DataLoader(dataset(TRAIN_SAMPLES), batch_size=BATCH))
    result: dict[str, Any] = {"meta": meta, "metric_device": metric_device, "start": recorder.start}
    result["final"] = full_weights(trainer)
    result["validate"] = trainer.validate(model, val_loader())

    try:
        result["configured"], refs = configured()
        # The run's objects were dropped with Python's garbage collector off: what is freed at once, and what only
        # by a collection (torch's fully_shard keeps a sharded module in cycles with its FSDP state and hooks).
        result["memory"] = {name: ref() is not None for name, ref in refs.items()}
        gc.collect()
        result["memory"]["module_after_collect"] = refs["module"]() is not None
    finally:
        gc.enable()
    return result


def configured() -> tuple[dict[str, Any], dict[str, weakref.ref]]:
    """A module that shards itself in configure_model; returns with the garbage collector off."""
    model, recorder = Configured(), Recorder()
    trainer = tandem.Trainer(strategy="fsdp", max_epochs=1, callbacks=[recorder], **QUIET)
    trainer.fit(model, DataLoader(dataset(TRAIN_SAMPLES), batch_size=BATCH))
    result = {"start": recorder.start, "final": full_weights(trainer), "groups": fsdp_groups(trainer)}
    result["validate"] = trainer.validate(model, val_loader())  # configure_model again: no-op
    refs = {
        "trainer": weakref.ref(trainer),
        "optimizer": weakref.ref(trainer.optimizers[0]),
        "module": weakref.ref(model),
    }
    gc.collect()
    gc.disable()  # the caller turns it back on; returning drops the run
    return result, refs


# ---------------------------------------------------------------------------------------------- resume


def resume(out: Path, state_dict_type: str) -> dict[str, Any]:
    def run(folder: str, epochs: int, ckpt_path: str | None = None, strategy: Any = None) -> tuple[Recorder, Any]:
        tandem.seed_everything(7)
        model, recorder = Net("adam", lr=0.01, dropout=0.3), Recorder()
        checkpoint = ModelCheckpoint(save_top_k=-1, save_last=True)
        strategy = strategy or FSDPStrategy(auto_wrap_policy={nn.Linear}, state_dict_type=state_dict_type)
        trainer = tandem.Trainer(
            strategy=strategy,
            max_epochs=epochs,
            callbacks=[checkpoint, recorder],
            default_root_dir=out / folder,
            **{**QUIET, "enable_checkpointing": True},
        )
        trainer.fit(model, DataLoader(dataset(RESUME_SAMPLES), batch_size=BATCH, shuffle=True), ckpt_path=ckpt_path)
        return recorder, trainer

    _, whole = run(f"{state_dict_type}-whole", 4)
    first, first_half = run(f"{state_dict_type}-halves", 2)
    result: dict[str, Any] = {
        "whole": full_weights(whole),
        "first_half": full_weights(first_half),
        "first_half_optimizer": full_optimizer_state(first_half),
    }
    restored, resumed = run(f"{state_dict_type}-halves", 4, ckpt_path="last")
    result.update(
        resumed=full_weights(resumed),
        restored=restored.start,
        restored_optimizer=restored.optimizer_start,
        restored_step=restored.global_step_start,
        last_model_path=resumed.checkpoint_callback.last_model_path,
    )
    if state_dict_type == "full":  # DDP and FSDP each resume from FSDP's file for one more epoch
        saved = out / "fsdp-epoch1.ckpt"
        if launched_rank() == 0:
            shutil.copy(out / "full-halves" / "checkpoints" / "epoch=1-step=24.ckpt", saved)
        resumed.strategy.barrier()
        _, by_ddp = run("full-ddp", 3, ckpt_path=str(saved), strategy="ddp")
        _, by_fsdp = run("full-fsdp", 3, ckpt_path=str(saved))
        result.update(by_ddp=full_weights(by_ddp), by_fsdp=full_weights(by_fsdp))
    return result


def resume_full(out: Path) -> dict[str, Any]:
    return resume(out, "full")


def resume_sharded(out: Path) -> dict[str, Any]:
    return resume(out, "sharded")


def elastic(out: Path) -> dict[str, Any]:
    """2 ranks x batch 4, shuffled, sharded checkpoints: the whole run, saving ``elastic-fsdp.ckpt`` after the
    ``ELASTIC_STEP``-th step (mid-epoch 1)."""
    tandem.seed_everything(11)
    model = Net("adam", lr=0.01)
    strategy = FSDPStrategy(auto_wrap_policy={nn.Linear}, state_dict_type="sharded")
    saver = SaveAtStep(ELASTIC_STEP, str(out / "elastic-fsdp.ckpt"))
    trainer = tandem.Trainer(strategy=strategy, max_epochs=2, callbacks=[saver], **QUIET)
    trainer.fit(model, DataLoader(dataset(RESUME_SAMPLES), batch_size=BATCH, shuffle=True))
    return {"whole": full_weights(trainer)}


# ---------------------------------------------------------------------------------------------- export


def export(out: Path) -> dict[str, Any]:
    """After a sharded fit: the whole weights by trainer.save_checkpoint(weights_only=True), and what rank 0
    alone is told when it reads or calls the still sharded module (the README's ddp idiom)."""
    from tandem.utilities.exceptions import TandemUserCodeError

    torch.manual_seed(0)
    model = Net("sgd")
    trainer = tandem.Trainer(
        strategy=FSDPStrategy(auto_wrap_policy={nn.Linear}, state_dict_type="sharded"), max_epochs=1, **QUIET
    )
    trainer.fit(model, DataLoader(dataset(EXPORT_SAMPLES), batch_size=BATCH))
    path = out / "export-weights.ckpt"
    trainer.save_checkpoint(path, weights_only=True)  # every rank: one file with the whole weights
    result: dict[str, Any] = {"path": str(path), "full": full_weights(trainer), "errors": {}}
    if trainer.is_global_zero:
        x = torch.randn(2, 8)
        for what, call in {
            "state_dict": model.state_dict,
            "forward": lambda: model(x),
            "layer": lambda: model.net[3](torch.randn(2, 16)),  # a group of its own: would wait for rank 1
        }.items():
            try:
                call()
                result["errors"][what] = None
            except TandemUserCodeError as err:
                result["errors"][what] = str(err)
    trainer.strategy.barrier()
    # the Trainer runs the sharded module as before
    result["validate"] = trainer.validate(model, DataLoader(dataset(EXPORT_SAMPLES, seed=2), batch_size=EVAL_BATCH))
    return result


# ---------------------------------------------------------------------------------------------- crash


class Crashing(Net):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_rank == 1 and batch_idx == 2:
            raise RuntimeError("fsdp-crash-test: rank 1 fails on purpose")
        return super().training_step(batch, batch_idx)


def crash(out: Path) -> dict[str, Any]:
    (out / f"crash-started-rank{launched_rank()}").write_text(str(time.time()))
    trainer = tandem.Trainer(strategy="fsdp", max_epochs=1, **QUIET)
    trainer.fit(Crashing(), DataLoader(dataset(TRAIN_SAMPLES), batch_size=BATCH))
    return {}


def true_half(out: Path) -> dict[str, Any]:
    tandem.seed_everything(0)
    losses: list[float] = []

    class Record(tandem.Callback):
        def on_train_epoch_end(self, trainer: tandem.Trainer, module: tandem.TrainingModule) -> None:
            losses.append(float(trainer.callback_metrics["train_loss"]))

    trainer = tandem.Trainer(
        strategy=FSDPStrategy(auto_wrap_policy={nn.Linear}),
        precision="bf16-true",
        max_epochs=3,
        limit_val_batches=0,
        callbacks=[Record()],
        **QUIET,
    )
    with trainer.init_module(empty_init=True):
        model = Net("sgd")
    trainer.fit(model, DataLoader(dataset(TRAIN_SAMPLES), batch_size=BATCH))
    path = out / "true_half.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)["state_dict"] if trainer.is_global_zero else {}
    return {
        "shards": {p.dtype for p in model.parameters()},
        "losses": losses,
        "saved": {v.dtype for v in saved.values()},
        "default_dtype": torch.get_default_dtype(),
    }


SCENARIOS = {
    f.__name__: f
    for f in (equivalence, evaluation, init, resume_full, resume_sharded, elastic, export, true_half, compiled, crash)
}

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--hang-after", type=float, default=120.0, help="print every thread's stack and exit")
    arguments = parser.parse_args()
    faulthandler.dump_traceback_later(arguments.hang_after, exit=True)  # a hang fails with its stack shown
    sys.path.insert(0, str(Path(__file__).parent))
    folder = Path(arguments.out)
    for name in arguments.scenarios:
        started = time.perf_counter()
        result = SCENARIOS[name](folder)
        result["seconds"] = time.perf_counter() - started
        result["world_size"] = dist.get_world_size()
        torch.save(result, folder / f"{name}-rank{dist.get_rank()}.pt")
