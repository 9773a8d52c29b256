"""``ValidationClock``: a time-based ``val_check_interval``'s clock (Lightning's ``val_check_interval`` given as a
duration)."""

from __future__ import annotations

import time


class ValidationClock:
    """A time-based ``val_check_interval`` (Lightning's): validation is due after a training batch once ``seconds``
    have passed since the last validation ended, or since training started. One clock read per check."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.last = seconds, 0.0

    def restart(self) -> None:
        self.last = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self.last >= self.seconds
