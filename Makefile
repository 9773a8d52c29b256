# A newcomer's two commands: `make demo` and `make test`. Both set up .venv first.
# TORCH_SPEC picks the torch build; the default is the pinned CPU wheel. On a GPU machine:
#   make test TORCH_SPEC="torch==2.13.0" PIP_TORCH_ARGS="--index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
PIP_TORCH_ARGS ?=
# make test runs the suite on TEST_WORKERS pytest-xdist workers (whole files each): the cores + 1, as many tests
# wait on processes they launched; `make test TEST_WORKERS=0` runs it in one process.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(8, (os.cpu_count() or 1) + 1))")
PYTEST_ARGS ?=

.PHONY: setup demo test lint bench gpu-check clean docs docs-serve

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# Install the pinned torch first: an unpinned torch pulled in by a dependency would fetch CUDA builds (torchft, in
	# the test extra, needs torch>=2.7: an older torch is replaced by the pinned one here, not by pip's resolver).
	$(PY) -c "import torch, sys; sys.exit(0 if tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]) >= (2, 7) else 1)" 2>/dev/null \
		|| $(PY) -m pip install -q $(PIP_TORCH_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,examples]"
	touch $@

setup: $(VENV)/.installed

# digits.py ends by printing its run folder and the command to watch it (.venv's tensorboard, named by its path)
demo: setup
	$(PY) examples/digits.py --root-dir runs/digits

test: setup
	$(PY) -m ruff check src tests examples benchmarks
	$(PY) -m ruff format --check src tests benchmarks
	# the type check of tandem and of a typed user program (tests/typing/); settings in pyproject.toml
	$(PY) -m mypy
	# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set: the suite starts hundreds of Pythons, and each
	# would otherwise compile tandem's sources again.
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check src tests examples benchmarks
	$(PY) -m ruff format --check src tests benchmarks
	$(PY) -m mypy

bench: setup
	$(PY) benchmarks/run_all.py

# A GPU session's one command (benchmarks/gpu_check.py): the suite with CUDA visible (JUnit XML, in parallel), the
# host syncs of every precision, gpu.py and fsdp_gpu.py against their raw loops; all results in GPU_CHECK_OUT.
# It uses the machine's python when there is no .venv, and installs nothing. On a CPU: GPU_CHECK_ARGS=--dry-run.
GPU_CHECK_OUT ?= gpu-check-results
GPU_CHECK_ARGS ?=
GPU_CHECK_PY ?= $(if $(wildcard $(PY)),$(PY),$(PYTHON))

gpu-check:
	$(GPU_CHECK_PY) benchmarks/gpu_check.py --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

# The docs site (docs/, mkdocs.yml) into site/: --strict fails on a broken link, anchor or API reference; then the
# README's links and the API pages' signatures are checked on the built site.
# The docs extra is installed here only; make test runs the docs' code blocks without mkdocs (tests/test_docs.py).
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q -e ".[docs]"
	touch $@

docs: $(VENV)/.docs-installed
	$(PY) docs/scripts/gen_api.py --check
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
	$(PY) docs/scripts/check_site_links.py
	$(PY) docs/scripts/check_api_signatures.py

docs-serve: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve

clean:
	rm -rf $(VENV) runs build site *.egg-info src/*.egg-info .pytest_cache
