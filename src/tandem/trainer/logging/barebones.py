"""``BarebonesLog``: what ``self.log`` writes into under ``Trainer(barebones=True)``."""

from __future__ import annotations

from typing import Any

from tandem.utilities.rank_zero import rank_zero_warn


class BarebonesLog:
    """What ``self.log`` writes into under ``Trainer(barebones=True)``: nothing (logging costs speed, and barebones
    measures the Trainer without it); the first call warns, as Lightning's does."""

    deferred = None  # nothing a compiled step could defer (see CompiledStepLog)

    def __init__(self) -> None:
        self._warned = False

    def log_deferred(self) -> None:
        """Nothing to log."""

    def log(self, name: str, *args: Any, **kwargs: Any) -> None:
        if not self._warned:
            self._warned = True
            rank_zero_warn(
                f"self.log({name!r}, ...) does nothing under Trainer(barebones=True): logging can cost speed, so "
                "barebones mode turns it off. Drop barebones=True to log. (Shown once.)"
            )

    def state_dict(self) -> dict[str, Any]:
        return {}  # nothing collected
