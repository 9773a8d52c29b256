"""When the fit loop reads the training batches, relative to ``training_step``: a dataset whose items depend on the
training state (an episode played with the current policy) shows it. Written once for both frameworks:

    python tests/trainer/scripts/lookahead_program.py lightning   # with lightning installed: prints its sequences
    python tests/trainer/scripts/lookahead_program.py tandem
    python tests/trainer/scripts/lookahead_program.py lightning 2   # strategy="ddp", devices=2 (CPU, gloo)
    python tests/trainer/scripts/lookahead_program.py tandem 2 OUT  # also writes OUT.rank<r>.json per process

Each item is ``(10 * rank + index in the epoch, training steps run when the dataset produced it)``; one sequence per
setting (and per rank under ddp).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

#: the settings, by name: the Trainer's arguments (an epoch of 5 batches of unknown length, 2 epochs)
SETTINGS: dict[str, dict[str, Any]] = {
    "unknown_length": {},
    "limit_train_batches": {"limit_train_batches": 4},
    "accumulate": {"accumulate_grad_batches": 2},
}


def run(framework: str, devices: int = 1) -> dict[str, list[list[int]]]:
    if framework == "lightning":
        import lightning.pytorch as pl

        module_class, trainer_class = pl.LightningModule, pl.Trainer
    else:
        import tandem

        module_class, trainer_class = tandem.TrainingModule, tandem.Trainer
    steps = [0]

    class Episodes(IterableDataset):
        def __iter__(self):
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            for i in range(5):  # each rank its own items (10 * rank + i)
                yield torch.tensor([float(10 * rank + i), float(steps[0])])

    class Policy(module_class):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
            self.seen: list[list[int]] = []

        def training_step(self, batch, batch_idx):
            self.seen.append([int(v) for v in batch[0].tolist()])
            steps[0] += 1
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    out = {}
    for name, kwargs in SETTINGS.items():
        steps[0] = 0
        model = Policy()
        trainer = trainer_class(
            max_epochs=2,
            accelerator="cpu",
            devices=devices,
            strategy="ddp" if devices > 1 else "auto",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            **kwargs,
        )
        trainer.fit(model, DataLoader(Episodes(), batch_size=1))
        out[name] = model.seen
        rank = trainer.global_rank
    return {f"rank{rank}/{name}": seen for name, seen in out.items()} if devices > 1 else out


if __name__ == "__main__":
    result = json.dumps(run(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1))
    if len(sys.argv) > 3:  # a file per process (the ranks' lines would interleave on one stdout)
        rank = next(iter(json.loads(result)))[len("rank")] if int(sys.argv[2]) > 1 else "0"  # "rank<r>/..." keys
        Path(f"{sys.argv[3]}.rank{rank}.json").write_text(result)
    print(result, flush=True)
