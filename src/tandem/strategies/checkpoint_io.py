"""Checkpoints written in the background: ``Trainer(plugins=[AsyncCheckpointIO()])``.

The save copies the state to host memory (``host_copy``) and hands the copy
to one background thread, which writes it as a synchronous save does (``atomic_save``:
checksum, temporary file, ``os.replace``), so the training step waits only for the copy. The rules:

- at most one write is in flight: a new save first waits for the previous write;
- a failed write is raised (the original error, with a note naming the file) by the next save, or when
  ``fit`` / ``validate`` / ``test`` / ``predict`` end: they wait for the last write before returning;
- a pre-emption stop waits for its ``last.ckpt`` before the process exits, ``trainer.save_checkpoint``
  outside a run waits for its file, and reading or removing the file being written waits for it.

Only global rank 0 writes, as for a synchronous save. ``FSDPStrategy(state_dict_type="sharded")`` writes its
shards synchronously (every rank writes into one temporary directory renamed when all are done; see
[`save_checkpoint`][tandem.strategies.FSDPStrategy.save_checkpoint]); its full-state files go through the background
writer.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tandem.utilities.checkpoint import atomic_save, host_copy
from tandem.utilities.exceptions import add_note


class AsyncCheckpointIO:
    """Write checkpoints in a background thread (Lightning's ``AsyncCheckpointIO``), opted into with
    ``Trainer(plugins=[AsyncCheckpointIO()])``.

    The step is blocked only while the state is copied to host memory; writing, checksumming and syncing the
    file happen on a thread. The copy costs host memory the size of one checkpoint while a write is in flight.
    Writes stay atomic: a process killed during one leaves the previous file intact, and the next save into
    the folder removes the temporary it left.

    Example:
        ```python
        from tandem.strategies import AsyncCheckpointIO

        trainer = Trainer(plugins=[AsyncCheckpointIO()], callbacks=[ModelCheckpoint(every_n_train_steps=500)])
        ```
    """

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._pending_path: str | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
        """Wait for the previous write (raising its error), copy ``checkpoint`` to host memory, start its write."""
        self.wait()
        copied = host_copy(checkpoint)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tandem-checkpoint")
        self._pending_path = os.fspath(path)
        self._pending = self._executor.submit(atomic_save, copied, path)

    @property
    def pending_path(self) -> str | None:
        """The file being written in the background; None when no write is in flight or unreported."""
        return self._pending_path if self._pending is not None else None

    def wait(self) -> None:
        """Block until the write in flight is done; raise its error (once), with a note naming the file."""
        pending, path = self._pending, self._pending_path
        if pending is None:
            return
        self._pending = self._pending_path = None
        error = pending.exception()
        if error is not None:
            add_note(
                error,
                f"[tandem] Raised by the background write of checkpoint {path!r} (AsyncCheckpointIO); the "
                "previous file at that path, if any, is intact.",
            )
            raise error

    def wait_for(self, path: str | os.PathLike) -> None:
        """[`wait`][tandem.strategies.AsyncCheckpointIO.wait], if the write in flight is of ``path`` (before the file is
        removed or read)."""
        if self._pending_path is not None and Path(self._pending_path).absolute() == Path(path).absolute():
            self.wait()

    def teardown(self) -> None:
        """Wait for the last write (raising its error) and stop the thread."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def __getstate__(self) -> dict[str, Any]:  # a ddp_spawn process gets its own thread, made when it saves
        return {"_executor": None, "_pending": None, "_pending_path": None}

    def __repr__(self) -> str:
        return "AsyncCheckpointIO()"
