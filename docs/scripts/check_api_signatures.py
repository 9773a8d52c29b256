"""The built API reference shows every object's signature, checked after `mkdocs build` (make docs).

    python docs/scripts/check_api_signatures.py    # after mkdocs build: exit 1 naming each object without one

Each `::: identifier` of docs/api/<page>.md is one top-level section of site/api/<page>/index.html: an h2
heading (mkdocstrings' `show_root_heading`) whose id is the identifier, followed by the signature block
(`Trainer(...)`, `seed_everything(seed=None, workers=False) -> int`; a class without an `__init__` of its own
shows `Callback()` or its class statement, docs/templates/python/material/class.html.jinja). A page that renders
fewer headings than it has `:::` lines (the option turned off), or a class or function heading with no signature
after it, is reported. tests/test_docs.py runs the same functions on small pages, without mkdocs.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DIRECTIVE = re.compile(r"^::: (\S+)\s*$", re.MULTILINE)
KINDS_WITH_SIGNATURES = ("class", "function")


@dataclass
class Section:
    """One top-level object of a built page: its heading's id, its kind and whether a signature follows."""

    id: str
    kind: str = ""
    signature: bool = False


class _Sections(HTMLParser):
    """The h2 headings mkdocstrings writes (``class="doc doc-heading"``), each with the kind of the object it
    heads (``<div class="doc doc-object doc-class">`` around it) and whether a ``doc-signature`` block comes
    before the object's contents."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[Section] = []
        self._kind = ""  # of the last object opened
        self._open: Section | None = None  # the section whose signature may still come

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if tag == "div" and "doc-object" in classes:
            self._kind = next((c.removeprefix("doc-") for c in classes if c not in ("doc", "doc-object")), "")
        elif tag == "h2" and "doc-heading" in classes:
            self._open = Section(dict(attrs).get("id") or "", self._kind)
            self.sections.append(self._open)
        elif self._open is not None and "doc-signature" in classes:
            self._open.signature = True
            self._open = None
        elif self._open is not None and "doc-contents" in classes:
            self._open = None


def sections(html: str) -> list[Section]:
    """The top-level object sections of a built API page, in order."""
    parser = _Sections()
    parser.feed(html)
    return parser.sections


def check_page(markdown: str, html: str, page: str) -> list[str]:
    """What is wrong with one built page, given its Markdown source."""
    expected = DIRECTIVE.findall(markdown)
    found = sections(html)
    problems = []
    missing = [ident for ident in expected if ident not in {s.id for s in found}]
    if missing:
        problems.append(
            f"{page}: no heading for {', '.join(missing)}: each `:::` object needs show_root_heading: true "
            "(mkdocs.yml) to show its name and signature"
        )
    for section in found:
        if section.kind in KINDS_WITH_SIGNATURES and not section.signature:
            problems.append(
                f"{page}: {section.id} ({section.kind}) shows no signature; expected a doc-signature block after "
                "its heading (separate_signature and merge_init_into_class in mkdocs.yml, and the class template in "
                "docs/templates/python/material/)"
            )
    return problems


def check_site(docs: Path, site: Path) -> list[str]:
    """Every API page of ``docs/api`` against its build in ``site/api``."""
    problems = []
    for source in sorted((docs / "api").glob("*.md")):
        built = site / "api" / source.stem / "index.html"
        if not built.is_file():
            problems.append(f"{built} was not built (run mkdocs build first)")
            continue
        problems.extend(check_page(source.read_text(), built.read_text(), f"api/{source.stem}"))
    return problems


def main() -> int:
    problems = check_site(REPO / "docs", REPO / "site")
    for problem in problems:
        print("API signature:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
