"""The one owner of this process's ``sys.excepthook`` chain.

Several parts of tandem must act when an uncaught exception ends the script: a rank that tandem's launcher
started writes its traceback where rank 0 reads it, rank 0's watchdog stops the ranks it started, and the
side channel tells the other ranks that this one failed (and why). Rather than each wrapping
``sys.excepthook`` in turn (a chain nobody owns, which grows every time one of them runs again), one wrapper
is installed, once, the first time a listener is registered. It calls every listener with
``(type, value, traceback)``, in the order they were registered, and then the hook that was there before it
(Python's own prints the traceback). A listener that fails is skipped: the traceback is still printed. A
listener that returns True has reported the exception elsewhere (a rank started by tandem's launcher hands
its traceback to rank 0, which prints it once for the job): the previous hook is then not called.

Example:
    ```python
    on_uncaught_exception("my part", lambda kind, value, tb: print("ending with", kind.__name__))
    ...
    remove_listener("my part")
    ```
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from types import TracebackType

#: what a listener receives: the exception's type, the exception, its traceback
Listener = Callable[[type[BaseException], BaseException, TracebackType | None], bool | None]

_LISTENERS: dict[str, Listener] = {}
#: the hook tandem's wrapper replaced and calls last (None until the wrapper is installed)
_previous: Callable[..., object] | None = None


def on_uncaught_exception(key: str, listener: Listener) -> None:
    """Call ``listener(type, value, traceback)`` when an uncaught exception ends the script, before the hook
    that was installed before tandem's (not called when a listener returns True: it reported the exception).
    Registering under a ``key`` already used replaces that listener."""
    global _previous
    if _previous is None:
        _previous = sys.excepthook
        sys.excepthook = _excepthook
    _LISTENERS[key] = listener


def remove_listener(key: str) -> None:
    """Stop calling the listener registered under ``key`` (nothing happens if there is none)."""
    _LISTENERS.pop(key, None)


def _excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    reported = False
    for listener in list(_LISTENERS.values()):
        with contextlib.suppress(Exception):
            reported = listener(kind, value, tb) is True or reported
    if _previous is not None and not reported:
        _previous(kind, value, tb)
