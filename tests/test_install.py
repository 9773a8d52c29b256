"""The built wheel is the whole of tandem: installed into a fresh virtual environment, outside the checkout and with
no PYTHONPATH, it runs ``examples/minimal.py`` and ships ``py.typed``, so a package, module or data file left out of
the wheel fails here rather than for a user. Cheap by design: the wheel is built without build isolation, and the
environment borrows this interpreter's installed dependencies (torch and the rest) through a ``.pth`` file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _unmet_build_requirement() -> str | None:
    """What this interpreter lacks of pyproject's ``[build-system] requires`` (the wheel is built with its own
    packages, no index needed), or None."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    section = (REPO / "pyproject.toml").read_text().split("[build-system]", 1)[1].split("\n[", 1)[0]
    for spec in re.findall(r'"([^"]+)"', section.split("requires", 1)[1].split("]", 1)[0]):
        requirement = Requirement(spec)
        try:
            installed = version(requirement.name)
        except PackageNotFoundError:
            return f"{requirement.name} is not installed"
        if not requirement.specifier.contains(installed, prereleases=True):
            return f"it has {requirement.name} {installed}, and the build needs {spec}"
    return None


def _run(args: list[str], cwd: Path, timeout: float = 120) -> str:
    """Run ``args`` in ``cwd`` with no PYTHONPATH (nothing of the checkout importable); its stdout, after exit 0."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} exited with {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_wheel_installed_in_a_fresh_environment_runs_the_minimal_example(tmp_path: Path) -> None:
    unmet = _unmet_build_requirement()
    if unmet:
        pytest.skip(f"builds the wheel from this interpreter's packages, but {unmet} (make setup's .venv has it)")
    # the wheel's sources, copied: a build writes build/ and tandem.egg-info beside them, and the checkout is left as
    # it is (other tests import from it meanwhile)
    source = tmp_path / "source"
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", *(p.name for p in REPO.glob("LICEN[CS]E*"))):
        shutil.copy(REPO / name, source / name)
    dist = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(source)],
        cwd=tmp_path,
    )
    (wheel,) = dist.glob("tandem-*.whl")

    # a fresh environment whose dependencies are this interpreter's (its site-packages, appended to sys.path after
    # the environment's own, where the wheel goes; the .pth files there, such as an editable tandem's, are not read)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    (site_packages,) = venv.glob("lib/python*/site-packages")
    borrowed = dict.fromkeys(sysconfig.get_paths()[kind] for kind in ("purelib", "platlib"))
    (site_packages / "borrowed_dependencies.pth").write_text("".join(f"{path}\n" for path in borrowed))
    # this interpreter's pip, run by the new environment's Python, installs into that environment; an installed
    # tandem that pip finds among the borrowed packages (this checkout's, editable) is ignored, not uninstalled
    _run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", str(wheel)],
        tmp_path,
    )

    user = tmp_path / "user"  # a user's folder: the example alone, far from the checkout
    user.mkdir()
    shutil.copy(REPO / "examples" / "minimal.py", user / "minimal.py")
    out = _run([str(python), "minimal.py"], cwd=user)
    match = re.search(r"test_loss=(\d+\.\d+)", out)
    assert match and float(match.group(1)) < 0.01, out  # it recovers y = 1*x0 + ... + 8*x7

    # the tandem that the example imported is the installed wheel's
    found = _run([str(python), "-c", "import importlib.util; print(importlib.util.find_spec('tandem').origin)"], user)
    installed = site_packages / "tandem"
    assert Path(found.strip()) == installed / "__init__.py", found
    assert (installed / "py.typed").is_file()  # PEP 561: type checkers read tandem's annotations
