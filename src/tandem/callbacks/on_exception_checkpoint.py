"""OnExceptionCheckpoint: save a checkpoint when a run raises, to resume from or inspect."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tandem.callbacks.callback import Checkpoint
from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer


class OnExceptionCheckpoint(Checkpoint):
    """Save a checkpoint to ``dirpath/filename.ckpt`` when fit (or another run) raises, including
    ``KeyboardInterrupt``; resume with ``trainer.fit(model, ckpt_path=callback.ckpt_path)``. A run that ends
    without an exception removes the file (it would be stale), as Lightning does.

    Saving is a collective step: every process must raise (as one process's failure stops the others in a
    distributed run). If the checkpoint cannot be written, a warning says why and the run's own exception
    propagates.

    Args:
        dirpath: the folder of the checkpoint (given now: an exception can come at any moment).
        filename: the file name without extension.

    Example:
        ```python
        trainer = Trainer(callbacks=[OnExceptionCheckpoint("checkpoints")])
        ```
    """

    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str | os.PathLike, filename: str = "on_exception") -> None:
        if not filename:
            raise TandemConfigError("OnExceptionCheckpoint: filename is empty; give a name such as 'on_exception'.")
        self.dirpath = dirpath
        self.filename = filename
        self._raised = False

    @property
    def ckpt_path(self) -> str:
        """Where the checkpoint is written."""
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        self._raised = False

    def on_exception(self, trainer: Trainer, pl_module: TrainingModule, exception: BaseException) -> None:
        self._raised = True
        try:
            trainer.save_checkpoint(self.ckpt_path)  # overwrites an older one
        except Exception as err:
            rank_zero_warn(
                f"OnExceptionCheckpoint: no checkpoint written to {self.ckpt_path} after {type(exception).__name__}: "
                f"saving failed with {type(err).__name__}: {err}"
            )

    def teardown(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if not self._raised:  # the run finished: a checkpoint from an earlier failure is stale
            trainer.strategy.remove_checkpoint(self.ckpt_path)
