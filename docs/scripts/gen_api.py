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


# A class split by job into base classes, as Lightning's ``LightningModule(ModelHooks, DataHooks, CheckpointHooks)``:
# its section shows the members of these bases as its own, with the same ids as when its body held them
# (``tandem.TrainingModule.optimizers``), after the members its body defines. mkdocstrings shows a class's own
# members only; the section names them all (``members``, in this order) and the bases' (``inherited_members``).
PARTS: dict[str, Sequence[str]] = {
    "tandem.TrainingModule": [
        "tandem.module.optimization:OptimizationMixin",
        "tandem.module.logging:LoggingMixin",
        "tandem.module.hooks:ModelHooks",
        "tandem.module.hooks:CheckpointHooks",
    ],
    **{
        trainer: [
            "tandem.trainer.run:TrainerRun",
            "tandem.trainer.services:TrainerServices",
            "tandem.trainer.properties:TrainerProperties",
        ]
        for trainer in ("tandem.Trainer", "tandem.trainer.Trainer")
    },
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
    if where.startswith("tandem"):
        return _directive(f"{package}.{name}", value)
    # A name tandem re-exports from another package (mkdocs.yml preloads it): its own docs, and where it comes from.
    return f"::: {package}.{name}\n\n`{package}.{name}` is `{where}.{name}`, as in Lightning.\n"


def _directive(identifier: str, value: object) -> str:
    """The ``:::`` block of one object; a class of ``PARTS`` lists its members and its parts' (see ``PARTS``)."""
    if identifier not in PARTS:
        return f"::: {identifier}\n"
    assert isinstance(value, type)
    inherited: list[str] = []
    for part in PARTS[identifier]:
        module, name = part.split(":")
        base = getattr(importlib.import_module(module), name)
        if base not in value.__mro__:
            raise SystemExit(
                f"PARTS[{identifier!r}] names {part}, which is not a base class of {identifier}; expected the classes "
                f"its members were split into: remove {part} from PARTS, or make it a base of {identifier}"
            )
        inherited += _shown_members(base)
    lines = [f"::: {identifier}", "    options:", "      members:"]
    lines += [f"        - {member}" for member in [*_shown_members(value), *inherited]]
    lines += ["      inherited_members:", *(f"        - {member}" for member in inherited)]
    return "\n".join(lines) + "\n"


def _shown_members(cls: type) -> list[str]:
    """The members mkdocstrings shows of a class body (mkdocs.yml: public, with a docstring), in source order: its
    functions, properties and the descriptors that wrap a function (``class_only``); a plain value has no docstring
    it could read."""
    shown = []
    for name, value in vars(cls).items():
        function = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
        if not name.startswith("_") and inspect.isfunction(function) and function.__doc__:
            shown.append(name)
    return shown


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
        value = getattr(importlib.import_module(module), name)  # fails loudly when a documented name is gone
        found[name] = _directive(f"{module}.{name}", value)
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
