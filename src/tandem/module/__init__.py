"""TrainingModule and DataModule: what the user writes.

One job a file: ``training_module.py`` (the TrainingModule), ``datamodule.py`` (the DataModule), ``hooks.py`` (the
data hooks both share), ``hyperparameters.py`` (``save_hyperparameters``), ``loading.py`` (``load_from_checkpoint``),
``export.py`` (TorchScript and ONNX) and ``overrides.py`` (which hooks a user's class defines).
"""

from tandem.module.datamodule import DataModule
from tandem.module.overrides import calls_hook, is_overridden
from tandem.module.training_module import STEP_OUTPUT, TrainingModule, changed_too_late

__all__ = ["STEP_OUTPUT", "DataModule", "TrainingModule", "calls_hook", "changed_too_late", "is_overridden"]
