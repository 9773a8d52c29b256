"""Manual optimization, several evaluation loaders and the three ported Lightning programs under
``Trainer(strategy="ddp", devices=2, accelerator="cpu")``. Run as a script: it starts rank 1 by re-running
itself. Every scenario runs on every rank in the same process group, and each rank saves what it saw to
``<out>/<scenario>-rank<r>.pt``; the tests (``tests/trainer/conftest.py``'s ``core_ddp`` fixture) check
those files against single-process references.

    manual     manual optimization: a GAN-like module (two optimizers, toggle_optimizer, two backward
               passes per step) and a one-optimizer module, each with batch b per rank
    loaders    validate / test / predict over a list and a dict of uneven loaders, metrics synced by name
    ports      the three programs of lightning_programs.py (GAN, two validation sets, a module owning its data)
    nonfinite  rank 1's loss turns NaN at step 8 (on_nonfinite="warn": "raise" would end the job): both ranks
               find it at the same check and train on; the checkpoints written before stay, none of NaN
               weights is written
    rollback   on_nonfinite="rollback": NaN samples in two of the epoch's batches, on rank 1 only (one found at a
               publishing step, one at the epoch's end): every rank rolls back past them in both epochs, and no
               checkpoint holds a NaN
    memory     with Python's garbage collector off, a finished fit's module, Trainer and optimizer are freed
               as soon as the script drops them
    stopping   should_stop asked on one rank mid-epoch, and max_time: every rank stops at the same step
    gathers    self.all_gather(sync_grads=True) carries gradients back to every rank
    tuner      Tuner(trainer).lr_find: rank 0's results on every rank, the weights back, the fit after with the rate
    profiling  Trainer(profiler=...): a report file per rank, or one report printed by rank 0
    compiled   trainer.fit(torch.compile(module)) trains as the eager fit (the DDP module compiled)
    evaluation the programs of eval_ddp_programs.py (BatchNorm statistics in validation, shuffled evaluation loaders)
    combined   combined_ddp_run.py's programs: a dict of two training loaders in each CombinedLoader mode, a
               mid-epoch resume, the dataloader_iter step (in ``<out>/combined``)
    elastic    elastic_loaders_run.py's two-process runs: each mode saving mid-epoch, and the one-process
               checkpoints resumed (in ``<out>/elastic``, where the test process wrote those first)
    lookahead  lookahead_program.py under ddp: when each rank reads its training batches
    parity     parity_programs.py's ten programs under ddp (their values against Lightning's)
    combined_parity  combined_parity_programs.py's modes and resume under ddp (against Lightning's)
    unused     (last) the GAN under plain ddp: a clear error naming ddp_find_unused_parameters_true

The programs written for a launch of their own (the last five) run with one torch thread, as they did there
(Lightning's values were recorded so); ``--hang-after`` bounds each scenario.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import gc
import json
import math
import os
import sys
import time
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import combined_ddp_run  # noqa: E402
import combined_parity_programs  # noqa: E402
import elastic_loaders_run  # noqa: E402
import eval_ddp_programs  # noqa: E402
import lightning_programs as programs  # noqa: E402
import lookahead_program  # noqa: E402
import manual_modules as manual_modules  # noqa: E402
import parity_programs  # noqa: E402

import tandem  # noqa: E402
from tandem.strategies import DDPStrategy  # noqa: E402

QUIET = dict(
    accelerator="cpu",
    devices=2,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
    data_order="global",  # the order one process draws: the scenarios are compared with one process
)


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def manual(out: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, strategy in (("gan", DDPStrategy(find_unused_parameters=True)), ("single", "ddp")):
        torch.manual_seed(0)
        model = manual_modules.MODULES[name]()
        trainer = tandem.Trainer(strategy=strategy, max_epochs=2, **QUIET)
        trainer.fit(model, manual_modules.loader(manual_modules.BATCH))
        results[name] = {"final": weights(model), "steps": trainer.global_step}
    return results


def loaders(out: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    model = manual_modules.Evaluated()
    trainer = tandem.Trainer(strategy="ddp", **QUIET)
    return {
        "weights": weights(model),
        "validate": trainer.validate(model, manual_modules.eval_loaders(), verbose=False),
        "num_val_batches": trainer.num_val_batches,
        "test": trainer.test(model, dict(zip("ab", manual_modules.eval_loaders())), verbose=False),
        "predict": trainer.predict(model, manual_modules.eval_loaders()),
        "seen": model.seen,
    }


def ports(out: Path) -> dict[str, Any]:
    root = out / "ports"
    quiet = dict(strategy="ddp", accelerator="cpu", devices=2, logger=False, enable_model_summary=False)
    gan, gan_trainer = programs.run_gan(root / "gan", **{**quiet, "strategy": "ddp_find_unused_parameters_true"})
    two, two_trainer, two_results = programs.run_two_val_sets(root / "two", **quiet)
    own = programs.run_own_data(root / "own", **quiet)
    return {
        "gan": {"final": weights(gan), "steps": gan_trainer.global_step, "metrics": _floats(gan_trainer)},
        "two": {
            "final": weights(two),
            "validate": two_results,
            "best": two_trainer.checkpoint_callback.best_model_path,
        },
        "own": {
            "best": own["best"],
            "prepared": own["model"].prepared,
            "test_restored": own["test_restored"],
            "test_best": own["test_best"],
            "restored": weights(own["restored"]),
        },
    }


class Regression(tandem.TrainingModule):
    """A regression; with ``nan_from``, its loss is NaN on rank 1 from that step on (rank 0's stays finite
    until the all-reduced NaN gradients reach the weights)."""

    def __init__(self, nan_from: int | None = None) -> None:
        super().__init__()
        self.net = torch.nn.Linear(manual_modules.FEATURES, 1)
        self.nan_from = nan_from

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, _ = batch
        loss = (self.net(x) - 1.0).pow(2).mean()
        if self.nan_from is not None and self.global_rank == 1 and self.global_step >= self.nan_from:
            loss = loss * math.nan
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", (self.net(batch[0]) - 1.0).pow(2).mean(), sync_dist=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def nonfinite(out: Path) -> dict[str, Any]:
    """on_nonfinite="warn" ("raise" takes the same decision, but an error on rank 0 would end this launch)."""
    from tandem.callbacks import ModelCheckpoint
    from tandem.utilities.checkpoint import load_checkpoint_file

    folder = out / "nonfinite"
    checkpoint = ModelCheckpoint(dirpath=folder, every_n_train_steps=3, save_last=True, save_top_k=-1)
    trainer = tandem.Trainer(
        strategy="ddp",
        max_epochs=2,
        log_every_n_steps=2,
        callbacks=[checkpoint],
        on_nonfinite="warn",
        **{**QUIET, "enable_checkpointing": True},
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Regression(nan_from=7), manual_modules.loader(manual_modules.BATCH))
    last = load_checkpoint_file(folder / "last.ckpt")
    return {
        "found": trainer._nonfinite.found,  # what each rank decided, and when
        "step": trainer.global_step,
        "files": sorted(os.listdir(folder)),
        "last_step": last["global_step"],
        "last_finite": all(bool(torch.isfinite(v).all()) for v in last["state_dict"].values()),
        "warnings": [str(w.message) for w in caught if "NaN or inf" in str(w.message)],
    }


#: on_nonfinite="rollback": the samples made NaN, both on rank 1 (odd indices): batch 4 (found at the publishing
#: step of batch 5) and batch 7 (the epoch's last, found at the epoch's end), every epoch
ROLLBACK_NAN_SAMPLES = (33, 57)


def rollback(out: Path) -> dict[str, Any]:
    """Rank 1's batches 4 and 7 of each epoch hold a NaN sample; log_every_n_steps=3."""
    from torch.utils.data import DataLoader, TensorDataset

    from tandem.callbacks import ModelCheckpoint
    from tandem.utilities.checkpoint import load_checkpoint_file

    x, z = manual_modules.dataset().tensors
    x = x.clone()
    x[list(ROLLBACK_NAN_SAMPLES)] = math.nan
    data = DataLoader(TensorDataset(x, z), batch_size=manual_modules.BATCH, shuffle=False)
    folder = out / "rollback"  # a save at every step: the one after batch 4 meets NaN weights, and is skipped
    checkpoint = ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_last=True, save_top_k=-1)
    trainer = tandem.Trainer(
        strategy="ddp",
        max_epochs=2,
        log_every_n_steps=3,
        callbacks=[checkpoint],
        on_nonfinite="rollback",
        **{**QUIET, "enable_checkpointing": True},
    )
    torch.manual_seed(0)
    module = Regression()
    initial = weights(module)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, data)
    files = sorted(os.listdir(folder))
    states = [load_checkpoint_file(folder / name)["state_dict"] for name in files]
    return {
        "initial": initial,
        "final": weights(module),
        "step": trainer.global_step,
        "rollbacks": [(r.step, r.epoch, r.batch_idx, r.restored_step, r.skipped, r.reason) for r in trainer.rollbacks],
        "files": files,
        "files_finite": all(bool(torch.isfinite(v).all()) for state in states for v in state.values()),
        "warnings": [str(w.message) for w in caught if "rollback" in str(w.message)],
    }


