"""tandem's docstrings are written for the site they render on (mkdocstrings, Markdown), not for Sphinx.

Sphinx markup prints as raw text there: a role (``:class:`Trainer```) shows its colons and backticks, and an
``Example::`` paragraph leaves the code after it unhighlighted. What the site renders instead, and what these tests
hold ``src/`` to (without mkdocs, in ``make test``):

- a cross-reference is an autorefs link to an object of the API reference, ``[`Trainer`][tandem.Trainer]`` or
  ``[`fit`][tandem.Trainer.fit]`` (the identifier is the path an API page renders the object under), and anything
  else (torch, Lightning, tandem's internals) a code span, ````torch.nn.Module````;
- an example is a Google-style ``Example:`` section holding a fenced ```` ```python ```` block, or ``Examples:``
  holding ``>>>`` lines (griffe shows them as console code, and doctest can still run them).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import REPO

SRC = REPO / "src" / "tandem"
ROLE = re.compile(r":(?:py:\w+|class|meth|func|mod|attr|data|exc|obj):`")
LITERAL_PARAGRAPH = re.compile(r"::\s*$")
EXAMPLE_TITLE = re.compile(r"^\s*Examples?:\s*$")
LINK = re.compile(r"\]\[([\w.]+)\]")
CODE_SPAN = re.compile(r"``.*?``|`[^`]*`")
FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass
class Docstring:
    path: Path
    line: int  # of the docstring's first line, 1-based
    text: str

    def lines(self) -> list[tuple[int, str]]:
        """(line number in the file, line) for each line of the docstring."""
        return [(self.line + i, line) for i, line in enumerate(self.text.splitlines())]

    def prose(self) -> list[tuple[int, str]]:
        """The lines outside fenced code blocks."""
        out, fenced = [], False
        for number, line in self.lines():
            if FENCE.match(line):
                fenced = not fenced
            elif not fenced:
                out.append((number, line))
        return out


def docstrings(path: Path, source: str | None = None) -> list[Docstring]:
    """Every docstring of a module: the module's, its classes' and functions', and an attribute's (a string
    statement after an assignment)."""
    tree = ast.parse(source if source is not None else path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.append(Docstring(path, node.lineno, node.value.value))
    return found


def sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def shown(path: Path) -> Path:
    return path.relative_to(REPO) if path.is_absolute() else path


def roles_in(path: Path, text: str) -> list[str]:
    """Sphinx roles anywhere in a source file (docstrings and comments alike)."""
    return [
        f"{shown(path)}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if ROLE.search(line)
    ]


def literal_paragraphs_in(docstring: Docstring) -> list[str]:
    """reST literal-block paragraphs (``Example::``, ``text::``) of a docstring."""
    return [
        f"{shown(docstring.path)}:{number}: {line.strip()}"
        for number, line in docstring.prose()
        if LITERAL_PARAGRAPH.search(line)
    ]


def unfenced_examples_in(docstring: Docstring) -> list[str]:
    """``Example:`` / ``Examples:`` sections whose first line is neither a fence nor a ``>>>`` line."""
    problems = []
    lines = docstring.lines()
    for i, (number, line) in enumerate(lines):
        if not EXAMPLE_TITLE.match(line):
            continue
        first = next((text.strip() for _, text in lines[i + 1 :] if text.strip()), "")
        if not first.startswith(("```", ">>>")):
            problems.append(f"{shown(docstring.path)}:{number}: {line.strip()} is followed by {first[:60]!r}")
    return problems


def test_no_sphinx_roles_in_src() -> None:
    found = [problem for path in sources() for problem in roles_in(path, path.read_text())]
    assert not found, (
        "Sphinx roles print as raw text on the site; link an object of the API reference as "
        "[`Name`][tandem.path.Name] (the id its API page gives it, e.g. tandem.Trainer.fit) and write anything "
        "else as a code span, ``name``:\n" + "\n".join(found)
    )


def test_no_literal_block_paragraphs_in_docstrings() -> None:
    found = [problem for path in sources() for doc in docstrings(path) for problem in literal_paragraphs_in(doc)]
    assert not found, (
        "a reST literal block ('Example::', 'text::') prints its '::' and leaves the code unhighlighted; write an "
        "'Example:' section with a fenced ```python block (or end the sentence with ':' and fence the block):\n"
        + "\n".join(found)
    )


def test_examples_are_fenced_or_doctests() -> None:
    found = [problem for path in sources() for doc in docstrings(path) for problem in unfenced_examples_in(doc)]
    assert not found, (
        "an Example: section renders its code highlighted only in a fenced ```python block (or as '>>>' lines "
        "under Examples:); indent the fence under the section title:\n" + "\n".join(found)
    )


def _gen_api():
    spec = importlib.util.spec_from_file_location("gen_api", REPO / "docs" / "scripts" / "gen_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _object_at(identifier: str) -> object:
    """The object an API page documents under ``identifier`` (a module path, then attributes)."""
    parts = identifier.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            value = getattr(value, name)
        return value
    raise LookupError(identifier)


@pytest.fixture(scope="module")
def api_ids() -> dict[str, object]:
    """The ids the API pages give their objects (the `:::` identifiers and the `{#id}` headings), with the
    objects; a member of one of them is ``id.member``."""
    gen_api = _gen_api()
    ids: dict[str, object] = {}
    for page in gen_api.PAGES:
        text = gen_api.render(page)
        for identifier in re.findall(r"^::: (\S+)$", text, re.MULTILINE) + re.findall(r"\{#([\w.]+)\}", text):
            ids[identifier] = _object_at(identifier)
    return ids


@pytest.fixture(scope="module")
def api_member_lists() -> dict[str, set[str]]:
    """The members a `:::` block lists in its options (``members``, ``inherited_members``: a class split into base
    classes, docs/scripts/gen_api.py's ``PARTS``), by the block's identifier; a block without a list is absent."""
    gen_api = _gen_api()
    lists: dict[str, set[str]] = {}
    for page in gen_api.PAGES:
        for block in re.split(r"^(?=::: )", gen_api.render(page), flags=re.MULTILINE)[1:]:
            listed = set(re.findall(r"^ +- (\w+)$", block, re.MULTILINE))
            if listed:
                lists[block.split()[1]] = listed
    return lists


def _documented(target: str, ids: dict[str, object], member_lists: dict[str, set[str]]) -> bool:
    """Whether the API pages render ``target``: one of their objects, or a public member an object's class body
    defines (mkdocstrings lists the members a class defines itself, not the inherited ones), or one its block lists
    (a class whose members moved to base classes lists them, inherited ones included)."""
    if target in ids:
        return True
    owner, _, member = target.rpartition(".")
    value = ids.get(owner)
    if value is None or member.startswith("_") or not inspect.isclass(value):
        return False
    if owner in member_lists:
        return member in member_lists[owner]
    return member in vars(value) or member in getattr(value, "__dataclass_fields__", {})


def test_docstring_links_point_into_the_api_reference(
    api_ids: dict[str, object], api_member_lists: dict[str, set[str]]
) -> None:
    """A link to an id the site does not have fails `mkdocs build --strict`; this catches it without mkdocs."""
    assert "tandem.Trainer" in api_ids and "tandem.callbacks.Callback" in api_ids
    broken = [
        f"{shown(doc.path)}:{number}: [{target}]"
        for path in sources()
        for doc in docstrings(path)
        for number, line in doc.prose()
        for target in LINK.findall(CODE_SPAN.sub("", line))
        if not _documented(target, api_ids, api_member_lists)
    ]
    assert not broken, (
        "these links name no object of the API reference (docs/api/, written by docs/scripts/gen_api.py); use the "
        "id its page gives it (tandem.Trainer, tandem.callbacks.EarlyStopping, tandem.Trainer.fit) or write a "
        "code span, ``name``:\n" + "\n".join(broken)
    )


SAMPLE = '''"""A module.

Example::

    run()
"""


class Thing:
    """Uses {role}`Trainer`.

    Example:
        run()
    """

    #: a comment with {role}`x`
    size = 1
'''


@pytest.mark.parametrize(
    "role", [":class:", ":meth:", ":func:", ":mod:", ":attr:", ":data:", ":exc:", ":obj:", ":py:class:"]
)
def test_the_checks_find_what_they_refuse(role: str) -> None:
    """Each check finds its markup (here in a sample module), so a passing run means there was none."""
    source = SAMPLE.replace("{role}", role)
    path = Path("sample.py")
    found = docstrings(path, source)
    assert [line.split(": ", 1)[0] for line in roles_in(path, source)] == ["sample.py:10", "sample.py:16"]
    assert [p for d in found for p in literal_paragraphs_in(d)] == ["sample.py:3: Example::"]
    assert [p.split(":")[1] for d in found for p in unfenced_examples_in(d)] == ["12"]
    fenced = source.replace(
        "    Example:\n        run()", "    Example:\n        ```python\n        run()\n        ```"
    )
    assert [p for d in docstrings(path, fenced) for p in unfenced_examples_in(d)] == []
