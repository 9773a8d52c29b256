"""tandem: Lightning-style training on one device, DataParallel or DDP, picked by name."""

__version__ = "0.1.0"

from tandem.callbacks.callback import Callback  # noqa: E402
from tandem.module import DataModule, TrainingModule  # noqa: E402
from tandem.strategies.environments import rank_from_environment  # noqa: E402
from tandem.trainer.trainer import Trainer  # noqa: E402
from tandem.utilities.exceptions import renamed_from_lightning  # noqa: E402
from tandem.utilities.rank_zero import set_rank  # noqa: E402
from tandem.utilities.seed import seed_everything  # noqa: E402

set_rank(rank_from_environment())  # until a strategy sets it, trust the launcher's RANK

__all__ = ["Callback", "DataModule", "Trainer", "TrainingModule", "__version__", "seed_everything"]


def __getattr__(name: str) -> object:
    raise renamed_from_lightning(__name__, name)  # LightningModule -> TrainingModule, with a message
