"""The tuner: the learning-rate range test and the batch size search, as Lightning's
(``lightning.pytorch.tuner``): ``Tuner(trainer).lr_find(model)`` and ``Tuner(trainer).scale_batch_size(model)``.
The searches themselves are the callbacks ``LearningRateFinder`` and ``BatchSizeFinder``."""

from tandem.callbacks.lr_finder import LRFinder
from tandem.tuner.tuning import Tuner

__all__ = ["LRFinder", "Tuner"]
