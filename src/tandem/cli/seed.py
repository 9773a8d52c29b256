"""``seed_everything`` in a config: its help text, and ``true`` turned into a seed (a random one, or under tandem's
``ddp`` launcher the one its rank 0 chose, so that every rank seeds alike)."""

from __future__ import annotations

import secrets

from tandem.utilities.rank_zero import rank_zero_warn

SEED_HELP = "seed for python, numpy and torch; true: a random seed (written to the saved config), false: none."


def resolve_seed(value: bool | int) -> bool | int:
    """``True``: a random seed; in a rank tandem's ``ddp`` launcher started, the one its rank 0 chose."""
    if value is not True:
        return value
    from tandem.strategies.environments import select_environment
    from tandem.utilities.seed import global_seed

    environment = select_environment()
    if getattr(environment, "launcher_pid", None) is not None:  # rank 0 exported its seed to the ranks it started
        return global_seed()
    if environment.creates_processes_externally and environment.world_size > 1:
        rank_zero_warn(
            "seed_everything: true under torchrun or srun: every rank picks its own seed and config.yaml records rank "
            "0's, so a rerun from it seeds the other ranks differently. Set seed_everything to a number to reproduce "
            "a multi-process run exactly."
        )
    return secrets.randbelow(2**32)
