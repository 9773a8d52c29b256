"""``Tuner``: a fit that runs one search (learning rate or batch size) and ends after it, as Lightning's
(``lightning.pytorch.tuner.Tuner``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tandem.callbacks.batch_size_finder import BatchSizeFinder
from tandem.callbacks.lr_finder import LearningRateFinder, LRFinder
from tandem.utilities.exceptions import TandemConfigError, incompatible

if TYPE_CHECKING:
    from tandem.callbacks.callback import Callback
    from tandem.module import DataModule, TrainingModule
    from tandem.trainer.trainer import Trainer

_METHODS = ("fit", "validate", "test", "predict")


class Tuner:
    """Finds a learning rate or a batch size before training.

    Each search is a ``trainer.fit`` that starts the search at fit start (the ``LearningRateFinder`` or
    ``BatchSizeFinder`` callback) and ends there; everything the search trained is put back, so the
    ``trainer.fit`` that follows starts exactly as it would have without the search (weights, optimizer, counters
    and RNG), only with the value found set on the module.

    Args:
        trainer: the Trainer to search with (its strategy, precision and limits).

    Example:
        ```python
        trainer = Trainer(max_epochs=10)
        tuner = Tuner(trainer)
        lr_finder = tuner.lr_find(model)  # sets model.lr to lr_finder.suggestion()
        tuner.scale_batch_size(model, mode="binsearch")  # sets model.batch_size
        trainer.fit(model)
        ```
    """

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer

    def lr_find(
        self,
        model: TrainingModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        dataloaders: Any = None,
        datamodule: DataModule | None = None,
        method: str = "fit",
        min_lr: float = 1e-8,
        max_lr: float = 1,
        num_training: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
    ) -> LRFinder | None:
        """The learning-rate range test: ``num_training`` steps with the rate rising from ``min_lr`` to ``max_lr``
        (see [`LearningRateFinder`][tandem.callbacks.LearningRateFinder]). Returns the results (``.results``,
        ``.suggestion()``, ``.plot()``), or None under ``fast_dev_run``.

        Args:
            model: the module to search for.
            train_dataloaders: training loaders, or a DataModule (as in ``fit``).
            val_dataloaders: validation loaders (the search itself does not validate).
            dataloaders: for ``method="fit"``, leave None.
            datamodule: a DataModule giving the loaders.
            method: ``"fit"`` only (the range test trains).
            min_lr: the first learning rate tried.
            max_lr: the last.
            num_training: optimizer steps of the search.
            mode: ``"exponential"`` or ``"linear"``.
            early_stop_threshold: stop once the smoothed loss exceeds this times its best (None: never).
            update_attr: set the suggestion on the module's ``lr`` / ``learning_rate`` (or ``attr_name``).
            attr_name: the attribute holding the learning rate.
        """
        if method != "fit":
            raise TandemConfigError(
                f"Tuner.lr_find(method={method!r}): the learning-rate range test trains, so method='fit' is the only "
                "valid one."
            )
        _check_tuner_configuration(train_dataloaders, val_dataloaders, dataloaders, method)
        self._check_no_finder(LearningRateFinder)
        callback = LearningRateFinder(
            min_lr=min_lr,
            max_lr=max_lr,
            num_training_steps=num_training,
            mode=mode,
            early_stop_threshold=early_stop_threshold,
            update_attr=update_attr,
            attr_name=attr_name,
        )
        self._run(callback, model, train_dataloaders, val_dataloaders, datamodule)
        return callback.optimal_lr

    def scale_batch_size(
        self,
        model: TrainingModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        dataloaders: Any = None,
        datamodule: DataModule | None = None,
        method: str = "fit",
        mode: str = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
    ) -> int | None:
        """The largest batch size that trains without running out of memory (see
        [`BatchSizeFinder`][tandem.callbacks.BatchSizeFinder]); it is set on the module (or its hparams, or the
        DataModule), and returned (None under ``fast_dev_run``). The training loader must come from
        ``train_dataloader()`` of the module or DataModule. One process only.

        Args:
            model: the module to search for.
            train_dataloaders: leave None (the search builds the loaders from the hooks), or a DataModule.
            val_dataloaders: validation loaders (the search itself does not validate).
            dataloaders: for ``method="fit"``, leave None.
            datamodule: a DataModule giving the loaders.
            method: ``"fit"`` (tandem searches with training steps, which also bound evaluation's memory).
            mode: ``"power"`` or ``"binsearch"``.
            steps_per_trial: optimizer steps each size trains.
            init_val: the first size tried.
            max_trials: the most sizes tried.
            batch_arg_name: the attribute holding the batch size.
        """
        _check_tuner_configuration(train_dataloaders, val_dataloaders, dataloaders, method)
        if method != "fit":
            raise TandemConfigError(
                f"Tuner.scale_batch_size(method={method!r}) is not supported by tandem: its search trains. Use "
                "method='fit'; a batch size that trains fits evaluation too (evaluation keeps no gradients)."
            )
        if self._trainer.world_size > 1:
            raise incompatible(
                f"Tuner.scale_batch_size with {self._trainer.world_size} processes",
                "a rank that runs out of memory in the middle of a step would leave the others waiting in the step's "
                "collective",
                "Find the batch size with devices=1, then train with it.",
            )
        self._check_no_finder(BatchSizeFinder)
        callback = BatchSizeFinder(
            mode=mode,
            steps_per_trial=steps_per_trial,
            init_val=init_val,
            max_trials=max_trials,
            batch_arg_name=batch_arg_name,
        )
        self._run(callback, model, train_dataloaders, val_dataloaders, datamodule)
        return callback.optimal_batch_size

    def _run(
        self,
        callback: LearningRateFinder | BatchSizeFinder,
        model: TrainingModule,
        train_dataloaders: Any,
        val_dataloaders: Any,
        datamodule: DataModule | None,
    ) -> None:
        """A fit with ``callback`` first, ended by it after its search."""
        trainer = self._trainer
        if (
            getattr(trainer.strategy, "start_method", None) in ("spawn", "fork")
            and trainer.strategy.launcher is not None
        ):
            raise incompatible(
                f"Tuner with strategy={trainer.strategy.name!r}",
                "the search runs in spawned processes, and the value it finds would not come back to this one",
                "Use strategy='ddp' (it re-runs your script on every rank), or add the LearningRateFinder / "
                "BatchSizeFinder callback to the Trainer, which searches inside the spawned fit.",
            )
        callback._early_exit = True
        trainer.callbacks = [callback, *trainer.callbacks]
        try:
            trainer.fit(model, train_dataloaders, val_dataloaders, datamodule)
        finally:
            trainer.callbacks = [c for c in trainer.callbacks if c is not callback]

    def _check_no_finder(self, kind: type[Callback]) -> None:
        if any(isinstance(c, kind) for c in self._trainer.callbacks):
            raise TandemConfigError(
                f"The Trainer already has a {kind.__name__} callback, which searches when the fit starts. Remove it "
                "to search with the Tuner, or keep it and call trainer.fit without the Tuner."
            )


def _check_tuner_configuration(train_dataloaders: Any, val_dataloaders: Any, dataloaders: Any, method: str) -> None:
    if method not in _METHODS:
        raise TandemConfigError(f"method={method!r} is not valid; expected one of: {', '.join(map(repr, _METHODS))}.")
    if method == "fit" and dataloaders is not None:
        raise TandemConfigError(
            "Tuner with method='fit' got dataloaders=...; pass train_dataloaders= and val_dataloaders= instead."
        )
    if method != "fit" and (train_dataloaders is not None or val_dataloaders is not None):
        raise TandemConfigError(
            f"Tuner with method={method!r} got train_dataloaders / val_dataloaders; pass dataloaders= instead."
        )
