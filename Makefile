# torch-X.Y.Z+um wheels: `make build`, `make test`. See README.md.
#
#   make build TORCH_VERSION=2.6.0 PYTHON=3.12   another version, another CPython
#   make test                                     lint + unit + integration tests
#   make test-unit                                without the real build (fast)

# Default: the newest version verified on a GPU host, as build_scripts/matrix.py decides
# (`python -m build_scripts versions --default`); evaluated once, when first used. .venv's
# Python computes it, so only recipes of targets that depend on $(STAMP) may use it: a use
# while the Makefiles are read runs before .venv exists on a fresh clone, and fixes the
# default at '' for the whole run (docker/docker.mk follows the same rule).
TORCH_VERSION ?= $(eval TORCH_VERSION := $(shell $(VPY) -m build_scripts versions --default))$(TORCH_VERSION)
# CPython version of the wheel to build (not the interpreter that runs the build).
PYTHON ?= 3.11
# Interpreter that creates .venv.
BOOTSTRAP_PYTHON ?= python3
PYTEST_ARGS ?=

VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: all build test test-unit lint venv series-check series-refresh clean distclean help

all: build

help:
	@sed -n '1,6p' Makefile

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(BOOTSTRAP_PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

build: $(STAMP)
	$(VPY) -m build_scripts build --torch-version='$(TORCH_VERSION)' --python='$(PYTHON)'

# Every Python file of the repository (mypy's narrower list is in pyproject.toml).
LINT_PATHS := bench build_scripts c10_overlay docker tests

lint: $(STAMP)
	$(VPY) -m ruff check $(LINT_PATHS)
	$(VPY) -m mypy

test: lint
	$(VPY) -m pytest $(PYTEST_ARGS)

test-unit: $(STAMP)
	$(VPY) -m pytest -m 'not integration' $(PYTEST_ARGS)

series-check: $(STAMP)
	$(VPY) -m build_scripts series check --torch-version='$(TORCH_VERSION)'

series-refresh: $(STAMP)
	$(VPY) -m build_scripts series refresh --torch-version='$(TORCH_VERSION)'

# Container targets (docker/README.md); they read TORCH_VERSION and PYTHON from above.
-include docker/docker.mk

clean:
	rm -rf dist build .pytest_cache .mypy_cache .ruff_cache

distclean: clean
	rm -rf $(VENV)
