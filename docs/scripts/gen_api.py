"""Write the API reference pages (docs/api/*.md) from the code: one page per public package, one section per
name in its ``__all__``, each rendered by mkdocstrings from the docstrings of the module that defines it.

    python docs/scripts/gen_api.py           # rewrite docs/api/
    python docs/scripts/gen_api.py --check   # exit 1 when a page is not what the code gives (tests/test_docs.py)

A name added to a package's ``__all__`` appears here at the next run; the test fails until the pages are
written again, so the reference never misses a public name.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from pathlib import Path

API = Path(__file__).resolve().parents[1] / "api"

# page -> (title, introduction, packages whose __all__ it documents, extra names as "module:Name")
PAGES: dict[str, tuple[str, str, list[str], list[str]]] = {
    "tandem": (
        "tandem",
        "The top-level package: what a first program imports (`import tandem`).",
        ["tandem"],
        ["tandem.utilities.seed:isolate_rng"],
    ),
    "trainer": (
        "tandem.trainer",
        'The Trainer, its state\'s enums (Lightning\'s), and the record of `on_nonfinite="rollback"`.',
        ["tandem.trainer"],
        [
            "tandem.trainer.state:TrainerFn",
            "tandem.trainer.state:RunningStage",
            "tandem.trainer.state:TrainerStatus",
        ],
    ),
    "callbacks": (
        "tandem.callbacks",
        "Every callback, with Lightning's names and arguments.",
        ["tandem.callbacks"],
        [],
    ),
    "loggers": ("tandem.loggers", "Where `self.log` values go.", ["tandem.loggers"], []),
    "strategies": (
        "tandem.strategies",
        "Strategies by class, precision and the plugins `Trainer(plugins=...)` takes.",
        ["tandem.strategies"],
        [],
    ),
    "environments": (
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
    "profilers": ("tandem.profilers", "`Trainer(profiler=...)`.", ["tandem.profilers"], []),
    "tuner": ("tandem.tuner", "The learning-rate and batch-size searches.", ["tandem.tuner"], []),
    "cli": ("tandem.cli", "The command line and YAML configs.", ["tandem.cli"], []),
    "utilities": (
        "tandem.utilities",
        "Rank-zero helpers, the model summary, and the exceptions and warnings tandem raises (see "
        "[Reliability](../reliability.md)).",
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
    ),
    "integrations": (
        "tandem.integrations",
        "Optional integrations; each imports its framework only when used.",
        [],
        ["tandem.integrations.ray:RayTrainReportCallback"],
    ),
}


def _section(package: str, name: str) -> str:
    value = getattr(importlib.import_module(package), name)
    if name == "__version__":
        return f"## `__version__`\n\n`{package}.__version__`: the installed version, a string.\n"
    where = getattr(value, "__module__", None) or ""
    if not where.startswith("tandem"):
        where = _defining_submodule(package, name, value) or where
    if where.startswith("tandem"):
        return f"## `{name}`\n\n::: {where}.{name}\n"
    # A name tandem re-exports from another package: say where it comes from.
    return f"## `{name}`\n\n`{package}.{name}` is `{where}.{name}`, as in Lightning.\n"


def _defining_submodule(package: str, name: str, value: object) -> str | None:
    """The submodule of ``package`` that assigns ``name`` (a type alias has no ``__module__`` of its own)."""
    path = getattr(importlib.import_module(package), "__path__", None)
    for info in pkgutil.iter_modules(path or []):
        module = importlib.import_module(f"{package}.{info.name}")
        if module.__dict__.get(name) is value and f"\n{name} = " in Path(module.__file__).read_text():
            return module.__name__
    return None


def render(page: str) -> str:
    title, intro, packages, extras = PAGES[page]
    parts = [
        f"# {title}\n",
        "<!-- Generated by docs/scripts/gen_api.py from the code; do not edit. -->\n",
        intro + "\n",
    ]
    for package in packages:
        for name in importlib.import_module(package).__all__:
            parts.append(_section(package, name))
    for extra in extras:
        module, name = extra.split(":")
        getattr(importlib.import_module(module), name)  # fails loudly when a documented name is gone
        parts.append(f"## `{name}`\n\n::: {module}.{name}\n")
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
