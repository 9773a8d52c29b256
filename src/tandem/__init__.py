"""tandem: Lightning-style training on one device, DataParallel or DDP, picked by name."""

from typing import TYPE_CHECKING

from tandem.callbacks.callback import Callback
from tandem.module import DataModule, TrainingModule
from tandem.strategies.environments import rank_from_environment
from tandem.trainer.trainer import Trainer
from tandem.utilities.exceptions import renamed_from_lightning
from tandem.utilities.rank_zero import set_rank
from tandem.utilities.seed import seed_everything
from tandem.version import __version__

set_rank(rank_from_environment())  # until a strategy sets it, trust the launcher's RANK

__all__ = ["Callback", "DataModule", "Trainer", "TrainingModule", "__version__", "seed_everything"]

if not TYPE_CHECKING:  # hidden from type checkers, which then flag a misspelt or Lightning name as unknown

    def __getattr__(name: str) -> object:
        raise renamed_from_lightning(__name__, name)  # LightningModule -> TrainingModule, with a message
