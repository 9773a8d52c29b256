"""Issue 29's parity programs: ten small training programs written once, run by Lightning 2.6.6 and by tandem,
whose logged values and final weights must agree to 1e-6 on one process and under two-process ``ddp``.

Each program is ``run_<name>(api, root, **trainer_kwargs) -> dict[str, float]``; ``api`` is :func:`api`'s
namespace for one framework (its TrainingModule, Trainer, Callback, seed_everything and Tuner), so the same code
trains under both. A program seeds with ``seed_everything(42)``, builds its module, then its Trainer, and returns:

    train_end<e>/<key>   at each ``on_train_epoch_end``: every value in ``trainer.callback_metrics``,
                         ``global_step`` and each optimizer's ``lr<i>``
    val<n>/<key>         at each ``on_validation_epoch_end`` (n counts validation runs, the sanity check's too):
                         the same, and ``epoch``
    .../train_acc.compute  what ``pl_module.train_acc.compute()`` gives there (the torchmetrics program)
    finder/...           the learning-rate finder's results and suggestion (its program)
    final/...            ``global_step`` and each optimizer's ``lr<i>`` after the fit
    w/<param>/sum, sq    each final parameter's sum and sum of squares (float64)

The programs:

    shuffled         a shuffled training loader, dropout
    unshuffled       shuffle=False, dropout (under ddp Lightning's DistributedSampler shuffles it anyway)
    val_every_epoch  validation at each epoch's end, the sanity check (2 batches) first, dropout
    val_every_k      val_check_interval=3
    plateau          ReduceLROnPlateau monitoring val_loss, in configure_optimizers' dict form
    step_scheduler   a StepLR stepped every batch ("interval": "step")
    metrics          torchmetrics MulticlassAccuracy objects logged with self.log, and read by a callback
                     (train_acc.compute()) in on_validation_epoch_end and on_train_epoch_end
    manual           manual optimization with two optimizers, each stepped and zeroed every batch
    accumulate       accumulate_grad_batches=2, with a partial last batch and an odd number of batches
    lr_find          Tuner(trainer).lr_find(model, num_training=18), then the fit with its suggestion

Run as a script (``--framework {lightning,tandem} --devices {1,2} --out FILE``) it plays every program and each
rank writes its results to ``FILE.rank<r>.json``; with ``--devices 2`` (``strategy="ddp"``) both frameworks start
rank 1 by re-running this script, so all work happens under ``if __name__ == "__main__":``. Lightning is imported
only inside :func:`api`, for ``framework="lightning"``; tandem's tests never import it. The numbers Lightning gives
are the constants of ``tests/trainer/test_lightning_parity.py``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

PROGRAMS = (
    "shuffled",
    "unshuffled",
    "val_every_epoch",
    "val_every_k",
    "plateau",
    "step_scheduler",
    "metrics",
    "manual",
    "accumulate",
    "lr_find",
)
QUIET = dict(
    accelerator="cpu",
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)


@functools.cache
def api(framework: str) -> SimpleNamespace:
    """The names a program needs, from ``framework`` ("lightning" or "tandem"), plus the programs' own classes built
    on them (``Classifier``, ``Validated``, ``TwoOptimizers``, ``Recorder``)."""
    if framework == "lightning":
        import lightning.pytorch as root
        from lightning.pytorch.tuner import Tuner

        module_class = root.LightningModule
    elif framework == "tandem":
        import tandem as root
        from tandem.tuner import Tuner

        module_class = root.TrainingModule
    else:
        raise ValueError(f"framework must be 'lightning' or 'tandem', not {framework!r}")
    names = SimpleNamespace(
        framework=framework,
        TrainingModule=module_class,
        Trainer=root.Trainer,
        Callback=root.Callback,
        seed_everything=root.seed_everything,
        Tuner=Tuner,
    )
    return _with_classes(names)


# ---------------------------------------------------------------------------------------------- data


def points(n: int, seed: int) -> TensorDataset:
    """``n`` points of 8 features in 3 classes, from a fixed formula."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] * x[:, 2] > 0).long()
    return TensorDataset(x, y)


