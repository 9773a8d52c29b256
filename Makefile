# A newcomer's two commands: `make demo` and `make test`. Both set up .venv first.
# TORCH_SPEC picks the torch build; the default is the pinned CPU wheel. On a GPU machine:
#   make test TORCH_SPEC="torch==2.13.0" PIP_TORCH_ARGS="--index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
PIP_TORCH_ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup demo test lint bench clean

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# Install the pinned torch first: an unpinned torch pulled in by a dependency would fetch CUDA builds.
	$(PY) -c "import torch, sys; sys.exit(0 if tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]) >= (2, 4) else 1)" 2>/dev/null \
		|| $(PY) -m pip install -q $(PIP_TORCH_ARGS) "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,examples]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) examples/digits.py --root-dir runs/digits
	@echo ""
	@echo "Runs are in runs/digits/tandem_logs/version_<n>; watch them with:"
	@echo "  $(VENV)/bin/tensorboard --logdir runs/digits"

test: setup
	$(PY) -m ruff check src tests examples benchmarks
	$(PY) -m ruff format --check src tests benchmarks
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check src tests examples benchmarks
	$(PY) -m ruff format --check src tests benchmarks

bench: setup
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs build *.egg-info src/*.egg-info .pytest_cache