def memory(out: Path) -> dict[str, Any]:
    """A finished DDP fit leaves no reference cycle: with the collector off, dropping the Trainer, the module
    and the loaders frees them at once (the DDP wrapper, hooks and optimizer wrappers included)."""
    gc.collect()
    gc.disable()
    try:
        model = Regression()
        trainer = tandem.Trainer(strategy="ddp", max_epochs=1, **{**QUIET, "enable_checkpointing": True})
        train, val = manual_modules.loader(manual_modules.BATCH), manual_modules.loader(manual_modules.BATCH)
        trainer.fit(model, train, val)
        refs = {
            "module": weakref.ref(model),
            "trainer": weakref.ref(trainer),
            "optimizer": weakref.ref(trainer.optimizers[0]),
            "parameter": weakref.ref(next(model.parameters())),
        }
        del model, trainer, train, val
        return {name: ref() is not None for name, ref in refs.items()}
    finally:
        gc.enable()


class _StopOnRankOne(tandem.Callback):
    """Asks to stop on rank 1 alone, after batch 2 (as a Timer whose rank ran out of time first)."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_rank == 1 and batch_idx == 2:
            trainer.should_stop = True


def stopping(out: Path) -> dict[str, Any]:
    """One rank asks to stop mid-epoch: every rank stops at the next publishing step (batch 3 of 8, log_every 2);
    and Trainer(max_time=...), out of time after the first batch, stops both ranks at the same step."""
    data = manual_modules.loader(manual_modules.BATCH)
    one = tandem.Trainer(strategy="ddp", max_epochs=3, log_every_n_steps=2, callbacks=[_StopOnRankOne()], **QUIET)
    one.fit(Regression(), data)
    timed = tandem.Trainer(strategy="ddp", max_time={"microseconds": 1}, log_every_n_steps=2, **QUIET)
    timed.fit(Regression(), data)
    return {"one_rank": (one.global_step, one.current_epoch), "max_time": timed.global_step}


def gathers(out: Path) -> dict[str, Any]:
    """self.all_gather(..., sync_grads=True): the gather is differentiable, each rank's input gets the gradient of
    every rank's use of it."""
    module = Regression()
    trainer = tandem.Trainer(strategy="ddp", max_steps=1, **QUIET)  # kept: the module holds it weakly
    trainer.fit(module, manual_modules.loader(manual_modules.BATCH))
    rank = dist.get_rank()
    x = torch.tensor([rank + 1.0], requires_grad=True)
    gathered = module.all_gather(x, sync_grads=True)
    (gathered.sum() * (rank + 1)).backward()  # rank r's loss uses every rank's x with weight r + 1
    return {"gathered": gathered.detach(), "grad": x.grad.clone()}


