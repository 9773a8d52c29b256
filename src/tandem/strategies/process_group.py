"""The default process group tandem created: whether this process joined one it did not create, and leaving
the one it did (at exit, and between the jobs of a Hydra sweep)."""

from __future__ import annotations

import gc
import time

import torch.distributed as dist

from tandem.strategies.side_channel import close_channel

_GROUPS_CREATED: set[int] = set()  # ids of the default groups that setup_environment created


def joined_external_group() -> bool:
    """Whether this process is in a default process group that tandem did not create (Ray Train's
    ``TorchTrainer``, or the script's own ``init_process_group``): tandem joins it, starts no processes and
    never destroys it."""
    return (
        dist.is_available()
        and dist.is_initialized()
        and id(dist.distributed_c10d._get_default_group()) not in _GROUPS_CREATED
    )


#: how long the process waits at exit for gloo's worker threads to drop their last collective (see below)
_WORKERS_SETTLE_S = 0.1


def leave_process_group() -> None:
    """Close the side channel and destroy the process group setup_environment created (one tandem did not create
    stays): at exit, while the interpreter is still whole, and between the jobs of a Hydra sweep.

    Two ways a gloo worker thread can need the GIL while the interpreter shuts down, which aborts the process
    ("terminate called without an active exception", SIGABRT) after the script succeeded: DistributedDataParallel
    wrappers in reference cycles that hold the group (collected here), and a worker that has finished the last
    collective but not yet dropped it. That collective's tensors were made in Python; the worker drops its
    reference after waking the caller, so on a busy machine the main thread can reach the interpreter's end
    first (seen in a core dump: ``~AsyncAllgatherWork`` in ``ProcessGroupGloo::runLoop`` taking the GIL during
    ``Py_FinalizeEx``; 2 of about 300 exits). A short sleep lets the workers take the GIL first.
    """
    gc.collect()
    time.sleep(_WORKERS_SETTLE_S)
    close_channel()
    if dist.is_initialized() and not joined_external_group():
        dist.destroy_process_group()
