"""Issue 42's evaluation programs under ``strategy="ddp", devices=2``, written once for Lightning 2.6.6 and tandem:

    batchnorm      a module with BatchNorm whose ranks train on different data (their running statistics differ),
                   validated each epoch (the sanity check first) with ``val_loss`` logged ``sync_dist=True``: under
                   Lightning every rank validates with rank 0's statistics (the DDP wrapper's buffer broadcast)
    shuffled_test  ``trainer.test`` of a fixed module over a ``shuffle=True`` loader: Lightning shards it with a
                   DistributedSampler that shuffles (seed 0 plus the epoch); each rank's own accuracy (no sync) and
                   the sample indices it saw
    shuffled_val   a fit of 3 epochs with a ``shuffle=True`` validation loader: each validation's sample indices on
                   each rank (the sampler gets the epoch in progress before every pass, the sanity check's too)

Run as a script (``--framework {lightning,tandem} --out FILE``): both frameworks start rank 1 by re-running it, and
each rank writes ``FILE.rank<r>.json``. ``--format OUT`` prints the constants of ``tests/trainer/test_evaluation_ddp.py``
from a Lightning run's files. tandem's side runs inside the shared launch of ``core_ddp_runs.py`` (``evaluation``).
"""

from __future__ import annotations

import argparse
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

QUIET = dict(
    accelerator="cpu",
    devices=2,
    strategy="ddp",
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)


def api(framework: str) -> SimpleNamespace:
    if framework == "lightning":
        import lightning.pytorch as root

        return SimpleNamespace(Module=root.LightningModule, Trainer=root.Trainer, seed=root.seed_everything)
    import tandem as root

    return SimpleNamespace(Module=root.TrainingModule, Trainer=root.Trainer, seed=root.seed_everything)


def indexed(n: int, seed: int, shift: float = 0.0) -> TensorDataset:
    """``n`` points of 4 features in 3 classes, with their index."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g) + shift
    y = torch.randint(0, 3, (n,), generator=g)
    return TensorDataset(x, y, torch.arange(n))


def batchnorm(names: SimpleNamespace, root: Path) -> dict[str, Any]:
    seen: list[float] = []

    class Net(names.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y, _ = batch
            return F.cross_entropy(self.net(x * (1 + 3 * self.global_rank)), y)  # the ranks' statistics differ

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y, _ = batch
            self.log("val_loss", F.cross_entropy(self.net(x), y), sync_dist=True)

        def on_validation_epoch_end(self) -> None:
            seen.append(float(self.trainer.callback_metrics["val_loss"]))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    names.seed(7)
    model = Net()
    trainer = names.Trainer(max_epochs=2, default_root_dir=str(root), **QUIET)
    train = DataLoader(indexed(64, 1), batch_size=8)
    val = DataLoader(indexed(32, 2, shift=0.5), batch_size=8)
    trainer.fit(model, train, val)
    return {"val_loss": seen}


def shuffled_test(names: SimpleNamespace, root: Path) -> dict[str, Any]:
    seen: list[int] = []

    class Fixed(names.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 3)

        def test_step(self, batch: Any, batch_idx: int) -> None:
            x, y, index = batch
            seen.extend(index.tolist())
            self.log("acc", (self.net(x).argmax(1) == y).float().mean())

    names.seed(3)
    model = Fixed()
    trainer = names.Trainer(default_root_dir=str(root), **QUIET)
    (result,) = trainer.test(model, DataLoader(indexed(64, 4), batch_size=16, shuffle=True), verbose=False)
    return {"acc": result["acc"], "indices": seen}


def shuffled_val(names: SimpleNamespace, root: Path) -> dict[str, Any]:
    passes: list[list[int]] = []

    class Net(names.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(4, 3)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y, _ = batch
            return F.cross_entropy(self.net(x), y)

        def on_validation_epoch_start(self) -> None:
            passes.append([])

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            passes[-1].extend(batch[2].tolist())

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    names.seed(5)
    model = Net()
    trainer = names.Trainer(max_epochs=3, num_sanity_val_steps=1, default_root_dir=str(root), **QUIET)
    val = DataLoader(indexed(16, 6), batch_size=4, shuffle=True)
    trainer.fit(model, DataLoader(indexed(16, 5), batch_size=4), val)
    return {"passes": passes}


PROGRAMS = {"batchnorm": batchnorm, "shuffled_test": shuffled_test, "shuffled_val": shuffled_val}


def run_all(framework: str, root: Path) -> dict[str, Any]:
    """Every program under ``framework``, each rank's results."""
    names = api(framework)
    return {name: program(names, root / name) for name, program in PROGRAMS.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("lightning", "tandem"))
    parser.add_argument("--out", help="each rank writes OUT.rank<r>.json")
    parser.add_argument("--format", metavar="OUT", help="print the constants from a run's OUT.rank<r>.json files")
    args = parser.parse_args()
    if args.format:
        ranks = [json.loads(Path(f"{args.format}.rank{r}.json").read_text()) for r in (0, 1)]
        print(json.dumps(ranks))
        return
    torch.set_num_threads(1)
    out = Path(args.out).resolve()
    results = run_all(args.framework, out.parent / f"{out.name}.work")
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    target = out.parent / f"{out.name}.rank{rank}.json"
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")
    partial.write_text(json.dumps(results))
    os.replace(partial, target)
    print(f"rank {rank}: wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
