"""What the user writes, under Lightning's path: ``from tandem.core import TrainingModule, DataModule``
reads as ``from lightning.pytorch.core import LightningModule, LightningDataModule``."""

from typing import Any

from tandem.module import DataModule, TrainingModule
from tandem.utilities.exceptions import renamed_from_lightning

__all__ = ["DataModule", "TrainingModule"]


def __getattr__(name: str) -> Any:
    raise renamed_from_lightning(__name__, name)
