"""Write the API reference pages (docs/api/*.md) from the code: one page per public package, one section per
name in its ``__all__`` (and per name a page adds), the page's main object first. mkdocstrings renders each from
its docstring under the path it is imported from (``::: tandem.Trainer``), with its name as the heading and its
signature under it; that path is the heading's id, which docstrings link to (``[`Trainer`][tandem.Trainer]``).

    python docs/scripts/gen_api.py           # rewrite docs/api/
    python docs/scripts/gen_api.py --check   # exit 1 when a page is not what the code gives (tests/test_docs.py)

A name added to a package's ``__all__`` appears here at the next run; the test fails until the pages are
written again, so the reference never misses a public name.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import pkgutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

API = Path(__file__).resolve().parents[1] / "api"


class Page(NamedTuple):
    """One API page: its title and introduction, the packages whose ``__all__`` it documents, the names it adds
    from elsewhere (``"module:Name"``), and the names that open it, in that order."""

    title: str
    intro: str
    packages: Sequence[str]
    extras: Sequence[str] = ()
    first: Sequence[str] = ()


# Each page opens with the object a reader came for (the class they make or subclass), then the others in the
# order they meet them; a name not in ``first`` follows in its package's ``__all__`` order, then the extras.
PAGES: dict[str, Page] = {
    "tandem": Page(
        "tandem",
        "The top-level package: what a first program imports (`import tandem`).",
        ["tandem"],
        ["tandem.utilities.seed:isolate_rng"],
        first=["Trainer", "TrainingModule", "DataModule", "Callback", "seed_everything", "isolate_rng"],
    ),
    "trainer": Page(
        "tandem.trainer",
        "The Trainer, its state's enums (Lightning's), and the record of `on_nonfinite=\"rollback\"`.",
        ["tandem.trainer"],
        [
            "tandem.trainer.state:TrainerFn",
            "tandem.trainer.state:TrainerStatus",
            "tandem.trainer.state:RunningStage",
        ],
        first=["Trainer", "TrainerFn", "TrainerStatus", "RunningStage"],
    ),
    "callbacks": Page(
        "tandem.callbacks",
        "Every callback, with Lightning's names and arguments.",
        ["tandem.callbacks"],
        first=["Callback"],
    ),
    "loggers": Page(
        "tandem.loggers",
        "Where `self.log` values go.",
        ["tandem.loggers"],
        first=["Logger", "TensorBoardLogger", "CSVLogger"],
    ),
    "strategies": Page(
        "tandem.strategies",
        "Strategies by class, precision and the plugins `Trainer(plugins=...)` takes.",
        ["tandem.strategies"],
        first=[
            "Strategy",
            "SingleDeviceStrategy",
            "DataParallelStrategy",
            "DDPStrategy",
            "FSDPStrategy",
            "ParallelStrategy",
            "register_strategy",
            "available_strategies",
            "Precision",
        ],
    ),
    "environments": Page(
        "tandem.strategies.environments",
        "Cluster environments: where a process reads its rank (see [Clusters](../clusters.md)).",
        [],
        [
            "tandem.strategies.environments:ClusterEnvironment",
            "tandem.strategies.environments:TorchElasticEnvironment",
            "tandem.strategies.environments:SLURMEnvironment",
            "tandem.strategies.environments:MPIEnvironment",
            "tandem.strategies.environments:LSFEnvironment",
            "tandem.strategies.environments:KubeflowEnvironment",
            "tandem.strategies.environments:LocalEnvironment",
        ],
    ),
    "profilers": Page(
        "tandem.profilers",
        "`Trainer(profiler=...)`.",
        ["tandem.profilers"],
        first=["Profiler", "SimpleProfiler", "AdvancedProfiler", "PyTorchProfiler"],
    ),
    "tuner": Page("tandem.tuner", "The learning-rate and batch-size searches.", ["tandem.tuner"], first=["Tuner"]),
    "cli": Page(
        "tandem.cli",
        "The command line and YAML configs.",
        ["tandem.cli"],
        first=["CLI", "LightningCLI", "LightningArgumentParser", "SaveConfigCallback"],
    ),
    "utilities": Page(
        "tandem.utilities",
        "The combined loader, the rank-zero helpers, the model summary, and the exceptions and warnings tandem "
        "raises (see [Reliability](../reliability.md)).",
        ["tandem.utilities"],
        [
            "tandem.utilities.model_summary:ModelSummary",
            "tandem.utilities.model_summary:summarize",
            "tandem.utilities.exceptions:RankFailedError",
            "tandem.utilities.exceptions:CollectiveMismatchError",
            "tandem.utilities.exceptions:HangError",
            "tandem.utilities.exceptions:Preempted",
            "tandem.utilities.exceptions:ReplicasDivergedError",
            "tandem.utilities.exceptions:NonFiniteError",
            "tandem.utilities.exceptions:FileWriteError",
            "tandem.utilities.exceptions:CheckpointError",
            "tandem.utilities.exceptions:TandemConfigError",
            "tandem.utilities.exceptions:TandemUserCodeError",
            "tandem.utilities.exceptions:UnzeroedGradientsWarning",
        ],
        first=["CombinedLoader", "rank_zero_only", "rank_zero_info", "rank_zero_warn", "ModelSummary", "summarize"],
    ),
    "integrations": Page(
        "tandem.integrations",
        "Optional integrations; each imports its framework only when used.",
        [],
        ["tandem.integrations.ray:RayTrainReportCallback"],
    ),
}


def _section(package: str, name: str) -> str:
    """A name of ``package.__all__``: rendered by mkdocstrings under its public path (``tandem.Trainer``), which
    is also the identifier a docstring links to (``[`Trainer`][tandem.Trainer]``)."""
    value = getattr(importlib.import_module(package), name)
    if name == "__version__":
        version = f"{package}.__version__"
        return f"## `__version__` {{#{version}}}\n\n`{version}`: the installed version, a string.\n"
    where = getattr(value, "__module__", None) or ""
    if not where.startswith("tandem"):
        where = _defining_submodule(package, name, value) or where
    if where.startswith("tandem") and assembled(value):
        listed = "".join(f"        - {member}\n" for member in assembled_members(value))
        return f"::: {package}.{name}\n    options:\n      show_bases: false\n      inherited_members: true\n      members:\n{listed}"
    if where.startswith("tandem"):
        return f"::: {package}.{name}\n"
    # A name tandem re-exports from another package (mkdocs.yml preloads it): its own docs, and where it comes from.
    return f"::: {package}.{name}\n\n`{package}.{name}` is `{where}.{name}`, as in Lightning.\n"


#: Classes whose public members live in base classes of their own files (the Trainer's run, services and
#: properties; see tandem.trainer.trainer): their sections show those members as the class's own.
ASSEMBLED = ("tandem.trainer.trainer.Trainer",)


def assembled(value: object) -> bool:
    """Whether ``value`` is one of the ``ASSEMBLED`` classes."""
    return inspect.isclass(value) and f"{value.__module__}.{value.__qualname__}" in ASSEMBLED


def assembled_members(value: type) -> list[str]:
    """The members an assembled class's section shows, as it showed them when they were one class body: the public
    methods and properties with a docstring of their own, the class's first, then each tandem base's, each in
    source order (mkdocstrings then puts the properties before the methods)."""
    names: list[str] = []
    for kind in inspect.getmro(value):
        if not kind.__module__.startswith("tandem"):
            continue
        tree = ast.parse(Path(inspect.getfile(kind)).read_text())
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == kind.__name__).body
        for node in body:
            public = isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
            if public and ast.get_docstring(node) and node.name not in names:
                names.append(node.name)
    return names


def _defining_submodule(package: str, name: str, value: object) -> str | None:
    """The submodule of ``package`` that assigns ``name`` (a type alias has no ``__module__`` of its own)."""
    path = getattr(importlib.import_module(package), "__path__", None)
    for info in pkgutil.iter_modules(path or []):
        module = importlib.import_module(f"{package}.{info.name}")
        if module.__dict__.get(name) is value and f"\n{name} = " in Path(module.__file__).read_text():
            return module.__name__
    return None


def sections(page: str) -> dict[str, str]:
    """The page's sections by name, in the page's order."""
    spec = PAGES[page]
    found: dict[str, str] = {}
    for package in spec.packages:
        for name in importlib.import_module(package).__all__:
            found[name] = _section(package, name)
    for extra in spec.extras:
        module, name = extra.split(":")
        getattr(importlib.import_module(module), name)  # fails loudly when a documented name is gone
        found[name] = f"::: {module}.{name}\n"
    unknown = [name for name in spec.first if name not in found]
    if unknown:
        raise SystemExit(
            f"PAGES[{page!r}].first names {unknown}, which the page does not document; expected names of its "
            "packages' __all__ or of its extras: remove them from first, or add them to the page"
        )
    return {name: found[name] for name in [*spec.first, *(n for n in found if n not in spec.first)]}


def render(page: str) -> str:
    spec = PAGES[page]
    parts = [
        f"# {spec.title}\n",
        "<!-- Generated by docs/scripts/gen_api.py from the code; do not edit. -->\n",
        spec.intro + "\n",
        *sections(page).values(),
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    for page in PAGES:
        path = API / f"{page}.md"
        text = render(page)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path))
        else:
            API.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale API pages (run python docs/scripts/gen_api.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