def train_loader(n: int = 64, shuffle: bool = True) -> DataLoader:
    return DataLoader(points(n, seed=1), batch_size=8, shuffle=shuffle)


def val_loader(n: int = 20) -> DataLoader:
    return DataLoader(points(n, seed=2), batch_size=8)  # 8, 8, 4: one process; 8, 2 on each of two ranks


# ---------------------------------------------------------------------------------------------- modules and recorder


def _with_classes(names: SimpleNamespace) -> SimpleNamespace:
    class Classifier(names.TrainingModule):
        """8 -> 16 -> 3 (195 parameters), SGD with momentum; ``scheduler``: None, "plateau" or "step"; ``metrics``:
        torchmetrics objects for the accuracies. No validation_step (see ``Validated``)."""

        def __init__(
            self, lr: float = 0.1, dropout: float = 0.0, scheduler: str | None = None, metrics: bool = False
        ) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 3))
            if metrics:
                from torchmetrics.classification import MulticlassAccuracy

                self.train_acc = MulticlassAccuracy(num_classes=3)
                self.val_acc = MulticlassAccuracy(num_classes=3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            logits = self(x)
            loss = F.cross_entropy(logits, y)
            self.log("train_loss", loss, on_step=True, on_epoch=True)
            if self.hparams.metrics:
                self.train_acc(logits, y)
                self.log("train_acc", self.train_acc, on_step=True, on_epoch=True)
            return loss

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
            if self.hparams.scheduler == "plateau":
                plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
                return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}
            if self.hparams.scheduler == "step":
                step = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
                return {"optimizer": optimizer, "lr_scheduler": {"scheduler": step, "interval": "step"}}
            return optimizer

    class Validated(Classifier):
        """The classifier with a validation_step (a module without one fits with no validation data quietly)."""

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            logits = self(x)
            self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
            if self.hparams.metrics:
                self.val_acc.update(logits, y)
                self.log("val_acc", self.val_acc)
            else:
                self.log("val_acc", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    class TwoOptimizers(names.TrainingModule):
        """Manual optimization: SGD for the first layer, Adam for the last, both stepped every batch."""

        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))

        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            first, last = self.optimizers()
            loss = F.cross_entropy(self.net(x), y)
            self.manual_backward(loss)
            first.step()
            first.zero_grad()
            last.step()
            last.zero_grad()
            self.log("train_loss", loss)

        def configure_optimizers(self) -> Any:
            return [
                torch.optim.SGD(self.net[0].parameters(), lr=0.2, momentum=0.5),
                torch.optim.Adam(self.net[2].parameters(), lr=0.01),
            ]

    class Recorder(names.Callback):
        """Writes what a program returns: ``callback_metrics`` at each epoch end, the rates, the metric objects."""

        def __init__(self, read_train_acc: bool = False) -> None:
            self.values: dict[str, float] = {}
            self.read_train_acc = read_train_acc
            self.validations = 0

        def _record(self, prefix: str, trainer: Any, pl_module: Any) -> None:
            for key, value in trainer.callback_metrics.items():
                self.values[f"{prefix}/{key}"] = float(value)
            self.values[f"{prefix}/global_step"] = float(trainer.global_step)
            for i, optimizer in enumerate(trainer.optimizers):
                self.values[f"{prefix}/lr{i}"] = float(optimizer.param_groups[0]["lr"])
            if self.read_train_acc and not trainer.sanity_checking:
                self.values[f"{prefix}/train_acc.compute"] = float(pl_module.train_acc.compute())

        def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            prefix = f"val{self.validations}"
            self.validations += 1
            self.values[f"{prefix}/epoch"] = float(trainer.current_epoch)
            self.values[f"{prefix}/sanity_checking"] = float(trainer.sanity_checking)
            self._record(prefix, trainer, pl_module)

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            self._record(f"train_end{trainer.current_epoch}", trainer, pl_module)

    vars(names).update(Classifier=Classifier, Validated=Validated, TwoOptimizers=TwoOptimizers, Recorder=Recorder)
    return names


