"""Issue 43's ported multi-loader program: a module trained on a dict of two shuffled training loaders of different
lengths, written once, run by Lightning 2.6.6 and by tandem, in each ``CombinedLoader`` mode, on one process and under
two-process ``ddp`` (``"ddp_find_unused_parameters_true"``). Its recorded batches, epoch lengths, logged values and final weights must agree.

The program (:class:`TwoTasks`): a shared trunk with dropout and one head per task; ``train_dataloader`` returns
``{"a": 21 samples, "b": 38 samples}`` (batches of 4, shuffled) as a plain dict for ``max_size_cycle`` (Lightning's
default for a dict) and as ``CombinedLoader(loaders, mode)`` for ``min_size`` and ``max_size``; ``training_step``
trains each task present in the batch (``max_size`` gives ``None`` for a finished loader), logs ``loss_a`` /
``loss_b`` on the step and ``train_loss`` on the step and the epoch (its batch size inferred from the dict batch, as
Lightning infers it); a validation loader; SGD with momentum and a ``StepLR`` stepped every batch. 2 epochs.

A program returns ``{"values": {key: float}, "batches": [one line per epoch], "steps": [...]}``:

    values       the keys of ``parity_programs.py`` (``train_end<e>/...``, ``val<n>/...``, ``final/...``, ``w/...``),
                 and ``train_batches``: ``trainer.num_training_batches`` (the epoch length), and ``ids<e>/<key>``:
                 an order fingerprint of what each loader gave in epoch ``e`` (the sum over the epoch's steps of
                 ``(batch_idx + 1) * sum(sample ids)``)
    batches      each epoch's steps, ``"a4 b4, a1 b4, a- b2"``: each key of the batch with its batch size (``-``
                 for ``None``)
    steps        ``(epoch, batch_idx, {key: sample ids or None})`` of every step, in order

Run as a script (``--framework {lightning,tandem} --devices {1,2} --out FILE``) it plays every mode and each rank
writes ``FILE.rank<r>.json``; ``--format OUT1 OUT2`` prints the constants of ``test_combined_loader_parity.py``.
With ``--framework tandem --devices 2`` it also stops ``max_size`` mid-epoch with a checkpoint and resumes it
(``"resumed"``), which Lightning cannot do exactly. Lightning is imported only inside :func:`api` for
``framework="lightning"``; tandem's tests never import it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).parent))
import parity_programs  # noqa: E402  (the Recorder and the final values, shared with the single-loader programs)

MODES = ("max_size_cycle", "min_size", "max_size")
RESUME_MODE, RESUME_STEP = "max_size", 8  # under ddp: the second epoch's third step, "a"'s last batch


def marked(n: int, offset: int) -> TensorDataset:
    """``n`` samples of 4 features whose first names them (``offset + i``, over 1000), with random targets."""
    g = torch.Generator().manual_seed(offset + 1)
    x = torch.randn(n, 4, generator=g)
    x[:, 0] = (torch.arange(n) + offset) / 1000
    return TensorDataset(x, torch.randn(n, 1, generator=g))


def sample_ids(part: Any) -> list[int]:
    return [round(float(v) * 1000) for v in part[0][:, 0]]


@functools.cache
def api(framework: str) -> SimpleNamespace:
    """``parity_programs.api``'s names, ``CombinedLoader`` and ``ModelCheckpoint`` of ``framework``, and
    :class:`TwoTasks` built on them."""
    names = SimpleNamespace(**vars(parity_programs.api(framework)))
    if framework == "lightning":
        from lightning.pytorch.callbacks import ModelCheckpoint
        from lightning.pytorch.utilities import CombinedLoader
    else:
        from tandem.callbacks import ModelCheckpoint
        from tandem.utilities import CombinedLoader
    names.CombinedLoader, names.ModelCheckpoint = CombinedLoader, ModelCheckpoint

    class TwoTasks(names.TrainingModule):
        def __init__(self, mode: str = "max_size_cycle", lr: float = 0.05) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.trunk = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.25))
            self.heads = nn.ModuleDict({"a": nn.Linear(16, 1), "b": nn.Linear(16, 1)})
            self.steps: list[tuple[int, int, dict[str, list[int] | None]]] = []

        def train_dataloader(self) -> Any:
            loaders = {
                "a": DataLoader(marked(21, 0), batch_size=4, shuffle=True),
                "b": DataLoader(marked(38, 100), batch_size=4, shuffle=True),
            }
            mode = self.hparams.mode
            return loaders if mode == "max_size_cycle" else names.CombinedLoader(loaders, mode)

        def val_dataloader(self) -> DataLoader:
            return DataLoader(marked(10, 200), batch_size=4)

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            self.steps.append(
                (self.current_epoch, batch_idx, {k: None if v is None else sample_ids(v) for k, v in batch.items()})
            )
            loss = torch.zeros(())
            for key, part in batch.items():
                if part is None:
                    continue
                x, y = part
                task_loss = F.mse_loss(self.heads[key](self.trunk(x)), y)
                self.log(f"loss_{key}", task_loss)
                loss = loss + task_loss
            self.log("train_loss", loss, on_step=True, on_epoch=True)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            features = self.trunk(x)
            val_loss = F.mse_loss(self.heads["a"](features), y) + F.mse_loss(self.heads["b"](features), y)
            self.log("val_loss", val_loss, sync_dist=True)

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.7)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    names.TwoTasks = TwoTasks
    return names


def _batches(steps: list[tuple[int, int, dict[str, list[int] | None]]]) -> list[str]:
    """One line per epoch: each step's keys with their batch sizes."""
    epochs: dict[int, list[str]] = {}
    for epoch, _, parts in steps:
        line = " ".join(f"{k}{'-' if ids is None else len(ids)}" for k, ids in parts.items())
        epochs.setdefault(epoch, []).append(line)
    return [", ".join(epochs[e]) for e in sorted(epochs)]


