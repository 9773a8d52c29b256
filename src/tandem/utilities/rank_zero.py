"""Rank-zero output. The rank is set by the strategy when it sets up its environment (``set_rank``).

Before that, ``import tandem`` records the rank a launcher put into the environment, so a warning
raised while a launched rank is still starting up is not printed once per process.
"""

from __future__ import annotations

from typing import Any

from lightning_utilities.core.rank_zero import WarningCache, rank_zero_info, rank_zero_only, rank_zero_warn

if getattr(rank_zero_only, "rank", None) is None:
    rank_zero_only.rank = 0

__all__ = ["WarningCache", "rank_zero_info", "rank_zero_only", "rank_zero_print", "rank_zero_warn", "set_rank"]


def set_rank(rank: int) -> None:
    """The single place that records this process's global rank."""
    rank_zero_only.rank = rank


@rank_zero_only
def rank_zero_print(*args: Any, **kwargs: Any) -> None:
    """``print`` on global rank 0 only."""
    print(*args, **kwargs)
