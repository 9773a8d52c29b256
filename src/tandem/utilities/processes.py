"""Processes that end with the process that started them (Linux ``PR_SET_PDEATHSIG``): ranks started by a
launcher, and DataLoader workers."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys
from typing import Any

_PR_SET_PDEATHSIG = 1


def load_libc() -> Any:
    """The C library, for ``end_with_parent`` (load it before a fork: ``preexec_fn`` must not), or None
    where ``prctl`` does not exist."""
    return ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def end_with_parent(libc: Any = None) -> None:
    """Have the kernel SIGKILL this process when its parent ends, however the parent ends (Linux; elsewhere
    nothing). A caller that may start after its parent already ended checks that itself, after this call."""
    libc = libc if libc is not None else load_libc()
    if libc is not None:
        with contextlib.suppress(Exception):
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
