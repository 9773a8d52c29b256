"""The loop and its entry points; ``from tandem.trainer import Trainer`` as in ``lightning.pytorch.trainer``."""

from tandem.trainer.rollback import Rollback, RollbackRecord
from tandem.trainer.trainer import Trainer

__all__ = ["Rollback", "RollbackRecord", "Trainer"]
