"""Where a rank is, as the side channel tells it: the Trainer entry point running now (``entry_point``, a context
variable), the place its loop publishes (``placed``), the call site of a collective (``CallSite``: tandem's caller
and the user's line), the main thread's frame as the watcher samples it (its hook, the user's line, whether it
waits inside torch), and an error: its summary, and whether it broke inside torch. tandem's own frames are told
from the user's by the folder of their file (``_TANDEM_DIR``, ``_STRATEGIES_DIR``, this package's ``_PACKAGE_DIR``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType

from tandem.strategies.side_channel import group

_TANDEM_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # src/tandem
_STRATEGIES_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_BLOCKING = (  # where a main thread waits for other ranks inside torch
    f"{os.sep}torch{os.sep}distributed{os.sep}",
    f"{os.sep}torch{os.sep}autograd{os.sep}",
    f"{os.sep}torch{os.sep}nn{os.sep}parallel{os.sep}",
    f"{os.sep}torch{os.sep}_tensor.py",  # Tensor.backward
)
_LIBRARIES = (f"{os.sep}torch{os.sep}", f"{os.sep}lightning_utilities{os.sep}")
#: about the most characters of an error's message that `error_summary` quotes (a status, a teardown reason)
_SUMMARY_LIMIT = 300
#: where a rank's loop is, as the watcher reads it: (stage, epoch, batch in the epoch, global step)
Place = tuple[str | None, int, int, int]
_HOOK_NAMES = frozenset(
    {"training_step", "validation_step", "test_step", "predict_step", "backward", "optimizer_step"}
    | {"optimizer_zero_grad", "configure_optimizers", "prepare_data", "setup", "teardown"}
)
_DATA_LOADING = f"{os.sep}torch{os.sep}utils{os.sep}data{os.sep}"
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # the side channel's files

#: the Trainer entry point running now (see ``entry_point``)
_ENTRY_POINT: contextvars.ContextVar[str | None] = contextvars.ContextVar("tandem_entry_point", default=None)


@contextlib.contextmanager
def entry_point(name: str) -> Iterator[None]:
    """Inside the block, tandem's collectives belong to the Trainer entry point ``name`` ("fit", "test",
    "save_checkpoint", ...; nested blocks: the innermost). ``trainer.test`` on one rank and
    ``trainer.validate`` on another pass through the same collectives, yet do not belong together: the
    collective check tells them apart by this name.

    Example:
        ```python
        with entry_point("save_checkpoint"):
            strategy.barrier()  # a mismatch names "in Trainer.save_checkpoint"
        ```
    """
    outermost = _ENTRY_POINT.get() is None
    token = _ENTRY_POINT.set(name)
    try:
        yield
    except SystemExit as stop:
        if outermost and group._CHANNEL is not None and type(stop) is SystemExit:  # Preempted has its own report
            group._CHANNEL.left = f"{_exit_call(stop)} inside Trainer.{name}"
        raise
    except BaseException as error:
        explained = group._CHANNEL.explain(error, name) if outermost and group._CHANNEL is not None else None
        if explained is not None:
            raise explained from None  # the backend's text is in the message, once
        raise
    else:
        if outermost and group._CHANNEL is not None:
            group._CHANNEL.left = f"after Trainer.{name} returned"
    finally:
        _ENTRY_POINT.reset(token)


@contextlib.contextmanager
def placed(place: Callable[[], Place]) -> Iterator[None]:
    """Inside the block, ``place()`` says where this rank's loop is: (stage, epoch, batch, global step). The
    watcher thread calls it once a beat (nothing runs per step: it reads the loop's own counters); a hang's table
    shows it. Nothing happens without a side channel.

    Example:
        ```python
        with placed(lambda: (state.stage, loop.epoch, loop.batches_done, loop.global_step)):
            ...  # the fit
        ```
    """
    channel = group._CHANNEL
    if channel is None:
        yield
        return
    previous, channel.place = channel.place, place
    try:
        yield
    finally:
        channel.place = previous


# ---------------------------------------------------------------------------------------------- call sites


@dataclass(frozen=True)
class CallSite:
    """Where a collective was asked for: tandem's own caller and entry point (the tag) and the user's line."""

    tag: str  # e.g. "barrier@Strategy.save_checkpoint in Trainer.fit" or "all_gather@user code"
    user: str  # e.g. "train.py:42 in main", or "" when no user frame is on the stack

    @classmethod
    def here(cls, op: str, depth: int = 2) -> CallSite:
        """The call site of the strategy collective ``op``, looking ``depth`` frames up from the caller."""
        frame: FrameType | None = sys._getframe(depth)
        internal = None
        while frame is not None and (_in(frame, _STRATEGIES_DIR) or _in_library(frame)):
            frame = frame.f_back
        if frame is not None and _in(frame, _TANDEM_DIR) and not frame.f_code.co_filename.endswith("module.py"):
            internal = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
        entry = _ENTRY_POINT.get()
        return cls(f"{op}@{internal or 'user code'}" + (f" in Trainer.{entry}" if entry else ""), _user_site(frame))


def _in(frame: FrameType, folder: str) -> bool:
    return frame.f_code.co_filename.startswith(folder)


def _in_library(frame: FrameType) -> bool:
    """A frame of torch or lightning-utilities (``self.all_gather`` goes through ``apply_to_collection``)."""
    name = frame.f_code.co_filename
    return any(part in name for part in _LIBRARIES) or name.startswith("<frozen")


def _user_site(frame: FrameType | None) -> str:
    """The innermost frame outside tandem, torch and lightning-utilities, as ``file.py:line in function``."""
    while frame is not None:
        if not _in(frame, _TANDEM_DIR) and not _in_library(frame):
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return ""


def _exit_call(stop: SystemExit) -> str:
    """``sys.exit(0) at train.py:12 in training_step``: where a SystemExit was raised, in the user's code."""
    tb, user = stop.__traceback__, ""
    while tb is not None:  # the innermost user frame of the traceback
        if not _in(tb.tb_frame, _TANDEM_DIR) and not _in_library(tb.tb_frame):
            user = f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno} in {tb.tb_frame.f_code.co_name}"
        tb = tb.tb_next
    code = 0 if stop.code is None else stop.code
    return f"sys.exit({code!r})" + (f" at {user}" if user else "")


