"""The shape of the code, measured from the source (the measures of the trainer-wing renovation): the
floors between sub-packages, the Trainer's private state kept in its room, a small Strategy base, and no
frame introspection to find out who called."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import tandem

SRC = Path(tandem.__file__).parent
#: each floor imports (at run time) only from the floors below it; ``version`` is a leaf anyone may import
FLOORS = ("utilities", "strategies", "loggers", "profilers", "module", "callbacks", "trainer", "tuner", "cli", "core")


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _floor(path: Path) -> str | None:
    parts = path.relative_to(SRC).with_suffix("").parts
    return parts[0] if parts[0] in FLOORS else None


def _runtime_imports(tree: ast.AST) -> list[str]:
    """Modules imported outside ``if TYPE_CHECKING:`` blocks (function-level imports included)."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_no_floor_imports_from_a_floor_above_it():
    upward = []
    for path in _sources():
        floor = _floor(path)
        if floor is None:
            continue
        for module in _runtime_imports(ast.parse(path.read_text())):
            parts = module.split(".")
            if parts[0] != "tandem" or module == "tandem.version":
                continue
            target = parts[1] if len(parts) > 1 else "tandem"
            if target == "tandem" or (target in FLOORS and FLOORS.index(target) > FLOORS.index(floor)):
                upward.append(f"{path.relative_to(SRC)} imports {module}")
    assert upward == []


def test_the_trainers_private_state_is_read_only_in_its_own_file():
    pattern = re.compile(r"\b(trainer|_trainer)\._[a-z][a-z_]*")
    reads = [
        f"{path.relative_to(SRC)}: {match.group(0)}"
        for path in _sources()
        if path != SRC / "trainer" / "trainer.py"
        for match in pattern.finditer(path.read_text())
    ]
    assert reads == []


def test_the_strategy_base_stays_small():
    tree = ast.parse((SRC / "strategies" / "strategy.py").read_text())
    (base,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Strategy"]
    # one entry per method: a method's typing overloads are one method
    public = list(dict.fromkeys(f.name for f in base.body if isinstance(f, ast.FunctionDef) and f.name[0] != "_"))
    assert len(public) <= 43, (
        public
    )  # 43 since before_evaluation (validation through DDP's buffer broadcast, as Lightning)


def test_no_frame_locals_are_read_to_find_out_who_called():
    # save_hyperparameters reads the arguments of the user's __init__ frames, as Lightning does; nothing else
    # reads a frame's variables (the collective check's entry point is a context variable the stage runner sets).
    readers = [str(p.relative_to(SRC)) for p in _sources() if "f_locals" in p.read_text()]
    assert readers in ([], ["module/hyperparameters.py"])