class _Tuned(Regression):
    """Its learning rate is ``self.lr``, which the tuner sets."""

    def __init__(self) -> None:
        super().__init__()
        self.lr = 0.01

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def tuner(out: Path) -> dict[str, Any]:
    """Tuner(trainer).lr_find: every rank trains its own shard (its own losses); rank 0's results count on every
    rank, the weights come back, and the fit after it trains with the rate found on every rank."""
    from tandem.tuner import Tuner

    torch.manual_seed(0)
    module = _Tuned()
    before = weights(module)
    # three epochs of 8 batches a rank: the search's 20 steps fit in them (the fit's max_epochs ends a search too)
    trainer = tandem.Trainer(strategy="ddp", max_epochs=3, default_root_dir=str(out), **QUIET)
    data = manual_modules.loader(manual_modules.BATCH)
    finder = Tuner(trainer).lr_find(module, data, min_lr=1e-4, num_training=20)
    restored = all(torch.equal(before[k], v) for k, v in weights(module).items())
    searched_steps = trainer.global_step
    trainer.fit(module, data)
    return {
        "results": finder.results,
        "lr": module.lr,
        "restored": restored,
        "searched_steps": searched_steps,
        "steps": trainer.global_step,
        "final": weights(module),
        "left": sorted(p.name for p in out.glob(".trial-*")),
    }


def profiling(out: Path) -> dict[str, Any]:
    """Trainer(profiler=...) under ddp: a SimpleProfiler with a filename writes one report per rank
    (``fit-perf-<rank>.txt``); profiler="simple" prints one report, on rank 0."""
    from tandem.profilers import SimpleProfiler

    data = manual_modules.loader(manual_modules.BATCH)
    profiler = SimpleProfiler(dirpath=out / "profiling", filename="perf")
    tandem.Trainer(strategy="ddp", max_steps=4, profiler=profiler, **QUIET).fit(Regression(), data)
    tandem.Trainer(strategy="ddp", max_steps=2, profiler="simple", **QUIET).fit(Regression(), data)
    return {"counts": {action: len(d) for action, d in profiler.recorded_durations.items()}}


