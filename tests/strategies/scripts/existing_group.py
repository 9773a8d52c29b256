"""tandem inside a process group that the script initialised itself (as Ray Train's TorchTrainer does).

``python existing_group.py OUT``: spawns 2 processes; each calls init_process_group (gloo, a free port),
then fits with Trainer(strategy="ddp", devices=2), saves its weights to OUT/own_<rank>.pt, checks the group is
still there and its side channel open, and that devices=3 is refused with both sizes named. The same :func:`fit`
under tandem's own ddp launch, the weights these must equal, is the ``existing_group`` scenario of
``ddp_trainer_runs.py`` (the shared launch: ``tests/conftest.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import tandem  # noqa: E402
from helpers import TinyModule, loader, quiet_trainer  # noqa: E402
from tandem.strategies.environments.machine import find_free_port  # noqa: E402
from tandem.strategies.side_channel.group import current_channel  # noqa: E402
from tandem.utilities.exceptions import TandemConfigError  # noqa: E402


def fit(devices: int = 2, callbacks: list | None = None) -> torch.nn.Module:
    tandem.seed_everything(7)
    model = TinyModule()
    trainer = quiet_trainer(strategy="ddp", devices=devices, max_epochs=2, callbacks=callbacks)
    trainer.fit(model, loader(64, batch_size=8, shuffle=True))
    return model


def own(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = fit()
    torch.save(model.state_dict(), Path(out) / f"own_{rank}.pt")
    assert dist.is_initialized(), "tandem destroyed a process group it did not create"
    assert current_channel() is not None, "no side channel on the existing group"
    try:
        fit(devices=3)
    except TandemConfigError as err:
        (Path(out) / f"mismatch_{rank}.txt").write_text(str(err))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.start_processes(own, args=(find_free_port(), sys.argv[1]), nprocs=2, start_method="spawn")
