"""Strategies: where the module runs and how processes cooperate. Found by name through the registry."""

from tandem.strategies.checkpoint_io import AsyncCheckpointIO
from tandem.strategies.data_parallel import DataParallelStrategy
from tandem.strategies.ddp import DDPStrategy
from tandem.strategies.fsdp import FSDPStrategy
from tandem.strategies.layer_sync import TorchSyncBatchNorm
from tandem.strategies.parallel import ParallelStrategy
from tandem.strategies.precision import Precision
from tandem.strategies.registry import available_strategies, register_strategy
from tandem.strategies.single_device import SingleDeviceStrategy
from tandem.strategies.strategy import Strategy

__all__ = [
    "AsyncCheckpointIO",
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
