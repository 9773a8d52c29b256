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
import sys
import warnings
from collections.abc import Callable
from typing import Any, TextIO

from lightning_utilities.core.rank_zero import WarningCache as _WarningCache
from lightning_utilities.core.rank_zero import rank_zero_info, rank_zero_only

from tandem.utilities.exceptions import TandemWarning

if getattr(rank_zero_only, "rank", None) is None:
    rank_zero_only.rank = 0  # type: ignore[attr-defined]  # a function attribute lightning-utilities does not declare

#: set by a progress bar while it draws frames in place on the terminal: ``write(text, file)`` puts ``text`` on
#: its own line(s) above the bars (tqdm.write); None: text goes straight to the file
_bar_writer: Callable[[str, TextIO], None] | None = None


def set_bar_writer(writer: Callable[[str, TextIO], None] | None) -> None:
    """Route rank-zero console text (``rank_zero_info`` and ``rank_zero_print``) through ``writer`` while progress
    bars are drawn in place, so that a message starts on its own line instead of after a bar frame; None ends it."""
    global _bar_writer
    _bar_writer = writer


def _write(text: str, file: TextIO) -> None:
    if _bar_writer is not None and file in (sys.stdout, sys.stderr):
        _bar_writer(text, file)
    else:
        file.write(text)


class _Stderr:
    """The stream of rank_zero_info's handler: this moment's ``sys.stderr``, through the bar writer when set."""

    def write(self, text: str) -> None:
        _write(text, sys.stderr)

    def flush(self) -> None:
        sys.stderr.flush()


def _handle(logger: logging.Logger) -> None:
    """Give ``logger`` tandem's handler (its messages alone, on this moment's stderr) and stop it propagating."""
    handler = logging.StreamHandler(_Stderr())
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.propagate = False


# rank_zero_info writes to this logger; without a handler its messages (why training stopped, the seed)
# would be invisible. Add one unless the application configured logging for it already.
_info_logger = logging.getLogger("lightning_utilities.core.rank_zero")
if not _info_logger.handlers:
    _handle(_info_logger)
    _info_logger.setLevel(logging.INFO)

# tandem's own module loggers (``tandem.callbacks.early_stopping.log``...) print their INFO messages, as
# Lightning's ``lightning.pytorch`` logger does: through the application's handlers when it configured logging,
# else through one of tandem's
_package_logger = logging.getLogger("tandem")
if _package_logger.level == logging.NOTSET:
    _package_logger.setLevel(logging.INFO)
if not logging.getLogger().hasHandlers() and not _package_logger.handlers:
    _handle(_package_logger)

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _format_warning(message: Any, category: type[Warning], filename: str, lineno: int, line: str | None = None) -> str:
    if os.path.abspath(filename).startswith(_PACKAGE_DIR):
        return f"{category.__name__}: {message}\n"
    return _python_format_warning(message, category, filename, lineno, line)


if getattr(warnings.formatwarning, "__module__", None) != __name__:  # once, however often this module loads
    _python_format_warning = warnings.formatwarning
    warnings.formatwarning = _format_warning

__all__ = [
    "WarningCache",
    "get_rank",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_print",
    "rank_zero_warn",
    "set_bar_writer",
    "set_rank",
]


@rank_zero_only
def rank_zero_warn(
    message: str | Warning, stacklevel: int = 4, category: type[Warning] = TandemWarning, **kwargs: Any
) -> None:
    """``warnings.warn`` on global rank 0 only, as a [`TandemWarning`][tandem.utilities.TandemWarning] unless
    ``category`` says otherwise. ``stacklevel`` counts as lightning-utilities' ``rank_zero_warn`` does (4: the caller of
    this function)."""
    warnings.warn(message, category=category, stacklevel=stacklevel - 1, **kwargs)


class WarningCache(_WarningCache):
    """lightning-utilities' de-duplicating cache, warning through tandem's
    [`rank_zero_warn`][tandem.utilities.rank_zero_warn]."""

    def warn(self, message: str, stacklevel: int = 5, **kwargs: Any) -> None:
        if message not in self:
            self.add(message)
            rank_zero_warn(message, stacklevel=stacklevel, **kwargs)


def set_rank(rank: int) -> None:
    """The single place that records this process's global rank."""
    rank_zero_only.rank = rank  # type: ignore[attr-defined]  # a function attribute lightning-utilities does not declare


def get_rank() -> int:
    """This process's global rank, as ``set_rank`` recorded it (``rank_zero_only.rank``, which Lightning's code
    reads too)."""
    rank: int = rank_zero_only.rank  # type: ignore[attr-defined]  # a function attribute lightning-utilities does not declare
    return rank


@rank_zero_only
def rank_zero_print(
    *args: Any, sep: str = " ", end: str = "\n", file: TextIO | None = None, flush: bool = False
) -> None:
    """``print`` on global rank 0 only (on its own line when progress bars are drawn)."""
    file = sys.stdout if file is None else file
    _write(sep.join(str(a) for a in args) + end, file)
    if flush:
        file.flush()
