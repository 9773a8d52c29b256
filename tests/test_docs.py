"""Every Python block in README.md and docs/ runs (or, when marked, compiles), so the manual cannot rot.

The convention, written in docs/development.md: a fenced ```python block runs on the CPU, in a fresh namespace,
with the test's tmp_path as its working directory. An HTML comment on the line before the fence changes that:

- ``<!-- fragment -->``: a piece of a program (names defined elsewhere); compiled, not run.
- ``<!-- needs: gpu -->``, ``<!-- needs: cluster -->``: needs what CI lacks; compiled, not run.
- ``<!-- continues -->``: runs in the namespace the page's previous block left (a page's story in steps).
- ``<!-- script -->``: saved as a file and run with ``python`` in its own process (``strategy="ddp"`` re-runs
  the script, which cannot be pytest's).

bash, yaml and text blocks are not Python and are not run. The same module checks README's length and links,
and that the API reference pages are what docs/scripts/gen_api.py makes from the code. mkdocs is not needed.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers import REPO, run_python
from tandem.utilities.seed import isolate_rng

DOCS = REPO / "docs"
MARKER = re.compile(r"^\s*<!--\s*(fragment|needs:\s*\w+|continues|script)\s*-->\s*$")
OPEN_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
COMPILE_ONLY = ("fragment", "needs")


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, DOCS / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs, as an import does (a dataclass looks its module up)
    spec.loader.exec_module(module)
    return module


links = _load_script("check_site_links")
signatures = _load_script("check_api_signatures")


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    marker: str  # "" (run), "fragment", "needs: gpu", "continues", "script"
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


@dataclass
class Chain:
    """A block and the ``continues`` blocks after it: one namespace, one test."""

    blocks: list[Block] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.blocks[0].where


def blocks_of(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        match = OPEN_FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, language = match.groups()
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        previous = next((line for line in reversed(lines[:start]) if line.strip()), "")
        marker = MARKER.match(previous)
        code = textwrap.dedent("\n".join(body)) + "\n"
        found.append(
            Block(path, start + 1, language.lower(), re.sub(r"\s+", " ", marker.group(1)) if marker else "", code)
        )
    return found


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md")), REPO / "examples" / "README.md"]


def python_blocks() -> list[Block]:
    return [b for path in markdown_files() for b in blocks_of(path) if b.language in ("python", "py")]


def chains() -> list[Chain]:
    result: list[Chain] = []
    for block in python_blocks():
        if block.marker.startswith(COMPILE_ONLY):
            continue
        if block.marker == "continues":
            assert result and result[-1].blocks[0].path == block.path, f"{block.where}: nothing to continue"
            result[-1].blocks.append(block)
        else:
            result.append(Chain([block]))
    return result


@pytest.mark.parametrize(
    "block", [b for b in python_blocks() if b.marker.startswith(COMPILE_ONLY)], ids=lambda b: b.where
)
def test_marked_blocks_compile(block: Block) -> None:
    compile(block.code, block.where, "exec")


RUNNABLE = [c for c in chains() if c.blocks[0].marker != "script"]
SCRIPTS = [c for c in chains() if c.blocks[0].marker == "script"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("chain", RUNNABLE, ids=lambda c: c.id)
def test_block_runs(chain: Chain, tmp_path: Path, monkeypatch) -> None:
    """In this process, with tmp_path as the working directory (conftest), and no warning."""
    monkeypatch.delenv("TANDEM_GLOBAL_SEED", raising=False)  # seed_everything sets it; gone after the test
    namespace: dict = {"__name__": "__docs__"}
    with isolate_rng(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for block in chain.blocks:
            exec(compile(block.code, block.where, "exec"), namespace)  # noqa: S102 (the docs' own code)
    # A snippet that warns teaches the reader to ignore warnings: every block runs clean.
    shown = [
        f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})"
        for w in caught
        if not issubclass(w.category, DeprecationWarning)
    ]
    assert not shown, "\n".join(shown)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("chain", SCRIPTS, ids=lambda c: c.id)
def test_script_block_runs(chain: Chain, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text("".join(b.code for b in chain.blocks))
    proc = run_python([str(script)], timeout=110, cwd=tmp_path)
    assert proc.returncode == 0, f"{chain.id} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"


def test_every_python_block_is_collected() -> None:
    """The parser sees the blocks (a change of fence style must not silently drop them)."""
    blocks = python_blocks()
    assert len(blocks) >= 15
    assert any(b.path.name == "README.md" for b in blocks)
    assert {b.marker for b in blocks} >= {"", "fragment", "script"}


def test_readme_is_short_and_its_links_land_on_pages_and_headings() -> None:
    readme = REPO / "README.md"
    assert len(readme.read_text().splitlines()) <= 200
    targets = links.relative_links(readme)
    assert any(t.startswith("docs/") for t in targets)
    for link in targets:
        target, _, anchor = link.partition("#")
        assert (REPO / target).exists(), f"README links to {target}, which does not exist"
        if anchor:
            assert anchor in links.anchors(REPO / target), f"README links to {link}: no heading with that anchor"


def test_docs_links_between_pages_resolve() -> None:
    """mkdocs --strict checks this too; here without mkdocs, so make test catches a renamed heading."""
    for page in sorted(DOCS.rglob("*.md")):
        for link in links.relative_links(page):
            target, _, anchor = link.partition("#")
            path = (page.parent / target).resolve() if target else page
            assert path.exists(), f"{page.relative_to(REPO)} links to {link}: no such file"
            if anchor and path.suffix == ".md" and "api" not in path.parts:
                assert anchor in links.anchors(path), f"{page.relative_to(REPO)} links to {link}: no such heading"


def test_api_reference_pages_are_generated_from_the_code(capsys) -> None:
    assert _load_script("gen_api").main(["--check"]) == 0, capsys.readouterr().out


def _listed(block: str, option: str) -> list[str]:
    """The names a `:::` block's ``option`` lists (``members:`` or ``inherited_members:``), in order."""
    found = re.search(rf"^ {{6}}{option}:\n((?: {{8}}- \w+\n)+)", block, re.MULTILINE)
    return re.findall(r"- (\w+)", found.group(1)) if found else []


