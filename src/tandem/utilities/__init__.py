"""Small shared helpers: seeding, rank-zero output, checkpoint files, dataloaders, errors.

As ``lightning.pytorch.utilities``: ``from tandem.utilities import rank_zero_only, rank_zero_info, rank_zero_warn``.
"""

from tandem.utilities.combined_loader import CombinedLoader
from tandem.utilities.exceptions import PossibleUserWarning, TandemWarning
from tandem.utilities.rank_zero import rank_zero_info, rank_zero_only, rank_zero_warn

__all__ = [
    "CombinedLoader",
    "PossibleUserWarning",
    "TandemWarning",
    "rank_zero_info",
    "rank_zero_only",
    "rank_zero_warn",
]
