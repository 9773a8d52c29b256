"""Strategies: where the module runs and how processes cooperate. Found by name through the registry.

The strategy classes are imported when first read (``from tandem.strategies import DDPStrategy``) or when the
registry builds one by name, so ``import tandem`` does not load DDP, DataParallel or FSDP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.strategies.checkpoint_io import AsyncCheckpointIO
from tandem.strategies.layer_sync import TorchSyncBatchNorm
from tandem.strategies.precision import Precision
from tandem.strategies.registry import available_strategies, register_strategy
from tandem.strategies.strategy import Strategy
from tandem.utilities.lazy import lazy_attributes

if TYPE_CHECKING:
    from tandem.strategies.data_parallel import DataParallelStrategy
    from tandem.strategies.ddp import DDPStrategy
    from tandem.strategies.ddp_ft import DDPFTStrategy
    from tandem.strategies.fsdp import FSDPStrategy
    from tandem.strategies.parallel import ParallelStrategy
    from tandem.strategies.single_device import SingleDeviceStrategy

_LAZY = {
    "DDPFTStrategy": "tandem.strategies.ddp_ft",
    "DDPStrategy": "tandem.strategies.ddp",
    "DataParallelStrategy": "tandem.strategies.data_parallel",
    "FSDPStrategy": "tandem.strategies.fsdp",
    "ParallelStrategy": "tandem.strategies.parallel",
    "SingleDeviceStrategy": "tandem.strategies.single_device",
}

__all__ = [
    "AsyncCheckpointIO",
    "DDPFTStrategy",
    "DDPStrategy",
    "DataParallelStrategy",
    "FSDPStrategy",
    "ParallelStrategy",
    "Precision",
    "SingleDeviceStrategy",
    "Strategy",
    "TorchSyncBatchNorm",
    "available_strategies",
    "register_strategy",
]

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