def _finish(recorder: Any, trainer: Any, model: nn.Module) -> dict[str, float]:
    """The recorder's values, the final step and rates, and each parameter's sum and sum of squares."""
    values = dict(recorder.values)
    values["final/global_step"] = float(trainer.global_step)
    for i, optimizer in enumerate(trainer.optimizers):
        values[f"final/lr{i}"] = float(optimizer.param_groups[0]["lr"])
    for name, param in model.named_parameters():
        weights = param.detach().double()
        values[f"w/{name}/sum"] = weights.sum().item()
        values[f"w/{name}/sq"] = (weights * weights).sum().item()
    return values


def _fit(api: SimpleNamespace, root: Any, model: nn.Module, loaders: tuple, recorder: Any, **kwargs: Any) -> dict:
    trainer = api.Trainer(**{**QUIET, "default_root_dir": str(root), "callbacks": [recorder], **kwargs})
    trainer.fit(model, *loaders)
    return _finish(recorder, trainer, model)


# ---------------------------------------------------------------------------------------------- the programs


def run_shuffled(api: SimpleNamespace, root: Any, **trainer_kwargs: Any) -> dict[str, float]:
    api.seed_everything(42)
    model = api.Classifier(dropout=0.25)
    return _fit(api, root, model, (train_loader(shuffle=True),), api.Recorder(), max_epochs=3, **trainer_kwargs)


def run_unshuffled(api: SimpleNamespace, root: Any, **trainer_kwargs: Any) -> dict[str, float]:
    api.seed_everything(42)
    model = api.Classifier(dropout=0.25)
    return _fit(api, root, model, (train_loader(shuffle=False),), api.Recorder(), max_epochs=3, **trainer_kwargs)


def run_val_every_epoch(api: SimpleNamespace, root: Any, **trainer_kwargs: Any) -> dict[str, float]:
    api.seed_everything(42)
    model = api.Validated(dropout=0.25)
    loaders = (train_loader(), val_loader())
    return _fit(api, root, model, loaders, api.Recorder(), max_epochs=3, **trainer_kwargs)


def run_val_every_k(api: SimpleNamespace, root: Any, **trainer_kwargs: Any) -> dict[str, float]:
    api.seed_everything(42)
    model = api.Validated()
    loaders = (train_loader(), val_loader())
    kwargs = dict(max_epochs=2, val_check_interval=3, num_sanity_val_steps=0)
    return _fit(api, root, model, loaders, api.Recorder(), **kwargs, **trainer_kwargs)


def run_plateau(api: SimpleNamespace, root: Any, **trainer_kwargs: Any) -> dict[str, float]:
    api.seed_everything(42)
    model = api.Validated(lr=0.5, scheduler="plateau")
    loaders = (train_loader(), val_loader())
    return _fit(api, root, model, loaders, api.Recorder(), max_epochs=3, **trainer_kwargs)


def run_step_scheduler(api: SimpleNamespace, root: Any, **trainer_kwargs: Any) -> dict[str, float]:
    api.seed_everything(42)
    model = api.Classifier(scheduler="step")
    return _fit(api, root, model, (train_loader(),), api.Recorder(), max_epochs=3, **trainer_kwargs)


def run_metrics(api: SimpleNamespace, root: Any, **trainer_kwargs: Any) -> dict[str, float]:
    api.seed_everything(42)
    model = api.Validated(metrics=True)
    loaders = (train_loader(), val_loader())
    return _fit(api, root, model, loaders, api.Recorder(read_train_acc=True), max_epochs=2, **trainer_kwargs)


def run_manual(api: SimpleNamespace, root: Any, **trainer_kwargs: Any) -> dict[str, float]:
    api.seed_everything(42)
    model = api.TwoOptimizers()
    return _fit(api, root, model, (train_loader(),), api.Recorder(), max_epochs=2, **trainer_kwargs)


def run_accumulate(api: SimpleNamespace, root: Any, **trainer_kwargs: Any) -> dict[str, float]:
    api.seed_everything(42)
    model = api.Classifier()
    loaders = (train_loader(n=68),)  # 9 batches, the last of 4; under ddp 5 a rank, the last of 2
    return _fit(api, root, model, loaders, api.Recorder(), max_epochs=2, accumulate_grad_batches=2, **trainer_kwargs)


