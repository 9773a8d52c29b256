"""The one owner of sys.excepthook: one wrapper, listeners by key, each before the hook that was there."""

from __future__ import annotations

import sys

import pytest

from tandem.utilities import excepthook


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: seen.append(f"previous {kind.__name__}"))
    monkeypatch.setattr(excepthook, "_previous", None)
    monkeypatch.setattr(excepthook, "_LISTENERS", {})
    return seen


def _end_with(error: BaseException) -> None:
    sys.excepthook(type(error), error, None)


def test_listeners_run_in_order_before_the_previous_hook_and_the_wrapper_is_installed_once(calls):
    excepthook.on_uncaught_exception("a", lambda kind, value, tb: calls.append(f"a {value}"))
    installed = sys.excepthook
    excepthook.on_uncaught_exception("b", lambda kind, value, tb: calls.append(f"b {value}"))
    assert sys.excepthook is installed  # one wrapper, whatever registers
    _end_with(ValueError("boom"))
    assert calls == ["a boom", "b boom", "previous ValueError"]


def test_a_key_replaces_its_listener_and_removal_stops_it(calls):
    excepthook.on_uncaught_exception("a", lambda kind, value, tb: calls.append("first"))
    excepthook.on_uncaught_exception("a", lambda kind, value, tb: calls.append("second"))
    _end_with(KeyError("k"))
    excepthook.remove_listener("a")
    excepthook.remove_listener("never registered")
    _end_with(KeyError("k"))
    assert calls == ["second", "previous KeyError", "previous KeyError"]


def test_a_failing_listener_does_not_keep_the_others_or_the_traceback_from_running(calls):
    def broken(kind, value, tb):
        raise OSError("disk full")

    excepthook.on_uncaught_exception("broken", broken)
    excepthook.on_uncaught_exception("after", lambda kind, value, tb: calls.append("after"))
    _end_with(RuntimeError("x"))
    assert calls == ["after", "previous RuntimeError"]


def test_a_listener_that_reported_the_error_keeps_the_traceback_from_being_printed_here(calls):
    """A rank started by tandem's launcher hands its traceback to rank 0, which prints it once for the job."""
    excepthook.on_uncaught_exception("recorded", lambda kind, value, tb: calls.append("recorded") or True)
    excepthook.on_uncaught_exception("after", lambda kind, value, tb: calls.append("after"))
    _end_with(RuntimeError("x"))
    assert calls == ["recorded", "after"]  # every listener ran; the previous hook (the printer) did not
