"""The process group's store as the side channel reads and writes it (``SignedStore``): only values this job
signed count.

What the store is trusted with. The store listens on every interface without authentication (torchrun's does too):
anyone who reaches its port can list, read, write and delete keys. So every value that controls the job (beats,
check tags, differ records and verdicts, teardown, stopping, the hang declaration, the pre-emption signal and stop
positions) is signed (``SignedStore``): an HMAC-SHA256 with a per-job secret that rank 0 draws and broadcasts
over the process group's own backend with the run id (never through the store), over the key's full name and the
value. A value that is not signed by this job (an outsider's, a malformed one) reads as absent and is reported once
on stderr. The counters the store keeps with ``add`` (``arrived``, ``posted``, ``moved``) cannot be signed: they are
hints that wake the ranks or save requests, and nothing the job does rests on them alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import sys
import threading
from typing import Any

#: store requests a second that the ranks waiting in a collective check make together, at most, once they have
#: waited a while (a rank polls every 20 ms, or every N / _POLL_BUDGET seconds at N ranks when that is longer)
_POLL_BUDGET = 5000.0
#: a value's signature: HMAC-SHA256 in hex, ahead of the value
_MAC_LEN = 64
#: values not signed by this job that one channel reports (one line each, once per key), at most: a flood is not
_REPORT_LIMIT = 20
#: times a first-writer-wins write replaces a value not signed by this job before it simply sets its own
_REPLACE_TRIES = 10


class SignedStore:
    """The process group's store as the side channel reads and writes it: only values this job signed count.

    Every value written carries an HMAC-SHA256, keyed with the job's secret, over the key's full name and the value
    (a signed value cannot be forged, nor moved to another key). A value read counts only when its signature holds;
    any other (an outsider's, a malformed one) reads as absent, and the first time a key holds one, a ``[tandem]``
    line on stderr says so (at most ``_REPORT_LIMIT`` lines a channel). Counters (``add``) cannot be signed:
    callers take them as hints and act on signed values only.

    Args:
        store: the process group's ``torch.distributed`` store.
        secret: the job's secret, the same on every rank (rank 0 draws it with ``new_secret`` and broadcasts it
            over the process group's backend: it never goes through the store).

    Example:
        ```python
        store = SignedStore(dist.distributed_c10d._get_default_store(), secret)
        store.set("tandem/side/ab12/teardown", "rank 1 failed")
        store.get("tandem/side/ab12/teardown")  # "rank 1 failed"; None if an outsider wrote it
        ```
    """

    def __init__(self, store: Any, secret: bytes, reported: set[str] | None = None) -> None:
        self.raw, self._secret = store, secret
        self._reported = reported if reported is not None else set()  # shared with clones: once per key, per channel
        self._lock = threading.RLock()  # a signal handler may read the store (torn_down) while this thread reports

    def clone(self) -> SignedStore:
        """The same store and secret over a connection of its own (for another thread)."""
        return SignedStore(self.raw.clone() if hasattr(self.raw, "clone") else self.raw, self._secret, self._reported)

    def seal(self, key: str, payload: str) -> bytes:
        """``payload`` signed for ``key``: the value to write there."""
        data = payload.encode()
        return self._mac(key, data) + data

    def open(self, key: str, value: bytes) -> str | None:
        """The payload of ``value`` read at ``key``, or None (reported once) when this job did not sign it there."""
        data = value[_MAC_LEN:]
        if len(value) >= _MAC_LEN and hmac.compare_digest(value[:_MAC_LEN], self._mac(key, data)):
            with contextlib.suppress(UnicodeDecodeError):
                return data.decode()
        self._report(key)
        return None

    def _mac(self, key: str, data: bytes) -> bytes:
        return hmac.new(self._secret, key.encode() + b"\0" + data, hashlib.sha256).hexdigest().encode()

    def _report(self, key: str) -> None:
        with self._lock:
            if key in self._reported or len(self._reported) >= _REPORT_LIMIT:
                return
            self._reported.add(key)
            last = len(self._reported) == _REPORT_LIMIT
        with contextlib.suppress(Exception):  # (a print inside a print, from a signal handler): the value stays ignored
            print(
                f"[tandem] ignored {key} in the process group's store: its value is not signed by this job (an "
                "outsider wrote it, or it is malformed); the job goes on as if the key were absent."
                + (f" Further such keys are not reported ({_REPORT_LIMIT} were)." if last else ""),
                file=sys.stderr,
                flush=True,
            )

    # ------------------------------------------------------------------ signed values
    def set(self, key: str, payload: str) -> None:
        self.raw.set(key, self.seal(key, payload))

    def get(self, key: str, present: bool = False) -> str | None:
        """The payload at ``key``; None when the key is absent or not signed by this job. ``present``: the caller
        just saw the key (one request instead of two)."""
        if not present and not self.raw.check([key]):
            return None
        return self.open(key, self.raw.get(key))

    def get_all(self, keys: list[str]) -> list[str | None] | None:
        """The payloads at ``keys`` (None for one not signed by this job), in one request; None while one is absent."""
        if not self.raw.check(keys):
            return None
        values = self.raw.multi_get(keys) if hasattr(self.raw, "multi_get") else [self.raw.get(k) for k in keys]
        return [self.open(k, v) for k, v in zip(keys, values)]

    def first(self, key: str, payload: str) -> str:
        """Write ``payload`` at ``key`` unless a signed value is there: the first signed payload, which every writer
        gets back. A value this job did not sign (an outsider wrote it first) is replaced: only that exact value, so
        that of several ranks replacing it one wins and the others read its payload."""
        mine = self.seal(key, payload)
        current = self.raw.compare_set(key, "", mine)
        for _ in range(_REPLACE_TRIES):
            if current == mine:
                return payload
            found = self.open(key, current)
            if found is not None:
                return found
            current = self.raw.compare_set(key, current, mine)
        self.raw.set(key, mine)  # an outsider keeps rewriting the key
        return payload

    def append(self, key: str, record: str) -> None:
        """Add ``record`` (text without NUL) to the records at ``key``."""
        self.raw.append(key, b"\0" + self.seal(key, record) + b"\0")  # NUL-framed: bytes appended around it stay apart

    def records(self, key: str) -> list[str]:
        """The signed records at ``key`` (none when it is absent); anything else appended there is skipped."""
        if not self.raw.check([key]):
            return []
        found = [self.open(key, part) for part in self.raw.get(key).split(b"\0") if part]
        return [record for record in found if record is not None]

    # ------------------------------------------------------------------ unsigned: hints
    def add(self, key: str, amount: int) -> int:
        """Add to the counter at ``key``: anyone can, so the count is a hint."""
        return int(self.raw.add(key, amount))

    def check(self, keys: list[str]) -> bool:
        """Whether every key is present (signed or not)."""
        return bool(self.raw.check(keys))

    def delete(self, key: str) -> None:
        with contextlib.suppress(Exception):  # some stores (FileStore) cannot delete: the key only costs memory
            self.raw.delete_key(key)
