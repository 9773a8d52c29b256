"""The tuner: the learning-rate range test and the batch size search, as Lightning's
(``lightning.pytorch.tuner``): ``Tuner(trainer).lr_find(model)`` and ``Tuner(trainer).scale_batch_size(model)``.
The searches themselves are the callbacks ``LearningRateFinder`` and ``BatchSizeFinder``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.utilities.lazy import lazy_attributes

if TYPE_CHECKING:
    from tandem.callbacks.lr_finder import LRFinder
    from tandem.tuner.tuning import Tuner

_LAZY = {"LRFinder": "tandem.callbacks.lr_finder", "Tuner": "tandem.tuner.tuning"}

__all__ = [
    "LRFinder",
    "Tuner",
]

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