def run_lr_find(api: SimpleNamespace, root: Any, **trainer_kwargs: Any) -> dict[str, float]:
    api.seed_everything(42)
    model = api.Classifier(lr=0.1)
    recorder = api.Recorder()
    trainer = api.Trainer(
        **{**QUIET, "default_root_dir": str(root), "callbacks": [recorder], "max_epochs": 3, **trainer_kwargs}
    )
    loader = train_loader(n=96)  # 12 batches; under ddp 6 a rank, so that 3 epochs hold the 18 steps
    finder = api.Tuner(trainer).lr_find(model, train_dataloaders=loader, min_lr=1e-4, max_lr=1.0, num_training=18)
    found = {f"finder/lr{i}": float(v) for i, v in enumerate(finder.results["lr"])}
    found.update({f"finder/loss{i}": float(v) for i, v in enumerate(finder.results["loss"])})
    suggestion = finder.suggestion()
    found["finder/suggestion"] = math.nan if suggestion is None else float(suggestion)
    found["finder/model_lr"] = float(model.hparams.lr)
    found["finder/recorded_keys"] = float(len(recorder.values))  # what the Recorder saw during the search
    trainer.fit(model, loader)
    return {**found, **_finish(recorder, trainer, model)}


# ---------------------------------------------------------------------------------------------- the script


def run_all(framework: str, devices: int, root: Path) -> dict[str, dict[str, float]]:
    """Every program under ``framework`` on ``devices`` processes (2: ``strategy="ddp"``), each in its own folder."""
    names = api(framework)
    kwargs: dict[str, Any] = dict(devices=2, strategy="ddp") if devices == 2 else dict(devices=1)
    results = {}
    for name in PROGRAMS:
        results[name] = globals()[f"run_{name}"](names, root / name, **kwargs)
    return results


def format_constants(outs: dict[int, Path]) -> str:
    """The entries of ``test_lightning_parity.LIGHTNING`` for the results written under ``outs[devices]``:
    ``(program, devices): {key: value}`` with rank 0's values in the order recorded, and under two devices rank 1's
    as ``rank1/<key>`` where they differ from rank 0's (its keys are rank 0's: checked here)."""

    def number(value: float) -> str:
        return "math.nan" if math.isnan(value) else repr(value)

    ranks = {devices: [_read(out, r) for r in range(devices)] for devices, out in outs.items()}
    lines = []
    for name in PROGRAMS:
        for devices, results in ranks.items():
            values = dict(results[0][name])
            for rank, other in enumerate(results[1:], start=1):
                if other[name].keys() != values.keys():
                    raise ValueError(f"{name}: rank {rank} recorded other keys than rank 0")
                values.update({f"rank{rank}/{k}": v for k, v in other[name].items() if v != results[0][name][k]})
            lines.append(f"    ({name!r}, {devices}): {{")
            lines += [f"        {k!r}: {number(v)}," for k, v in values.items()]  # in the order recorded
            lines.append("    },")
    return "\n".join(lines)


def _read(out: Path, rank: int) -> dict[str, dict[str, float]]:
    return json.loads(out.with_name(f"{out.name}.rank{rank}.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("lightning", "tandem"))
    parser.add_argument("--devices", type=int, choices=(1, 2), default=1)
    parser.add_argument("--out", help="each rank writes OUT.rank<r>.json")
    parser.add_argument(
        "--format",
        nargs=2,
        metavar=("OUT1", "OUT2"),
        help="print test_lightning_parity.LIGHTNING's entries from the OUT of a --devices 1 and of a --devices 2 run",
    )
    args = parser.parse_args()
    if args.format:
        print(format_constants({1: Path(args.format[0]), 2: Path(args.format[1])}))
        return
    if args.framework is None or args.out is None:
        parser.error("--framework and --out are needed to run the programs")
    torch.set_num_threads(1)
    out = Path(args.out).resolve()
    results = run_all(args.framework, args.devices, out.parent / f"{out.name}.work")
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    target = out.parent / f"{out.name}.rank{rank}.json"
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")
    partial.write_text(json.dumps(results, indent=1))  # each program's values in the order recorded
    os.replace(partial, target)
    print(f"rank {rank}: wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
