"""Out-of-memory errors: telling them from other errors, and giving cached device memory back (Lightning's
``lightning.pytorch.utilities.memory``)."""

from __future__ import annotations

import gc

import torch

_OOM_MESSAGES = (
    "CUDA out of memory",  # torch's CUDA allocator (torch.OutOfMemoryError's message)
    "CUDA error: out of memory",  # a kernel's own allocation
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",  # cuDNN's way of saying it ran out (pytorch/pytorch#4107)
    "DefaultCPUAllocator: can't allocate memory",  # the CPU allocator
)


def is_oom_error(exception: BaseException) -> bool:
    """Whether ``exception`` says a device (or the CPU allocator) ran out of memory: a ``torch.OutOfMemoryError``,
    or a ``RuntimeError`` with one of the allocators' messages."""
    if isinstance(exception, torch.OutOfMemoryError):
        return True
    if not isinstance(exception, RuntimeError) or len(exception.args) != 1 or not isinstance(exception.args[0], str):
        return False
    return any(message in exception.args[0] for message in _OOM_MESSAGES)


def garbage_collection_cuda() -> None:
    """Collect Python's garbage and give the CUDA allocator's cached blocks back (after an out-of-memory error).
    Without CUDA nothing (a full collection takes a fifth of a second once torch is imported)."""
    if not torch.cuda.is_available():
        return
    gc.collect()
    try:
        torch.cuda.empty_cache()  # this too can run out of memory
    except RuntimeError as exception:
        if not is_oom_error(exception):
            raise


def free_cuda_memory(device: torch.device) -> None:
    """At the end of a run on ``device``: free cuBLAS's workspaces (tens of MB a device and stream, held by the
    caching allocator, so counted by ``torch.cuda.memory_allocated``) and give the allocator's cached blocks back,
    as Lightning's ``CUDAAccelerator.teardown`` does. Nothing for other devices. Best effort: a CUDA context that
    the run's own error broke (a device-side assert) refuses these calls, and that error is the one to report."""
    if device.type != "cuda":
        return
    try:
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # pytorch/pytorch#95668
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()
    except RuntimeError:
        pass
