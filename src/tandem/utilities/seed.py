"""Seeding every source of randomness, and capturing / restoring RNG states for exact resume."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from tandem.utilities.rank_zero import get_rank, rank_zero_info

_SEED_ENV = "TANDEM_GLOBAL_SEED"
_WORKERS_ENV = "TANDEM_SEED_WORKERS"
#: Lightning's names for the same two settings: set alongside tandem's, and read when tandem's are absent (a
#: program or launcher written for Lightning sets these)
_PL_SEED_ENV = "PL_GLOBAL_SEED"
_PL_WORKERS_ENV = "PL_SEED_WORKERS"

try:  # numpy is optional for users, but seeded when present
    import numpy as np
except ImportError:  # pragma: no cover - numpy ships with torch's usual installs
    np = None  # type: ignore[assignment]  # the optional import's fallback: every use checks `np is not None`


def seed_everything(seed: int | None = None, workers: bool = False) -> int:
    """Seed python's ``random``, numpy and torch (CPU and every CUDA device) with one number.

    The seed is also put into the environment (``TANDEM_GLOBAL_SEED``, and Lightning's ``PL_GLOBAL_SEED``;
    ``TANDEM_SEED_WORKERS`` / ``PL_SEED_WORKERS`` say ``workers``) so that processes started by the DDP launcher
    seed themselves alike.

    Args:
        seed: the seed; ``None`` reads ``TANDEM_GLOBAL_SEED`` (else ``PL_GLOBAL_SEED``) from the environment, else
            uses 0.
        workers: give every dataloader the Trainer runs (whose ``worker_init_fn`` is None) Lightning's
            ``pl_worker_init_function``, which seeds torch, ``random`` and numpy in each worker from the
            worker's base seed, its id and the process's rank.

    Returns:
        The seed used.

    Example:
        ```python
        seed_everything(42)
        model = MyModule()  # same initial weights on every run and every rank
        ```
    """
    if seed is None:
        seed = global_seed()
    if not isinstance(seed, int) or not (0 <= seed < 2**32):
        raise ValueError(f"seed_everything(seed={seed!r}): expected an integer in [0, 2**32).")
    os.environ[_SEED_ENV] = os.environ[_PL_SEED_ENV] = str(seed)
    os.environ[_WORKERS_ENV] = os.environ[_PL_WORKERS_ENV] = "1" if workers else "0"
    random.seed(seed)
    if np is not None:
        np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    rank_zero_info(f"Seed set to {seed}")
    return seed


def reset_seed() -> None:
    """Seed every source of randomness again with the seed ``seed_everything`` set in this process's environment;
    nothing when it was not called. A strategy of several processes does this as each run sets up (Lightning's
    ``reset_seed``), so every rank starts the run's random draws (dropout, the loader's seeds) from the same state,
    and a ported program draws Lightning's numbers."""
    value = _seed_from_environment()
    if not value.isdigit():
        return
    seed = int(value)
    random.seed(seed)
    if np is not None:
        np.random.seed(seed)
    torch.manual_seed(seed)


def _seed_from_environment() -> str:
    """The seed ``seed_everything`` exported: tandem's variable, else Lightning's ("" when neither is set)."""
    return os.environ.get(_SEED_ENV) or os.environ.get(_PL_SEED_ENV) or ""


def seed_workers_requested() -> bool:
    """``seed_everything(workers=True)`` was called (tandem's variable, else Lightning's ``PL_SEED_WORKERS``)."""
    return (os.environ.get(_WORKERS_ENV) or os.environ.get(_PL_WORKERS_ENV)) == "1"


