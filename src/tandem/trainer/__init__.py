"""The loop and its entry points; ``from tandem.trainer import Trainer`` as in ``lightning.pytorch.trainer``."""

from tandem.trainer.trainer import Trainer

__all__ = ["Trainer"]
