"""BasePredictionWriter: write predictions as they are made, with the dataset indices of each batch."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

from tandem.callbacks.callback import Callback
from tandem.utilities.exceptions import TandemConfigError, bad_choice
from tandem.utilities.signature import takes_dataloader_iter

if TYPE_CHECKING:
    from tandem.module import TrainingModule
    from tandem.trainer.trainer import Trainer

_INTERVALS = ("batch", "epoch", "batch_and_epoch")
_RANDOM = (RandomSampler, SubsetRandomSampler, WeightedRandomSampler)


class BasePredictionWriter(Callback):
    """Subclass it to write predictions during ``trainer.predict``; override ``write_on_batch_end`` and/or
    ``write_on_epoch_end``.

    Every process writes what it predicted: under ``ddp`` each rank predicts its share of the samples
    (every sample on exactly one rank), so write one file per rank (``trainer.global_rank`` in the name);
    ``batch_indices`` say which dataset samples each batch held, so the files can be joined afterwards.
    The indices are read from the predict dataloader's (batch) sampler, which must give the same order
    each time it is iterated: a shuffling predict loader is refused (pass ``shuffle=False``); for an
    iterable dataset the indices are ``None``.

    Args:
        write_interval: ``"batch"`` calls ``write_on_batch_end`` after each batch, ``"epoch"`` calls
            ``write_on_epoch_end`` once with every batch, ``"batch_and_epoch"`` both.

    Example:
        ```python
        class Writer(BasePredictionWriter):
            def __init__(self, folder):
                super().__init__(write_interval="epoch")
                self.folder = folder

            def write_on_epoch_end(self, trainer, module, predictions, batch_indices):
                torch.save({"predictions": predictions, "indices": batch_indices},
                           f"{self.folder}/predictions-rank{trainer.global_rank}.pt")

        trainer = Trainer(strategy="ddp", devices=2, callbacks=[Writer("out")])
        trainer.predict(model, loader)
        ```
    """

    def __init__(self, write_interval: str = "batch") -> None:
        if write_interval not in _INTERVALS:
            raise bad_choice("BasePredictionWriter: write_interval", write_interval, _INTERVALS)
        self.interval = write_interval
        self._index_iterators: list[Iterator[list[int] | None]] = []
        self._predictions: list[list[Any]] = []
        self._batch_indices: list[list[list[int] | None]] = []

    @property
    def state_key(self) -> str:
        return f"{type(self).__qualname__}{{'write_interval': {self.interval!r}}}"

    @property
    def on_batch(self) -> bool:
        return self.interval in ("batch", "batch_and_epoch")

    @property
    def on_epoch(self) -> bool:
        return self.interval in ("epoch", "batch_and_epoch")

    def write_on_batch_end(
        self,
        trainer: Trainer,
        module: TrainingModule,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        """Write one batch's ``prediction``; ``batch_indices`` are the dataset indices of its samples."""
        raise NotImplementedError(
            f"{type(self).__name__}(write_interval={self.interval!r}) must define write_on_batch_end."
        )

    def write_on_epoch_end(
        self, trainer: Trainer, module: TrainingModule, predictions: Sequence[Any], batch_indices: Sequence[Any]
    ) -> None:
        """Write this process's predictions: a list of batch outputs (one list per dataloader when there are
        several); ``batch_indices[dataloader][batch]`` are the dataset indices of each batch's samples."""
        raise NotImplementedError(
            f"{type(self).__name__}(write_interval={self.interval!r}) must define write_on_epoch_end."
        )

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if takes_dataloader_iter(pl_module.predict_step):  # no batch is known to belong to a prediction
            raise NotImplementedError(
                "The `PredictionWriterCallback` does not support using `dataloader_iter`: "
                f"{type(pl_module).__name__}.predict_step(self, dataloader_iter) takes its batches itself, so no "
                "prediction has known batch indices to write. Take the batch as predict_step(self, batch, batch_idx), "
                "or collect the predictions from trainer.predict(...) and write them yourself."
            )

    def on_predict_epoch_start(self, trainer: Trainer, module: TrainingModule) -> None:
        loaders = _as_list(trainer.predict_dataloaders)
        self._index_iterators = [_batch_indices(loader) for loader in loaders]
        self._predictions = [[] for _ in loaders]
        self._batch_indices = [[] for _ in loaders]

    def on_predict_batch_end(
        self,
        trainer: Trainer,
        module: TrainingModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        indices = next(self._index_iterators[dataloader_idx], None)
        if self.on_batch:
            self.write_on_batch_end(trainer, module, outputs, indices, batch, batch_idx, dataloader_idx)
        if self.on_epoch:
            self._predictions[dataloader_idx].append(outputs)
            self._batch_indices[dataloader_idx].append(indices)

    def on_predict_epoch_end(self, trainer: Trainer, module: TrainingModule) -> None:
        if self.on_epoch:
            predictions = self._predictions[0] if len(self._predictions) == 1 else self._predictions
            self.write_on_epoch_end(trainer, module, predictions, self._batch_indices)
        self._index_iterators, self._predictions, self._batch_indices = [], [], []


def _as_list(loaders: Any) -> list[Any]:
    if loaders is None:
        return []
    if isinstance(loaders, Mapping):
        return list(loaders.values())
    return list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]


def _batch_indices(loader: Any) -> Iterator[list[int] | None]:
    """The dataset indices of each batch ``loader`` will yield, drawn from its own (batch) sampler."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return itertools.repeat(None)
    source = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    shuffler = _find_shuffler(source)
    if shuffler is not None:
        raise TandemConfigError(
            f"BasePredictionWriter: the predict dataloader draws a new random order each time "
            f"({type(shuffler).__name__}), so the dataset indices of its batches cannot be known. Pass "
            "shuffle=False (and no random sampler) to the predict DataLoader."
        )
    if loader.batch_sampler is None:  # batch_size=None: each batch is one sample
        return ([index] for index in loader.sampler)
    return (list(batch) for batch in loader.batch_sampler)


def _find_shuffler(sampler: Any) -> Any:
    """The first sampler in the chain (batch samplers and wrappers, through their ``sampler`` / ``inner`` /
    ``source``) that draws a random order, or None."""
    seen: set[int] = set()
    while sampler is not None and id(sampler) not in seen:
        seen.add(id(sampler))
        if isinstance(sampler, _RANDOM) or (isinstance(sampler, DistributedSampler) and sampler.shuffle):
            return sampler
        sampler = next(
            (getattr(sampler, name) for name in ("sampler", "inner", "source") if hasattr(sampler, name)), None
        )
    return None