def pl_worker_init_function(worker_id: int, rank: int | None = None) -> None:
    """Seed torch, ``random`` and numpy in a dataloader worker (Lightning's ``pl_worker_init_function``: the same
    seeds, so a ported dataset that draws random numbers in its workers draws Lightning's). The seeds derive from
    the worker's base seed (torch's seed of the worker less its id), its id and ``rank`` (default: this process's
    global rank), so no two workers of a job share one."""
    global_rank = rank if rank is not None else get_rank()
    base_seed = torch.initial_seed() - worker_id
    seeds = _seed_sequence(base_seed, worker_id, global_rank, count=4)
    torch.manual_seed(seeds[0])
    random.seed((seeds[1] << 32) | seeds[2])
    if np is not None:
        np.random.seed(np.random.SeedSequence([base_seed, worker_id, global_rank]).generate_state(4))


def _seed_sequence(base_seed: int, worker_id: int, global_rank: int, count: int) -> list[int]:
    """``count`` 64-bit seeds mixed from the three numbers (a MurmurHash3 finaliser, then Knuth's LCG), as
    Lightning derives them."""
    mask = (1 << 64) - 1
    x = (base_seed << 32) | (worker_id << 16) | global_rank
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & mask
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & mask
    x ^= x >> 33
    seeds = []
    for _ in range(count):
        x = (x * 6364136223846793005 + 1) & mask
        seeds.append(x)
    return seeds


def capture_rng_state() -> dict[str, Any]:
    """Every global RNG state, as tensors and plain Python values (``torch.load(path)`` reads them with its
    default ``weights_only=True``)."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if np is not None:
        numpy_state = np.random.get_state(legacy=False)
        if numpy_state["bit_generator"] == "MT19937":  # numpy's default: its legacy tuple's five items
            state["numpy"] = {
                "kind": "MT19937",
                "keys": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),  # uint32 words, exact in int64
                "pos": int(numpy_state["state"]["pos"]),
                "has_gauss": int(numpy_state["has_gauss"]),
                "cached_gaussian": float(numpy_state["gauss"]),
            }
        else:  # np.random.set_bit_generator(PCG64(...)) and others: their state dict, arrays as lists of ints
            state["numpy"] = _plain_numpy_state(numpy_state)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Undo ``capture_rng_state``; sources missing from ``state`` are left as they are.

    Also reads states captured by tandem 0.1 checkpoints (numpy's state as its own tuple).
    """
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state and np is not None:
        saved = state["numpy"]
        if isinstance(saved, dict) and "keys" in saved:  # MT19937's five items (a dict with "bit_generator": as it is)
            keys = saved["keys"].numpy().astype(np.uint32)
            saved = (saved["kind"], keys, saved["pos"], saved["has_gauss"], saved["cached_gaussian"])
        np.random.set_state(saved)
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)


def _plain_numpy_state(value: Any) -> Any:
    """numpy's state dict of a bit generator with its arrays as lists and its scalars as Python numbers, which
    ``torch.load`` reads with ``weights_only=True`` and ``np.random.set_state`` takes back."""
    if isinstance(value, dict):
        return {key: _plain_numpy_state(item) for key, item in value.items()}
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value


@contextmanager
def isolate_rng() -> Iterator[None]:
    """Run the block without moving any global RNG (python, numpy, torch, CUDA): the states are captured on
    entry and restored on exit (Lightning's ``isolate_rng``). The sanity check runs inside one, so adding a
    validation loader does not change the training order.

    Example:
        ```python
        with isolate_rng():
            torch.rand(1)  # drawn, then forgotten: the next draw outside is as if this never ran
        ```
    """
    state = capture_rng_state()
    try:
        yield
    finally:
        restore_rng_state(state)


def order_seed() -> int:
    """The seed of one process's training order: ``seed_everything``'s, else torch's initial seed (a new order
    each unseeded run, as a RandomSampler gives). Several processes use ``global_seed`` (0 unseeded, as
    Lightning), agreed from rank 0; a resume takes the checkpoint's."""
    value = _seed_from_environment()
    return int(value) if value.isdigit() else torch.initial_seed() % 2**62


def global_seed() -> int:
    """The seed ``seed_everything`` exported (TANDEM_GLOBAL_SEED, else Lightning's PL_GLOBAL_SEED), else 0."""
    value = _seed_from_environment()
    return int(value) if value.isdigit() else 0
