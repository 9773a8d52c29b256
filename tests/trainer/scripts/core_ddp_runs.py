"""Manual optimization, several evaluation loaders and the three ported Lightning programs under
``Trainer(strategy="ddp", devices=2, accelerator="cpu")``. Run as a script: it starts rank 1 by re-running
itself. Every scenario runs on every rank in the same process group, and each rank saves what it saw to
``<out>/<scenario>-rank<r>.pt``; the tests (``tests/trainer/conftest.py``'s ``core_ddp`` fixture) check
those files against single-process references.

    manual     manual optimization: a GAN-like module (two optimizers, toggle_optimizer, two backward
               passes per step) and a one-optimizer module, each with batch b per rank
    loaders    validate / test / predict over a list and a dict of uneven loaders, metrics synced by name
    ports      the three programs of lightning_programs.py (GAN, two validation sets, a module owning its data)
    unused     (last) the GAN under plain ddp: a clear error naming ddp_find_unused_parameters_true
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lightning_programs as programs  # noqa: E402
import manual_modules as manual_modules  # noqa: E402

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


def _floats(trainer: tandem.Trainer) -> dict[str, float]:
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


def unused(out: Path) -> dict[str, Any]:
    """(Last: it ends in an error on every rank.) The GAN under plain ``ddp``: toggle_optimizer leaves the
    other network without gradients in each backward, which DDP refuses; the error must say what to use."""
    try:
        programs.run_gan(out / "unused", strategy="ddp", accelerator="cpu", devices=2, logger=False)
    except RuntimeError as error:
        return {"error": str(error)}
    return {"error": None}


SCENARIOS = {f.__name__: f for f in (manual, loaders, ports, unused)}

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--hang-after", type=float, default=100.0, help="print every thread's stack and exit")
    arguments = parser.parse_args()
    faulthandler.dump_traceback_later(arguments.hang_after, exit=True)  # a hang fails with its stack shown
    folder = Path(arguments.out)
    for scenario in arguments.scenarios:
        started = time.perf_counter()
        result = SCENARIOS[scenario](folder)
        result["seconds"] = time.perf_counter() - started
        torch.save(result, folder / f"{scenario}-rank{dist.get_rank()}.pt")
