"""DataModule: data loading in one place (download once, set up per process, hand out loaders)."""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, Dataset

from tandem.module.hooks import DataHooks
from tandem.module.hyperparameters import AttributeDict, HyperparametersMixin
from tandem.module.loading import load_datamodule
from tandem.module.training_module import class_only

if TYPE_CHECKING:
    from typing_extensions import Self

    from tandem.trainer.trainer import Trainer


class DataModule(HyperparametersMixin, DataHooks):
    """Data loading in one place: download once, set up per process, hand out loaders.

    ``prepare_data`` runs once per node (on local rank 0 while the other ranks wait) and must not set
    state on ``self``; ``setup(stage)`` runs on every process with ``stage`` in
    ``"fit" | "validate" | "test" | "predict"``. A loader method may return one loader, or (validation,
    test and predict) a list or a dict of them.

    Example:
        ```python
        class Digits(DataModule):
            def setup(self, stage):
                self.train_set, self.val_set = make_splits()

            def train_dataloader(self):
                return DataLoader(self.train_set, batch_size=64, shuffle=True)

            def val_dataloader(self):
                return DataLoader(self.val_set, batch_size=256)
        ```
    """

    #: run ``prepare_data`` on local rank 0 of every node (False: on global rank 0 only)
    prepare_data_per_node: bool = True

    def __init__(self) -> None:
        self._trainer_ref: weakref.ReferenceType[Trainer] | None = None
        self._hparams = AttributeDict()
        self._log_hyperparams = False  # True once save_hyperparameters() asks for the loggers

    @property
    def trainer(self) -> Trainer | None:
        """The Trainer of the current or latest run while it exists (held weakly, as the module holds it)."""
        ref = self.__dict__.get("_trainer_ref")  # a subclass may not have called DataModule.__init__
        return None if ref is None else ref()

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        self._trainer_ref = None if trainer is None else weakref.ref(trainer)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_trainer_ref": None}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    @classmethod
    def from_datasets(
        cls,
        train_dataset: Dataset | None = None,
        val_dataset: Dataset | Sequence[Dataset] | Mapping[str, Dataset] | None = None,
        test_dataset: Dataset | Sequence[Dataset] | Mapping[str, Dataset] | None = None,
        predict_dataset: Dataset | Sequence[Dataset] | Mapping[str, Dataset] | None = None,
        batch_size: int = 1,
        num_workers: int = 0,
        **datamodule_kwargs: Any,
    ) -> Self:
        """A DataModule whose loaders read the given datasets (the training one shuffled). Evaluation
        datasets may be a list or dict: one loader each.

        Example:
            ```python
            data = DataModule.from_datasets(train_set, val_set, batch_size=64)
            trainer.fit(model, data)
            ```
        """

        def loaders(datasets: Any, shuffle: bool) -> Any:
            def make(dataset: Dataset) -> DataLoader:
                return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers)

            if isinstance(datasets, Mapping):
                return {key: make(d) for key, d in datasets.items()}
            if isinstance(datasets, Sequence) and not isinstance(datasets, Dataset):
                return [make(d) for d in datasets]
            return make(datasets)

        datamodule = cls(**datamodule_kwargs)
        for name, datasets in (
            ("train_dataloader", train_dataset),
            ("val_dataloader", val_dataset),
            ("test_dataloader", test_dataset),
            ("predict_dataloader", predict_dataset),
        ):
            if datasets is not None:
                setattr(datamodule, name, (lambda d=datasets, s=name == "train_dataloader": loaders(d, s)))
        return datamodule

    @class_only
    def load_from_checkpoint(
        cls, checkpoint_path: str | os.PathLike, weights_only: bool | None = None, **kwargs: Any
    ) -> Self:
        """A DataModule rebuilt from a checkpoint of a fit that used one: ``cls(**saved hparams, **kwargs)``,
        with its ``load_state_dict`` given the saved state. ``weights_only=False``: the file is trusted (see
        [`TrainingModule.load_from_checkpoint`][tandem.TrainingModule.load_from_checkpoint])."""
        return load_datamodule(cls, checkpoint_path, weights_only, kwargs)