def test_a_class_split_into_base_classes_keeps_its_members_on_its_api_section() -> None:
    """TrainingModule's optimization, logging and hooks live in base classes of their own files; its section lists
    their documented members as its own (ids such as tandem.TrainingModule.optimizers), after its body's."""
    gen_api = _load_script("gen_api")
    block = gen_api.render("tandem").split("::: tandem.TrainingModule\n", 1)[1].split("\n::: ", 1)[0]
    members, inherited = _listed(block, "members"), _listed(block, "inherited_members")
    assert {"optimizers", "manual_backward", "log", "print", "backward", "on_test_model_train"} <= set(inherited)
    assert members == [name for name in members if name not in inherited] + inherited  # its own first
    assert {"training_step", "load_from_checkpoint", "trainer", "all_gather"} <= set(members) - set(inherited)
    # documented members only, as mkdocstrings shows them: not the undocumented no-op hooks, nor nn.Module's, nor
    # the bases the section leaves out (DataHooks, HyperparametersMixin)
    assert not {"on_fit_start", "device", "parameters", "prepare_data", "save_hyperparameters"} & set(members)


def test_gen_api_lists_documented_members_and_refuses_a_part_that_is_not_a_base(monkeypatch) -> None:
    gen_api = _load_script("gen_api")

    class Sample:
        flag = True  # a plain value: nothing for mkdocstrings to show

        @property
        def shown(self) -> int:
            """Documented."""
            return 1

        @property
        def bare(self) -> int:
            return 1

        def run(self) -> None:
            """Documented."""

        def _private(self) -> None:
            """Private."""

        @classmethod
        def build(cls) -> None:
            """Documented."""

    assert gen_api._shown_members(Sample) == ["shown", "run", "build"]
    monkeypatch.setitem(gen_api.PARTS, "tandem.TrainingModule", ["tandem.module.datamodule:DataModule"])
    with pytest.raises(SystemExit, match=r"names tandem.module.datamodule:DataModule, which is not a base class"):
        gen_api.render("tandem")


def _built_object(identifier: str, kind: str, signature: bool) -> str:
    """A top-level object as mkdocstrings writes it into a page (heading, optional signature, contents)."""
    shown = f'<div class="doc-signature highlight"><pre><code>{identifier}()</code></pre></div>' if signature else ""
    return (
        f'<div class="doc doc-object doc-{kind}"><h2 id="{identifier}" class="doc doc-heading">'
        f'<span class="doc doc-object-name">{identifier}</span></h2>{shown}'
        f'<div class="doc doc-contents first"><div class="doc doc-object doc-function">'
        f'<h3 id="{identifier}.member" class="doc doc-heading">member</h3>'
        f'<div class="doc-signature highlight"></div></div></div></div>'
    )


def test_api_signature_check_finds_objects_without_one() -> None:
    """docs/scripts/check_api_signatures.py (run by make docs on the built site), on pages written here."""
    markdown = "# page\n\n::: tandem.A\n\n::: tandem.f\n\n::: tandem.VALUE\n"
    good = "".join(
        [
            _built_object("tandem.A", "class", True),
            _built_object("tandem.f", "function", True),
            _built_object("tandem.VALUE", "attribute", False),  # an attribute needs none
        ]
    )
    assert signatures.check_page(markdown, good, "api/page") == []
    assert [(s.id, s.kind, s.signature) for s in signatures.sections(good)] == [
        ("tandem.A", "class", True),
        ("tandem.f", "function", True),
        ("tandem.VALUE", "attribute", False),
    ]

    # A class whose signature is missing: its member's signature (an h3 in its contents) does not count.
    no_signature = good.replace(_built_object("tandem.A", "class", True), _built_object("tandem.A", "class", False))
    problems = signatures.check_page(markdown, no_signature, "api/page")
    assert len(problems) == 1 and "tandem.A (class) shows no signature" in problems[0]

    # show_root_heading off: the objects have no heading of their own, only their members do.
    headless = re.sub(r'<h2 id="[^"]+" class="doc doc-heading">.*?</h2>', "", good)
    problems = signatures.check_page(markdown, headless, "api/page")
    assert len(problems) == 1 and "no heading for tandem.A, tandem.f, tandem.VALUE" in problems[0]


def test_slug_matches_mkdocs() -> None:
    assert links.slug("`ddp`: tandem re-runs your script") == "ddp-tandem-re-runs-your-script"
    assert links.slug("NaN and inf") == "nan-and-inf"
    assert links.slug("Pre-emption (SIGTERM, SIGUSR1)") == "pre-emption-sigterm-sigusr1"


if __name__ == "__main__":  # list the blocks and how each is treated
    for b in python_blocks():
        print(f"{b.where:50} {b.marker or 'run'}")
    sys.exit(0)
