"""Layer synchronisation across processes: ``Trainer(plugins=[TorchSyncBatchNorm()])``, as in Lightning."""

from __future__ import annotations

from torch import nn


class TorchSyncBatchNorm:
    """BatchNorm layers computed over the whole batch of every process (torch's ``SyncBatchNorm``).

    ``Trainer(plugins=[TorchSyncBatchNorm()])`` is ``Trainer(sync_batchnorm=True)``: strategies with several
    processes convert the module when they set it up (DDP: CUDA devices only); one process ignores it.

    Example:
        ```python
        Trainer(strategy="ddp", accelerator="cuda", devices=4, plugins=[TorchSyncBatchNorm()])
        ```
    """

    def apply(self, model: nn.Module) -> nn.Module:
        """``model`` with every BatchNorm layer replaced by a ``SyncBatchNorm`` sharing its parameters."""
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)

    def __repr__(self) -> str:
        return "TorchSyncBatchNorm()"
