"""One process, one device."""

from __future__ import annotations

import torch

from tandem.strategies.precision import Precision
from tandem.strategies.registry import register_strategy
from tandem.strategies.strategy import Strategy


class SingleDeviceStrategy(Strategy):
    """Train on one device in this process. Collectives are no-ops.

    Args:
        device: e.g. ``"cpu"``, ``"cuda:1"``; ``None`` lets the Trainer choose.
        precision: see [`Precision`][tandem.strategies.Precision].

    Example:
        ```python
        Trainer(strategy=SingleDeviceStrategy("cuda:1"))
        ```
    """

    name = "single_device"

    def __init__(self, device: str | torch.device | None = None, precision: str | Precision | None = None) -> None:
        super().__init__(devices=[torch.device(device)] if device is not None else None, precision=precision)


register_strategy("single_device", SingleDeviceStrategy, "one process on one device")
