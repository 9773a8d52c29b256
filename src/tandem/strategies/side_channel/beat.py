"""The beat: what each rank's watcher posts once a second (``_BEAT_S``), read by the channel, the collective check,
the hang watch and the pre-emption vote: its number (a beat older than one read is a replay), how long the rank's
place and stack have been still, its status, how long it has waited inside torch, where its main thread is, its
loop's place and hook, the user's line, and its latest collective check.
"""

from __future__ import annotations

from dataclasses import dataclass

#: how often the watcher posts this rank's beat (and a waiting rank looks for one that will never arrive)
_BEAT_S = 1.0


@dataclass
class _Beat:
    number: int  # the rank's beats so far: a beat older than one already read is a replay
    still_for: float  # seconds since the rank's place or stack last moved
    status: str
    blocked_for: float
    where: str
    last: str
    place: str = ""  # "stage epoch batch step", or "" outside a loop
    hook: str = ""
    user: str = ""  # the user's line the main thread is in

    @classmethod
    def parse(cls, payload: str) -> _Beat | None:
        """The beat posted as ``payload``, or None when it is not one."""
        try:
            number, still, status, blocked, where, place, hook, user, last = payload.split("\n", 8)
            return cls(int(number), float(still), status, float(blocked), where, last, place, hook, user)
        except ValueError:
            return None

    @property
    def check_count(self) -> int:
        """How many collective checks the rank has entered (its latest, ``check <n>: ...``)."""
        return int(self.last.split(":", 1)[0].removeprefix("check ")) if self.last.startswith("check ") else 0

    @property
    def where_text(self) -> str:
        return f"Its last tandem collective was {self.last}. " if self.last else ""
