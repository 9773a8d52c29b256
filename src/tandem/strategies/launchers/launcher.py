"""The launcher contract: what a strategy's ``launcher`` is, one launcher a module beside it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class Launcher(Protocol):
    """What starts the other processes of a job (``Strategy.launcher``): ``launch`` runs ``function`` in this
    process and the processes it starts, and returns this process's result."""

    def launch(self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any) -> Any: ...