def _order(steps: list[tuple[int, int, dict[str, list[int] | None]]]) -> dict[str, float]:
    """Each epoch's order fingerprint per loader: the sum over its steps of ``(batch_idx + 1) * sum(ids)``."""
    values: dict[str, float] = {}
    for epoch, batch_idx, parts in steps:
        for key, ids in parts.items():
            name = f"ids{epoch}/{key}"
            values[name] = values.get(name, 0.0) + (batch_idx + 1) * sum(ids or [])
    return values


def run_mode(api: SimpleNamespace, mode: str, root: Any, **trainer_kwargs: Any) -> dict[str, Any]:
    """The program in ``mode`` for 2 epochs."""
    api.seed_everything(42)
    model = api.TwoTasks(mode)
    recorder = api.Recorder()
    kwargs = {**parity_programs.QUIET, "default_root_dir": str(root), "max_epochs": 2, **trainer_kwargs}
    trainer = api.Trainer(callbacks=[recorder], **kwargs)
    trainer.fit(model)
    values = parity_programs._finish(recorder, trainer, model)
    values["train_batches"] = float(trainer.num_training_batches)
    values.update(_order(model.steps))
    return {"values": values, "batches": _batches(model.steps), "steps": model.steps}


def run_resumed(api: SimpleNamespace, root: Path, **trainer_kwargs: Any) -> dict[str, Any]:
    """``RESUME_MODE`` stopped at ``RESUME_STEP`` with a checkpoint, then resumed from it to the end: what the
    resumed fit trained on, and its final weights (tandem only; the checkpoint is taken mid-epoch)."""
    saving = api.ModelCheckpoint(
        dirpath=root / "ckpt", every_n_train_steps=RESUME_STEP, filename="{step}", save_top_k=-1
    )
    stopped = dict(trainer_kwargs, enable_checkpointing=True, max_steps=RESUME_STEP, max_epochs=2)
    api.seed_everything(42)
    trainer = api.Trainer(**{**parity_programs.QUIET, "default_root_dir": str(root), **stopped}, callbacks=[saving])
    trainer.fit(api.TwoTasks(RESUME_MODE))
    api.seed_everything(42)
    model = api.TwoTasks(RESUME_MODE)
    recorder = api.Recorder()
    kwargs = {**parity_programs.QUIET, "default_root_dir": str(root), "max_epochs": 2, **trainer_kwargs}
    trainer = api.Trainer(callbacks=[recorder], **kwargs)
    trainer.fit(model, ckpt_path=root / "ckpt" / f"step={RESUME_STEP}.ckpt")
    values = parity_programs._finish(recorder, trainer, model)
    return {"values": values, "steps": model.steps}


def run_all(framework: str, devices: int, root: Path) -> dict[str, Any]:
    """Every mode under ``framework`` on ``devices`` processes, each in its own folder. Two processes use
    ``strategy="ddp_find_unused_parameters_true"``: in ``max_size`` mode a step without "a" leaves its head unused."""
    names = api(framework)
    kwargs: dict[str, Any] = dict(devices=1)
    if devices == 2:
        kwargs = dict(devices=2, strategy="ddp_find_unused_parameters_true")
    results = {}
    for mode in MODES:
        results[mode] = run_mode(names, mode, root / mode, **kwargs)
    if framework == "tandem" and devices == 2:
        results["resumed"] = run_resumed(names, root / "resumed", **kwargs)
    return results


def format_constants(outs: dict[int, Path]) -> str:
    """``LIGHTNING``'s and ``BATCHES``' entries of ``test_combined_loader_parity.py`` for the runs written under
    ``outs[devices]``: rank 0's values, and under two devices rank 1's as ``rank1/<key>`` where they differ."""
    values, batches = [], []
    for mode in MODES:
        for devices, out in outs.items():
            ranks = [_read(out, r)[mode] for r in range(devices)]
            recorded = dict(ranks[0]["values"])
            for rank, other in enumerate(ranks[1:], start=1):
                if other["values"].keys() != recorded.keys() or other["batches"] != ranks[0]["batches"]:
                    raise ValueError(f"{mode}: rank {rank} recorded other keys or batches than rank 0")
                recorded.update({f"rank{rank}/{k}": v for k, v in other["values"].items() if v != recorded[k]})
            values.append(f"    ({mode!r}, {devices}): {{")
            values += [f"        {k!r}: {v!r}," for k, v in recorded.items()]
            values.append("    },")
            batches.append(f"    ({mode!r}, {devices}): [")
            batches += [f"        {line!r}," for line in ranks[0]["batches"]]
            batches.append("    ],")
    return "LIGHTNING = {\n" + "\n".join(values) + "\n}\nBATCHES = {\n" + "\n".join(batches) + "\n}"


def _read(out: Path, rank: int) -> dict[str, Any]:
    return json.loads(out.with_name(f"{out.name}.rank{rank}.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("lightning", "tandem"))
    parser.add_argument("--devices", type=int, choices=(1, 2), default=1)
    parser.add_argument("--out", help="each rank writes OUT.rank<r>.json")
    parser.add_argument("--format", nargs=2, metavar=("OUT1", "OUT2"), help="print the test's constants")
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
    partial.write_text(json.dumps(results, indent=1))
    os.replace(partial, target)
    print(f"rank {rank}: wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
