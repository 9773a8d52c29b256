"""The command line's and config files' errors: ``CLIError``, and one helper per kind of mistake, each saying what
was wrong, what was expected and the fix."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from tandem.cli.arguments import type_name
from tandem.utilities.exceptions import TandemConfigError


class CLIError(TandemConfigError):
    """A command line or config file that tandem cannot turn into a run."""


def unknown_key(key: str, valid: Iterable[str]) -> CLIError:
    """``key`` names no argument; suggest the closest valid names."""
    prefix, _, name = key.rpartition(".")
    valid = sorted(valid)
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    where = f"{prefix}." if prefix else ""
    hint = f" Did you mean {' or '.join(repr(where + c) for c in close)}?" if close else ""
    listed = ", ".join(valid) if valid else "none"
    return CLIError(f"Unknown key {key!r}.{hint} Valid keys{' of ' + prefix if prefix else ''}: {listed}.")


def wrong_type(key: str, value: Any, expected: str) -> CLIError:
    """``value`` given for ``key`` is not of the type the argument takes."""
    return CLIError(
        f"{key}={value!r} is not valid: expected {expected}. Fix it in the config file or on the command line "
        f"(--{key} VALUE)."
    )


def missing_required(key: str, hint: Any) -> CLIError:
    """A required argument (no default) was given no value."""
    return CLIError(
        f"{key} is required ({type_name(hint)}, no default). Set it in a config file or pass --{key} VALUE."
    )


def bad_class_path(key: str, path: Any, reason: str) -> CLIError:
    """A ``class_path`` that does not import, or names a class that does not fit the slot."""
    return CLIError(f"{key}={path!r}: {reason}")


def bad_config_file(path: str, reason: str) -> CLIError:
    """A ``--config`` file that is missing or not a YAML mapping."""
    return CLIError(f"--config {path}: {reason}")


def bad_command_line(reason: str) -> CLIError:
    """Tokens the command line cannot parse."""
    return CLIError(reason)


def list_replaced(key: str, old: list[Any], raw: str) -> str:
    """The note for ``--key VALUE`` (``raw``) replacing the list ``old`` that a lower layer (a config file) gave."""

    def named(item: Any) -> str:
        path = item.get("class_path") if isinstance(item, dict) else item
        return str(path).rsplit(".", 1)[-1] if isinstance(path, str) else type(item).__name__

    items = f"{len(old)} item{'s' if len(old) > 1 else ''}: {', '.join(named(item) for item in old)}"
    return (
        f"--{key} {raw} replaced the list the config gave {key} ({items}) with {raw}: a plain --{key} VALUE sets "
        f"the whole list. To add to the list instead, write --{key}+={raw} (the options after it, "
        f"--{key}.NAME VALUE, set the appended item)."
    )
