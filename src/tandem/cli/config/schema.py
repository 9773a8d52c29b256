"""The shape of a config: its top-level keys, plain values and class sections (``trainer``, ``model``, ``data``),
and the ``{class_path, init_args}`` mapping that names a class."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tandem.cli.arguments import Parameter
from tandem.cli.class_paths import resolve_class
from tandem.cli.errors import missing_required

SPEC_KEYS = ("class_path", "init_args")


def is_spec(value: Any) -> bool:
    return isinstance(value, dict) and "class_path" in value


@dataclass(frozen=True)
class Section:
    """A top-level key built from a class: ``trainer``, ``model`` or ``data``.

    The value is the arguments of ``default`` (``model: {lr: 0.1}``), or ``{class_path, init_args}`` naming a
    subclass of ``base``. With no ``default`` the section is optional (None) unless ``required``.
    """

    key: str
    base: type
    default: type | None
    defaults: dict[str, Any] = field(default_factory=dict)  # overrides of the signature's defaults
    required: bool = False
    class_path_allowed: bool = True
    skip: int = 0  # leading arguments the caller passes (an optimizer's params)


@dataclass(frozen=True)
class Schema:
    """Every top-level key: plain values (``seed_everything``, ``ckpt_path``) and class sections, in print order."""

    values: dict[str, Parameter]
    sections: dict[str, Section]
    order: tuple[str, ...]

    def section_class(self, key: str, value: Any) -> type:
        """The class a section's (completed) value builds."""
        section = self.sections[key]
        if isinstance(value, dict) and "class_path" in value:
            return resolve_class(value["class_path"], section.base, f"{key}.class_path")
        if section.default is None:  # _complete_section refused such a value already
            raise missing_required(f"{key}.class_path", section.base)
        return section.default


def common_base(classes: type | tuple[type, ...], key: str) -> type:
    """The class a key accepts subclasses of: the one given, or the member of a tuple the others derive from."""
    if isinstance(classes, type):
        return classes
    for candidate in classes:
        if all(issubclass(c, candidate) for c in classes):
            return candidate
    raise ValueError(f"{key}: {classes!r} have no common base class among them; give one base class.")
