"""README.md's links into docs/, checked on the sources and, after `mkdocs build`, on the built site.

    python docs/scripts/check_site_links.py    # after mkdocs build (make docs): every link lands on a page and anchor

README.md links to ``docs/<page>.md#<anchor>`` so the links work on GitHub; the built site serves that page
as ``site/<page>/index.html`` with the anchor as an element id. tests/test_docs.py checks the sources with the
same functions (without mkdocs): the file exists and has a heading with that anchor.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def relative_links(markdown: Path) -> list[str]:
    """The relative link targets in a Markdown file, outside code blocks."""
    links, fenced = [], False
    for line in markdown.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            links.extend(LINK.findall(line))
    return links


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc (mkdocs) gives a heading; GitHub's agrees for plain headings."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip()
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(markdown: Path) -> set[str]:
    """The anchors of a Markdown file's headings (outside code blocks)."""
    found, fenced = set(), False
    for line in markdown.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := re.match(r"^#{1,6} (.+?)\s*#*$", line)):
            found.add(slug(match.group(1)))
    return found


def site_page(target: str, site: Path) -> Path:
    """The built page for ``docs/<page>.md`` (mkdocs' directory URLs)."""
    page = Path(target).relative_to("docs").with_suffix("")
    return site / "index.html" if page.name == "index" else site / page / "index.html"


def check_readme_against_site(readme: Path, site: Path) -> list[str]:
    """The README links to docs/ that do not land on a built page and anchor."""
    problems = []
    for link in relative_links(readme):
        target, _, anchor = link.partition("#")
        if not target.startswith("docs/") or not target.endswith(".md"):
            continue
        page = site_page(target, site)
        if not page.is_file():
            problems.append(f"{link}: {page} was not built")
        elif anchor and f'id="{anchor}"' not in page.read_text():
            problems.append(f"{link}: {page} has no element with id {anchor!r}")
    return problems


def main() -> int:
    problems = check_readme_against_site(REPO / "README.md", REPO / "site")
    for problem in problems:
        print("README.md link:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
