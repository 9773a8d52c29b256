"""TrainingModule and DataModule: what the user writes."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from tandem.utilities.rank_zero import rank_zero_print

if TYPE_CHECKING:
    from tandem.trainer.trainer import Trainer


class AttributeDict(dict):
    """A dict whose keys read as attributes: ``self.hparams.lr``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"hparams has no {key!r}; saved: {sorted(self)}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


class TrainingModule(nn.Module):
    """A model together with how to train, evaluate and optimize it.

    Override ``training_step`` and ``configure_optimizers``; the rest is optional. Hooks run on every
    process; ``self.log`` collects values and the Trainer routes them to loggers on rank zero.

    Example::

        class Classifier(TrainingModule):
            def __init__(self, lr: float = 0.1):
                super().__init__()
                self.save_hyperparameters()
                self.net = nn.Linear(32, 10)

            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = F.cross_entropy(self.net(x), y)
                self.log("train_loss", loss, prog_bar=True)
                return loss

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: Trainer | None = None
        self._hparams: AttributeDict = AttributeDict()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_trainer"] = None  # pickled for spawned processes or deep copies: never drag the Trainer along
        return state

    # ------------------------------------------------------------------ the user's steps
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | Mapping[str, Any] | None:
        """Return the loss (a scalar tensor), a dict with ``"loss"``, or None to skip this batch."""
        raise NotImplementedError(
            f"{type(self).__name__} has no training_step. Define training_step(self, batch, batch_idx) "
            "returning the loss to use Trainer.fit."
        )

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        """Compute and ``self.log`` validation metrics for one batch."""

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        """Compute and ``self.log`` test metrics for one batch."""

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        """Return the prediction for one batch; the default calls ``self(batch)`` on the inputs."""
        if isinstance(batch, (list, tuple)) and len(batch) > 0:
            batch = batch[0]
        return self(batch)

    def configure_model(self) -> None:
        """Build layers late, at the start of every stage, on the device and once the processes exist (a
        sharding strategy may call ``fully_shard`` on them here). Runs once per stage: make it idempotent
        (``if self.layers is not None: return``)."""

    def configure_optimizers(self) -> Any:
        """Return an optimizer, or ``{"optimizer": opt, "lr_scheduler": scheduler or {"scheduler": ...,
        "interval": "epoch" | "step", "frequency": 1, "monitor": "val_loss"}}``."""
        raise NotImplementedError(
            f"{type(self).__name__} has no configure_optimizers. Define it to return an optimizer, e.g. "
            "torch.optim.Adam(self.parameters(), lr=1e-3)."
        )

    # ------------------------------------------------------------------ logging
    def log(
        self,
        name: str,
        value: Any,
        *,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        prog_bar: bool = False,
        logger: bool = True,
        sync_dist: bool = False,
        reduce_fx: str = "mean",
        batch_size: int | None = None,
    ) -> None:
        """Record a metric. Floats, scalar tensors and torchmetrics ``Metric`` objects are accepted.

        Args:
            name: key in ``trainer.callback_metrics`` and in the loggers.
            value: the value; a ``Metric`` is computed (and synchronised by torchmetrics) at epoch end.
            on_step / on_epoch: log every step / the epoch's aggregate. Defaults: step in training
                hooks, epoch in evaluation and epoch-end hooks. Both: keys ``name_step`` and ``name_epoch``.
            prog_bar: show in the progress bar.
            logger: send to the loggers.
            sync_dist: reduce across processes (by sums and counts, then divide). Epoch values are
                reduced once per epoch; in evaluation, step values stay per process (ranks see
                different numbers of batches there, so a per-step collective could never complete).
            reduce_fx: ``"mean"`` (weighted by batch size), ``"sum"``, ``"max"`` or ``"min"``.
            batch_size: weight for the epoch mean; inferred from the batch when omitted.
        """
        if self._trainer is None:
            return  # called outside a Trainer run (e.g. a unit test calling training_step): nothing to collect
        self._trainer._metrics.log(
            name, value, on_step, on_epoch, prog_bar, logger, sync_dist, reduce_fx, batch_size
        )  # positional: this runs every step

    def log_dict(self, values: Mapping[str, Any], **kwargs: Any) -> None:
        """``self.log`` for each item, with the same options."""
        for name, value in values.items():
            self.log(name, value, **kwargs)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once, on global rank 0."""
        rank_zero_print(*args, **kwargs)

    # ------------------------------------------------------------------ hyperparameters
    def save_hyperparameters(self, *names: str, ignore: Iterable[str] | str | None = None) -> None:
        """Store the ``__init__`` arguments of the caller in ``self.hparams`` (and in checkpoints and loggers).

        Args:
            names: only these arguments (all by default); a single dict or Namespace is taken as is.
            ignore: arguments to leave out (e.g. modules passed in).
        """
        if len(names) == 1 and not isinstance(names[0], str):
            given = names[0]
            self._hparams = AttributeDict(vars(given) if not isinstance(given, Mapping) else given)
            return
        frame = inspect.currentframe().f_back
        init_args = _collect_init_args(frame, type(self))
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        if names:
            init_args = {k: v for k, v in init_args.items() if k in names}
        self._hparams = AttributeDict({k: v for k, v in init_args.items() if k not in ignored})

    @property
    def hparams(self) -> AttributeDict:
        return self._hparams

    # ------------------------------------------------------------------ read-only views of the run
    @property
    def trainer(self) -> Trainer:
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer; call trainer.fit(model) first.")
        return self._trainer

    @property
    def device(self) -> torch.device:
        for tensor in self.parameters():
            return tensor.device
        for module in self.modules():  # a DataParallel replica keeps its parameters here
            for tensor in getattr(module, "_former_parameters", {}).values():
                return tensor.device
        for tensor in self.buffers():
            return tensor.device
        return torch.device("cpu")

    @property
    def global_rank(self) -> int:
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        return self._trainer.local_rank if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer is not None else 0

    # ------------------------------------------------------------------ hooks (all optional)
    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_before_backward(self, loss: torch.Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...


def _collect_init_args(frame: Any, cls: type) -> dict[str, Any]:
    """The arguments of the ``__init__`` calls on the stack for this object; the innermost call wins."""
    collected: list[dict[str, Any]] = []
    while frame is not None:
        code, local_vars = frame.f_code, frame.f_locals
        if code.co_name == "__init__" and isinstance(local_vars.get("self"), cls):
            count = code.co_argcount + code.co_kwonlyargcount
            names = code.co_varnames[:count]
            args = {name: local_vars[name] for name in names[1:] if name in local_vars}
            if code.co_flags & inspect.CO_VARKEYWORDS:
                varkw = code.co_varnames[count + bool(code.co_flags & inspect.CO_VARARGS)]
                args.update(local_vars.get(varkw, {}))
            collected.append(args)
        frame = frame.f_back
    merged: dict[str, Any] = {}
    for args in reversed(collected):
        merged.update(args)
    return merged


class DataModule:
    """Data loading in one place: download once, set up per process, hand out loaders.

    ``prepare_data`` runs once per node (on local rank 0 while the other ranks wait) and must not set
    state on ``self``; ``setup(stage)`` runs on every process with ``stage`` in
    ``"fit" | "validate" | "test" | "predict"``.

    Example::

        class Digits(DataModule):
            def setup(self, stage):
                self.train_set, self.val_set = make_splits()

            def train_dataloader(self):
                return DataLoader(self.train_set, batch_size=64, shuffle=True)

            def val_dataloader(self):
                return DataLoader(self.val_set, batch_size=256)
    """

    def __init__(self) -> None:
        self.trainer: Trainer | None = None

    def prepare_data(self) -> None: ...
    def setup(self, stage: str) -> None: ...
    def teardown(self, stage: str) -> None: ...

    def train_dataloader(self) -> DataLoader | None:
        return None

    def val_dataloader(self) -> DataLoader | None:
        return None

    def test_dataloader(self) -> DataLoader | None:
        return None

    def predict_dataloader(self) -> DataLoader | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
