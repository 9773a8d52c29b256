"""TrainingModule and DataModule: what the user writes.

One job a file: ``training_module.py`` (the TrainingModule: the user's steps, its link to the Trainer), and the
TrainingModule's base classes ``optimization.py`` (its optimization front: ``self.optimizers()``, ``manual_backward``,
clipping) and ``logging.py`` (``self.log``); ``datamodule.py`` (the DataModule), ``hooks.py`` (the hooks: the data hooks
both share, the TrainingModule's model and checkpoint hooks), ``hyperparameters.py`` (``save_hyperparameters``),
``loading.py`` (``load_from_checkpoint``), ``export.py`` (TorchScript and ONNX) and ``overrides.py`` (which hooks a
user's class defines).
"""

from tandem.module.datamodule import DataModule
from tandem.module.optimization import changed_too_late
from tandem.module.overrides import calls_hook, is_overridden
from tandem.module.training_module import STEP_OUTPUT, TrainingModule

__all__ = ["STEP_OUTPUT", "DataModule", "TrainingModule", "calls_hook", "changed_too_late", "is_overridden"]
