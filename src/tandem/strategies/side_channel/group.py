"""This process's side channel: the one of the process group it joined (``open_channel`` (in ``channel.py``) when it joins,
``current_channel``, ``close_channel`` when the group is destroyed), the group's run id and secret, the job's
teardown announced through it, and whether this process reports for the job (``report_for_the_job``: tandem's
launcher, in rank 0).
"""

from __future__ import annotations

import secrets
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tandem.strategies.side_channel.channel import SideChannel


def new_run_id() -> str:
    """A fresh token for one process group (rank 0 makes it; the strategy broadcasts it). Anyone who reaches the
    store can read it (``list_keys``): it keeps groups apart, it guards nothing."""
    return uuid.uuid4().hex[:12]


def new_secret() -> bytes:
    """A fresh secret for one process group's side channel (rank 0 draws it; the strategy broadcasts it over the
    group's backend, never through the store)."""
    return secrets.token_bytes(32)


def report_for_the_job() -> None:
    """This process started the other ranks and reports their failures (tandem's launcher, in rank 0): a teardown
    never ends it from the watcher; it raises the failure in its main thread instead."""
    global _REPORTER
    _REPORTER = True


def announce_teardown(reason: str, stopping: bool = False) -> None:
    """The job is being torn down (see ``SideChannel.announce_teardown``); nothing happens without a channel."""
    if _CHANNEL is not None:
        _CHANNEL.announce_teardown(reason, stopping)


def current_channel() -> SideChannel | None:
    """The side channel of this process's group, or None when no group was joined."""
    return _CHANNEL


def close_channel(status: str = "left its process group") -> None:
    """The process group is being destroyed: tell the other ranks, and let the next group open its own."""
    global _CHANNEL
    if _CHANNEL is not None:
        _CHANNEL.close(status)
    _CHANNEL = None


_CHANNEL: SideChannel | None = None
_REPORTER = False  # see report_for_the_job