def compiled(out: Path) -> dict[str, Any]:
    """The same fit eager and as ``trainer.fit(torch.compile(module))``, accumulating 2 batches (``no_sync``): the
    DDP module compiled around the module (dynamo's DDPOptimizer splits the training graph at DDP's gradient
    buckets), validation steps compiled on their own. Backend aot_eager (dynamo and AOT autograd, eager kernels: no C++ builds in this launch), with
    the graphs counted; the checkpoint has the module's plain names."""
    aot_eager = torch._dynamo.lookup_backend("aot_eager")
    graphs: list[int] = []

    def backend(graph: torch.fx.GraphModule, example_inputs: list) -> Any:
        graphs.append(len(graph.graph.nodes))
        return aot_eager(graph, example_inputs)

    results: dict[str, Any] = {}
    for name in ("eager", "compiled"):
        torch.manual_seed(0)
        module = Regression()
        trainer = tandem.Trainer(strategy="ddp", max_epochs=2, accumulate_grad_batches=2, **QUIET)
        data = manual_modules.loader(manual_modules.BATCH)
        trainer.fit(torch.compile(module, backend=backend) if name == "compiled" else module, data, data)
        trainer.save_checkpoint(out / f"{name}.ckpt")
        checkpoint = torch.load(out / f"{name}.ckpt", weights_only=False)
        results[name] = {
            "final": weights(module),
            "metrics": _floats(trainer),
            "keys": sorted(checkpoint["state_dict"]),
        }
    results["graphs"] = len(graphs)
    return results


def _floats(trainer: tandem.Trainer) -> dict[str, float]:
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """One torch thread inside (these programs' own launches set OMP_NUM_THREADS=1), the launch's count after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _as_json(value: Any) -> Any:
    """``value`` as its JSON file reads back (tuples as lists): what the programs' own launches wrote."""
    return json.loads(json.dumps(value))


def combined(out: Path) -> dict[str, Any]:
    (out / "combined").mkdir(exist_ok=True)  # both ranks make it: the first one does
    with one_thread():
        return combined_ddp_run.run(2, out / "combined")


def elastic(out: Path) -> dict[str, Any]:
    with one_thread():
        return elastic_loaders_run.two_processes(out / "elastic")


def lookahead(out: Path) -> dict[str, Any]:
    with one_thread():
        return {"seen": _as_json(lookahead_program.run("tandem", 2))}


def parity(out: Path) -> dict[str, Any]:
    with one_thread():
        return {"programs": _as_json(parity_programs.run_all("tandem", 2, out / "parity"))}


def combined_parity(out: Path) -> dict[str, Any]:
    with one_thread():
        return {"modes": _as_json(combined_parity_programs.run_all("tandem", 2, out / "combined_parity"))}


def unused(out: Path) -> dict[str, Any]:
    """(Last: it ends in an error on every rank.) The GAN under ``DDPStrategy(find_unused_parameters=False)``:
    toggle_optimizer leaves the other network without gradients in each backward, which DDP refuses when told so
    (plain ``ddp`` takes care of it); the error must name the parameters and say what to use."""
    try:
        strategy = DDPStrategy(find_unused_parameters=False)
        programs.run_gan(out / "unused", strategy=strategy, accelerator="cpu", devices=2, logger=False)
    except RuntimeError as error:
        return {"error": str(error)}
    return {"error": None}


def evaluation(out: Path) -> dict[str, Any]:
    return eval_ddp_programs.run_all("tandem", out / "evaluation")


SCENARIOS = {
    f.__name__: f
    for f in (
        manual,
        loaders,
        ports,
        nonfinite,
        rollback,
        memory,
        stopping,
        gathers,
        tuner,
        profiling,
        compiled,
        evaluation,
        combined,
        elastic,
        lookahead,
        parity,
        combined_parity,
        unused,
    )
}

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--hang-after", type=float, default=100.0, help="print every thread's stack and exit")
    arguments = parser.parse_args()
    folder = Path(arguments.out)
    for scenario in arguments.scenarios:
        faulthandler.dump_traceback_later(arguments.hang_after, exit=True)  # a hang fails with its stack shown
        started = time.perf_counter()
        result = SCENARIOS[scenario](folder)
        result["seconds"] = time.perf_counter() - started
        torch.save(result, folder / f"{scenario}-rank{dist.get_rank()}.pt")
