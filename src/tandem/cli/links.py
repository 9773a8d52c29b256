"""``link_arguments``' links: one config value set from others (``compute_fn``), when parsing from the config's
values or when instantiating from the built objects (``data.num_classes`` read from the built datamodule). Here:
the record, its checks against the schema, its values, and the order of building that instantiation links impose.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from tandem.cli.config.complete import holds_missing
from tandem.cli.config.layers import get_path, put_path
from tandem.cli.config.schema import Schema
from tandem.cli.errors import CLIError


@dataclass(frozen=True)
class Link:
    """``target`` computed from ``sources`` (``compute_fn(*values)``, or the one value), when parsing (from the
    config's values) or when instantiating (from the built objects: ``data.num_classes`` is an attribute)."""

    sources: tuple[str, ...]
    target: str
    compute_fn: Callable[..., Any] | None
    apply_on: Literal["parse", "instantiate"]

    def value(self, values: list[Any]) -> Any:
        if self.compute_fn is None:
            return values[0]
        try:
            return self.compute_fn(*values)
        except Exception as err:
            name = getattr(self.compute_fn, "__name__", repr(self.compute_fn))
            raise ValueError(
                f"link {', '.join(self.sources)} --> {self.target}: {name}{tuple(values)!r} failed: {err}"
            ) from err


def links_on(links: list[Link], apply_on: str) -> list[Link]:
    """The links applied when parsing (``"parse"``) or when instantiating (``"instantiate"``)."""
    return [link for link in links if link.apply_on == apply_on]


def check_links(links: list[Link], schema: Schema) -> None:
    """Each link's keys are keys of the schema; an instantiation link reads built classes and sets an argument of
    another."""
    keys = set(schema.values) | set(schema.sections)
    for link in links:
        for key in (*link.sources, link.target):
            if key.split(".")[0] not in keys:
                raise ValueError(f"link_arguments: {key!r} is not a key of the config; keys: {sorted(keys)}.")
        if link.apply_on == "instantiate":
            path = [p for p in link.target.split(".") if p != "init_args"]
            roots = {s.split(".")[0] for s in link.sources}
            if len(path) != 2 or path[0] not in schema.sections or roots & {"trainer", path[0]}:
                raise ValueError(
                    f"link_arguments({link.sources}, {link.target!r}, apply_on='instantiate'): the sources are "
                    "built classes other than the trainer and the target (data, model, an added class or their "
                    "attributes: 'data.num_classes'), the target an argument of one: 'model.num_classes'."
                )


def refuse_given_link_targets(links: list[Link], user: dict[str, Any], base: dict[str, Any]) -> None:
    """A link's target given by the user (not by ``set_defaults``) is an error: the program sets it."""
    for link in links:
        if get_path(user, link.target, None) is not None and get_path(base, link.target, None) is None:
            raise CLIError(
                f"{link.target} is set from {', '.join(link.sources)} (a link the program makes); remove it "
                f"from the config and the command line, and set {' / '.join(link.sources)} instead."
            )


def apply_parse_links(links: list[Link], config: dict[str, Any]) -> None:
    """The parse links' targets set in a completed config, from its values."""
    for link in links_on(links, "parse"):
        values = [get_path(config, source) for source in link.sources]
        if any(holds_missing(v) for v in values):
            continue  # a required value not given: reported as such
        try:
            value = link.value(values)
        except ValueError as err:
            raise CLIError(str(err)) from None
        put_path(config, link.target, value)


def instantiation_order(links: list[Link], schema: Schema) -> list[str]:
    """The class keys to build (all but the trainer): data, model, then added classes, each after the keys
    its instantiation links read from."""
    keys = [k for k in schema.sections if k != "trainer"]
    after = {
        k: {
            s.split(".")[0] for lk in links_on(links, "instantiate") if lk.target.split(".")[0] == k for s in lk.sources
        }
        for k in keys
    }
    ordered: list[str] = []

    def visit(key: str, path: tuple[str, ...]) -> None:
        if key in path:
            raise CLIError(f"link_arguments: the instantiation links make a cycle: {' -> '.join((*path, key))}.")
        if key not in ordered:
            for source in sorted(after[key]):
                visit(source, (*path, key))
            ordered.append(key)

    for key in ["data", "model", *[k for k in keys if k not in ("data", "model")]]:
        visit(key, ())
    return ordered


def linked_arguments(links: list[Link], key: str, built: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``key`` that instantiation links set from objects built already (``built``: by key)."""
    out = {}
    for link in links_on(links, "instantiate"):
        path = [p for p in link.target.split(".") if p != "init_args"]
        if path[0] != key:
            continue
        values = [_attribute(built, source) for source in link.sources]
        try:
            out[path[1]] = link.value(values)
        except ValueError as err:
            raise CLIError(str(err)) from None
    return out


def _attribute(built: dict[str, Any], source: str) -> Any:
    root, *names = [p for p in source.split(".") if p != "init_args"]
    value = built.get(root)
    for depth, name in enumerate(names):
        if not hasattr(value, name):
            where = ".".join([root, *names[:depth]])
            raise CLIError(f"link {source}: the built {where} ({type(value).__name__}) has no attribute {name!r}.")
        value = getattr(value, name)
    return value
