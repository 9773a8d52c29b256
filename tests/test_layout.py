"""The shape of the code, measured from the source (the measures of the trainer-wing renovation): the
floors between sub-packages, no import circles, files small enough to read whole, the Trainer's private state
kept in its room, a small Strategy base, and no frame introspection to find out who called."""

from __future__ import annotations

import ast
import inspect
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


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(("tandem", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def _import_graph() -> dict[str, set[str]]:
    """Each tandem module and the tandem modules it imports at run time (function-level imports included: an
    import moved into a function to get round a circle is still part of it). ``from package import module``
    leads to that module; a package's ``__init__`` that a submodule's import runs first is not counted."""
    paths = {_module_name(path): path for path in _sources()}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text())
        targets = set(_runtime_imports(tree))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in paths and node.level == 0:
                submodules = {f"{node.module}.{alias.name}" for alias in node.names} & paths.keys()
                if len(submodules) == len(node.names):
                    targets.discard(node.module)  # only modules named: the package's own names are not read
                targets |= submodules
        graph[name] = {target for target in targets if target in paths and target != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (Tarjan's strongly connected
    components of more than one module)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            group = [stack.pop()]
            while group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return circles


def test_the_import_graph_sees_an_import_inside_a_function():
    graph = _import_graph()
    assert "tandem.utilities.seed" in graph["tandem.strategies.launchers.spawn"]  # imported inside _spawned
    assert "tandem.trainer.checkpointing" in graph["tandem.trainer.preemption"]  # from tandem.trainer import ...
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_modules_import_each_other():
    # a circle makes the import order matter (a name read before its module finished) and the rooms one room
    graph = _import_graph()
    circles = _circles(graph)
    edges = [f"{module} imports {', '.join(sorted(graph[module] & set(c)))}" for c in circles for module in c]
    assert circles == [], "modules that import each other:\n" + "\n".join(edges)


#: the most lines a file in src/tandem may have: a room one can hold in one's head
MAX_LINES = 600


def test_no_source_file_is_longer_than_a_room():
    long = {
        str(path.relative_to(SRC)): lines
        for path in _sources()
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"files over {MAX_LINES} lines: split each along its jobs, one job a file"


#: the files the Trainer class is made of: trainer.py and its base classes' (run, services, properties)
TRAINER_FILES = ("trainer.py", "run.py", "services.py", "properties.py")


def test_the_trainers_private_state_is_read_only_in_its_own_files():
    own = {SRC / "trainer" / name for name in TRAINER_FILES}
    # the Trainer's files are exactly those of the classes it is made of (a new base class is named here)
    assert {Path(inspect.getfile(kind)) for kind in tandem.Trainer.__mro__ if kind is not object} == own
    pattern = re.compile(r"\b(trainer|_trainer)\._[a-z][a-z_]*")
    reads = [
        f"{path.relative_to(SRC)}: {match.group(0)}"
        for path in _sources()
        if path not in own
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
