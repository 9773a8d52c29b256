"""tandem is a typed package: it ships ``py.typed`` (PEP 561), and the typed user program that ``make test``
type-checks (``tests/typing/typed_program.py``) also runs."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import pytest

import tandem

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]


def test_py_typed_is_in_the_package_and_in_its_package_data():
    assert (Path(tandem.__file__).parent / "py.typed").is_file()  # editors read the installed package's
    # and a wheel carries it: the package data lists it (read as text: tomllib is Python 3.11's)
    pyproject = (ROOT / "pyproject.toml").read_text()
    package_data = pyproject.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^tandem = \[.*"py\.typed".*\]$', package_data, re.MULTILINE)


def test_the_typed_program_runs(tmp_path):
    # loaded by path: tests/ is on sys.path, where the folder's name "typing" would shadow the standard library's
    spec = importlib.util.spec_from_file_location("typed_program", ROOT / "tests" / "typing" / "typed_program.py")
    program = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = program  # dataclasses and pickling look their module up by name
    try:
        spec.loader.exec_module(program)
        measured = program.main(str(tmp_path), max_steps=2)
    finally:
        del sys.modules[spec.name]
    for name in ("Regressor", "ManualRegressor"):  # automatic, and manual through self.optimizers()
        assert measured[f"{name}/global_step"] == 2
        assert measured[f"{name}/train_batches"] == 2  # the callback's typed hook saw each batch's train_loss
        assert math.isfinite(measured[f"{name}/val_loss"])
        assert measured[f"{name}/last_val_loss"] == measured[f"{name}/val_loss"]  # callback_metrics, as validate's
