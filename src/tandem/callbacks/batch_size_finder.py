"""BatchSizeFinder: the largest batch size that trains without running out of memory, found at the start of a
fit, as Lightning's (``lightning.pytorch.callbacks.BatchSizeFinder``, ``tuner.batch_size_scaling``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.callbacks.callback import Callback
from tandem.utilities.data import has_len
from tandem.utilities.exceptions import TandemConfigError, TunerExit, bad_choice, incompatible, out_of_range
from tandem.utilities.memory import garbage_collection_cuda, is_oom_error
from tandem.utilities.parsing import lightning_hasattr, lightning_setattr
from tandem.utilities.rank_zero import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer
    from tandem.trainer.trial import Trial


class _Search:
    """One batch size search: tries sizes in a trial, keeps the module's (or DataModule's) attribute up to date."""

    def __init__(self, trainer: Trainer, model: TrainingModule, trial: Trial, batch_arg_name: str) -> None:
        self.trainer, self.model, self.trial, self.name = trainer, model, trial, batch_arg_name

    def set(self, size: int) -> None:
        lightning_setattr(self.model, self.name, size)
        self.trial.reload_data()

    def fits(self, size: int) -> bool:
        """Train a trial at ``size``: False when it ran out of memory (any other error is raised)."""
        self.set(size)
        try:
            self.trial.run()
        except RuntimeError as exception:
            if not is_oom_error(exception):
                raise
            del exception  # its traceback holds the failed trial's tensors
            garbage_collection_cuda()
            rank_zero_info(f"Batch size {size} failed (out of memory).")
            return False
        rank_zero_info(f"Batch size {size} succeeded.")
        return True

    def dataset_size(self) -> int | None:
        """Samples in the training dataset (None for an iterable one): no point trying a larger batch."""
        dataset = getattr(self.trainer.train_dataloader, "dataset", None)
        return len(dataset) if dataset is not None and has_len(dataset) else None

    def full(self, size: int) -> bool:
        total = self.dataset_size()
        if total is not None and size >= total:
            rank_zero_info(f"The batch size {size} is greater or equal than the length of your dataset.")
            return True
        return False

    def power(self, size: int, max_trials: int) -> int | None:
        """Double until a size runs out of memory (or ``max_trials``); the last that fit. When the first fails,
        halve until one fits."""
        fitted = None
        for _ in range(max_trials):
            if self.fits(size):
                fitted = size
                if self.full(size):
                    break
                size *= 2
            elif fitted is not None or size == 1:
                break
            else:
                size = max(1, size // 2)
        return fitted

    def binsearch(self, size: int, max_trials: int) -> int | None:
        """Double until a size runs out of memory, then bisect between the last that fit and the first that did
        not; ``max_trials`` bounds the sizes that fit."""
        low, high, successes = 0, None, 0  # low: the largest size that fit (0: none yet)
        while True:
            if self.fits(size):
                low, successes = size, successes + 1
                if successes > max_trials or (high is None and self.full(size)):
                    break
                size = size * 2 if high is None else (low + high) // 2
            else:
                high = size
                size = (low + high) // 2
            if high is not None and high - low <= 1:
                break
        return low or None


def scale_batch_size(
    trainer: Trainer,
    model: TrainingModule,
    mode: str = "power",
    steps_per_trial: int = 3,
    init_val: int = 2,
    max_trials: int = 25,
    batch_arg_name: str = "batch_size",
) -> int | None:
    """The search, run from a hook of a fit; see [`BatchSizeFinder`][tandem.callbacks.BatchSizeFinder]. Returns the size
    found (also set on the module / DataModule, whose loaders are built again with it), or None under
    ``fast_dev_run``."""
    if trainer.fast_dev_run:
        rank_zero_warn("Skipping the batch size finder: fast_dev_run is set.")
        return None
    with trainer.trial([], max_steps=steps_per_trial) as trial:
        if not trial.reloadable:
            raise incompatible(
                "BatchSizeFinder with dataloaders passed to fit() directly",
                "the search builds the training loader again for each batch size it tries, from train_dataloader() "
                "of the module or DataModule",
                f"Build the loader in train_dataloader() with batch_size=self.{batch_arg_name}, or pass a DataModule.",
            )
        search = _Search(trainer, model, trial, batch_arg_name)
        found = search.power(init_val, max_trials) if mode == "power" else search.binsearch(init_val, max_trials)
        if found is None:
            raise TandemConfigError(
                "The batch size finder found no batch size that fits: even batch size 1 ran out of memory. Use a "
                "smaller model or inputs, precision='bf16-mixed', or a device with more memory."
            )
        lightning_setattr(model, batch_arg_name, found)  # the trial builds the fit's loaders with it on exit
        garbage_collection_cuda()
    rank_zero_info(f"Finished batch size finder, will continue with full run using batch size {found}")
    return found


class BatchSizeFinder(Callback):
    """Finds the largest batch size that trains without running out of memory, when the fit starts.

    Each size is tried for ``steps_per_trial`` optimizer steps in a ``Trainer.trial``; a size that raises an
    out-of-memory error (``torch.OutOfMemoryError``, "CUDA out of memory", see
    ``is_oom_error``) is too large. The size found is set where
    ``batch_arg_name`` is found (the module, its hparams, the DataModule, its hparams), the training loaders are
    built again with it, and the fit starts from exactly the state it had before the search. The loaders must come
    from ``train_dataloader()`` of the module or DataModule, reading that attribute. ``optimal_batch_size`` holds
    the result.

    Not under several processes (``ddp``): a rank that runs out of memory in the middle of a step leaves the others
    waiting in the step's collective. Find the size with ``devices=1`` and train with it.

    Args:
        mode: ``"power"``: double the size until one runs out of memory, keep the last that fit. ``"binsearch"``:
            double likewise, then bisect between the last that fit and the first that did not.
        steps_per_trial: optimizer steps each size trains (one shows most out-of-memory errors; a few are safer).
        init_val: the first size tried.
        max_trials: the most sizes tried (``"binsearch"``: the most sizes that fit).
        batch_arg_name: the attribute holding the batch size.

    Example:
        ```python
        trainer = Trainer(callbacks=[BatchSizeFinder(mode="binsearch")])
        trainer.fit(model)  # model.batch_size is the largest that fits, then training runs with it
        ```
    """

    SUPPORTED_MODES = ("power", "binsearch")

    def __init__(
        self,
        mode: str = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
    ) -> None:
        mode = mode.lower() if isinstance(mode, str) else mode
        if mode not in self.SUPPORTED_MODES:
            raise bad_choice("mode", mode, self.SUPPORTED_MODES)
        for name, value in (("steps_per_trial", steps_per_trial), ("init_val", init_val), ("max_trials", max_trials)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise out_of_range(name, value, "an int >= 1")
        self._mode, self._steps_per_trial, self._init_val = mode, steps_per_trial, init_val
        self._max_trials, self._batch_arg_name = max_trials, batch_arg_name
        self._early_exit = False  # set by Tuner: the fit ends after the search
        self.optimal_batch_size: int | None = init_val

    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str | None = None) -> None:
        if stage != "fit":
            return
        if trainer.world_size > 1:
            raise incompatible(
                f"BatchSizeFinder with {trainer.world_size} processes",
                "a rank that runs out of memory in the middle of a step would leave the others waiting in the step's "
                "collective",
                "Find the batch size with devices=1 (or strategy='auto' on one device), then train with it.",
            )
        if not lightning_hasattr(pl_module, self._batch_arg_name):
            raise TandemConfigError(
                f"BatchSizeFinder(batch_arg_name={self._batch_arg_name!r}): neither {type(pl_module).__name__} nor "
                "its hparams (nor the DataModule or its hparams) has it. Store the batch size there and build "
                "train_dataloader() with it."
            )
        hparams = getattr(pl_module, "hparams", {})
        if hasattr(pl_module, self._batch_arg_name) and self._batch_arg_name in hparams:
            rank_zero_warn(
                f"Field `model.{self._batch_arg_name}` and `model.hparams.{self._batch_arg_name}` are mutually "
                f"exclusive! `model.{self._batch_arg_name}` will be used as the initial batch size for scaling. If "
                "this is not the intended behavior, please remove either one."
            )

    def scale_batch_size(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        """Run the search now and keep its result in ``optimal_batch_size``."""
        self.optimal_batch_size = scale_batch_size(
            trainer,
            pl_module,
            self._mode,
            self._steps_per_trial,
            self._init_val,
            self._max_trials,
            self._batch_arg_name,
        )
        if self._early_exit:
            raise TunerExit

    def on_fit_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self.scale_batch_size(trainer, pl_module)