def _describe(tag: str, user: str) -> str:
    op, _, where = tag.partition("@")
    where, _, entry = where.partition(" in ")
    text = f"{op} (from {where}" + (f" in {entry}" if entry else "")
    return text + (f", called at {user})" if user else ")")


# ---------------------------------------------------------------------------------------------- errors, and the main thread


def broke_in_torch(error: BaseException) -> bool:
    """Whether ``error`` was raised inside torch's collectives or backward pass (where a rank waits for the others,
    and fails when one of them leaves). A KeyboardInterrupt (or SystemExit) raised there never is: Ctrl-C lands
    wherever the main thread is, inside torch as often as not."""
    if not isinstance(error, Exception):
        return False
    frame = _innermost_frame(error)
    return frame is not None and any(part in frame.f_code.co_filename for part in _TORCH_BLOCKING)


def _innermost_frame(error: BaseException) -> FrameType | None:
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame if tb is not None else None


def error_summary(error: BaseException) -> str:
    """``Type: first line of the message`` (gloo's advice to read the other logs cut), shortened to about 300
    characters at a sentence or clause (see `_clipped`)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    text = text.split(". This is typically caused by")[0]  # gloo's advice to read the other rank's log
    return f"{type(error).__name__}: {_clipped(text)}" if text else type(error).__name__


def _clipped(text: str, limit: int = _SUMMARY_LIMIT) -> str:
    """``text`` if it has at most ``limit`` characters; else its longest beginning within them that ends a sentence
    or a clause outside parentheses, then `` ...``: never a cut inside a name or a call site (``in <module>``)."""
    if len(text) <= limit:
        return text
    depth, cut = 0, -1
    for i, char in enumerate(text[:limit]):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth = max(0, depth - 1)
        elif char in ".,;" and depth == 0 and text[i + 1 : i + 2] == " ":
            cut = i + 1 if char == "." else i  # a sentence keeps its full stop; a clause drops its comma
    if cut <= 0:  # one long clause: between two words
        cut = max(text.rfind(" ", 0, limit), 0) or limit
    return f"{text[:cut]} ..."


def _main_thread_place(frame: FrameType | None) -> tuple[str, bool, str, str]:
    """``_main_thread_position``, the user's line and the hook the main thread is in (the innermost frame named
    after a hook or step method outside torch; "fetching a batch" inside a data loader; "backward" in autograd). A
    wait in the collective check shows as its caller (its polling loop would look like progress)."""
    checking = frame is not None and _in(frame, _PACKAGE_DIR)
    while frame is not None and _in(frame, _STRATEGIES_DIR):
        frame = frame.f_back
    where, blocked = _main_thread_position(frame)
    if checking:
        user = _user_site(frame)
        where = "tandem's collective check" + (f", called at {user}" if user else "")
    hook, inner = "", frame
    while inner is not None:
        name, file = inner.f_code.co_name, inner.f_code.co_filename
        if _DATA_LOADING in file:
            hook = "fetching a batch"
            break
        if not _in_library(inner) and (name.startswith("on_") or name in _HOOK_NAMES):
            hook = name
            break
        inner = inner.f_back
    if not hook and frame is not None and f"{os.sep}torch{os.sep}autograd{os.sep}" in frame.f_code.co_filename:
        hook = "backward"
    return where, blocked, _user_site(frame), hook


def _main_thread_position(frame: FrameType | None, lineno: int | None = None) -> tuple[str, bool]:
    """Where the main thread is, as text, and whether it waits inside torch (a collective or a backward
    pass) for other ranks. The text changes whenever the innermost frame moves."""
    if frame is None:
        return "", False
    code = frame.f_code
    blocked = any(part in code.co_filename for part in _TORCH_BLOCKING)
    inner = f"{code.co_name} ({os.path.basename(code.co_filename)}:{lineno or frame.f_lineno})"
    user = _user_site(frame)
    where = f"torch's {inner}" if blocked else inner
    return (f"{where}, called at {user}" if user else where), blocked


# ---------------------------------------------------------------------------------------------- helpers


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)
