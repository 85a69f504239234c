# loraplex: `make up` runs the platform locally, `make test` runs the whole test suite.
# Both create .venv and install on first use (again only when pyproject.toml/setup.py change).

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.loraplex-installed
# The CPU build on disk; installed first so nothing later pulls a CUDA torch.
TORCH_SPEC ?= torch==2.13.0
PIP := $(BIN)/python -m pip
# -qq: errors only (this machine's pip config warns about every missing local index entry).
PIP_FLAGS ?= -qq --progress-bar off --disable-pip-version-check

ARGS ?=
PYTEST_ARGS ?=

.PHONY: venv install up test lint format clean

venv install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml setup.py
	@echo "installing $(TORCH_SPEC) (CPU build) into $(VENV)"
	$(PIP) install $(PIP_FLAGS) "$(TORCH_SPEC)"
	@echo "installing loraplex and its extras (embedded, test, dev)"
	$(PIP) install $(PIP_FLAGS) -e '.[embedded,test,dev]'
	@touch $@

up: $(STAMP)
	$(BIN)/loraplex up $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
