"""Rank-zero output. The rank is set by the strategy when it sets up its environment (``set_rank``).

Before that, ``import tandem`` records the rank a launcher put into the environment, so a warning
raised while a launched rank is still starting up is not printed once per process.

Warnings raised from tandem's own files print as one line, ``UserWarning: message``: the file, line
and source line of tandem's ``rank_zero_warn`` call say nothing to the user. Other warnings keep
Python's format.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

from lightning_utilities.core.rank_zero import WarningCache, rank_zero_info, rank_zero_only, rank_zero_warn

if getattr(rank_zero_only, "rank", None) is None:
    rank_zero_only.rank = 0

# rank_zero_info writes to this logger; without a handler its messages (why training stopped, the seed)
# would be invisible. Add one unless the application configured logging for it already.
_info_logger = logging.getLogger("lightning_utilities.core.rank_zero")
if not _info_logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(message)s"))
    _info_logger.addHandler(_handler)
    _info_logger.setLevel(logging.INFO)
    _info_logger.propagate = False

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _format_warning(message: Any, category: type[Warning], filename: str, lineno: int, line: str | None = None) -> str:
    if os.path.abspath(filename).startswith(_PACKAGE_DIR):
        return f"{category.__name__}: {message}\n"
    return _python_format_warning(message, category, filename, lineno, line)


if getattr(warnings.formatwarning, "__module__", None) != __name__:  # once, however often this module loads
    _python_format_warning = warnings.formatwarning
    warnings.formatwarning = _format_warning

__all__ = ["WarningCache", "rank_zero_info", "rank_zero_only", "rank_zero_print", "rank_zero_warn", "set_rank"]


def set_rank(rank: int) -> None:
    """The single place that records this process's global rank."""
    rank_zero_only.rank = rank


@rank_zero_only
def rank_zero_print(*args: Any, **kwargs: Any) -> None:
    """``print`` on global rank 0 only."""
    print(*args, **kwargs)
