"""What this machine gives the processes: a free TCP port, and torch threads for each process."""

from __future__ import annotations

import os
import socket

from tandem.strategies.environments.cluster_environment import _LOCAL_ADDRESS


def find_free_port(host: str = _LOCAL_ADDRESS) -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def threads_per_process(local_processes: int) -> int | None:
    """torch threads for each of ``local_processes`` on this machine, or None when OMP_NUM_THREADS decides."""
    if "OMP_NUM_THREADS" in os.environ:
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // max(1, local_processes))
