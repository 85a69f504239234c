# loraplex: `make up` runs the platform locally, `make test` runs the whole test suite.
# Both create .venv and install on first use (again only when pyproject.toml/setup.py change).

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.loraplex-installed
# checkov (infra/ policy checks) lives in its own venv: its pins conflict with the project's.
CHECKOV_VENV ?= .venv-checkov
CHECKOV_SPEC ?= checkov==3.3.30
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed
# The AWQ / GPTQ test oracles' packers (tests/support/awq_gptq_checkpoints.py): --no-deps, since
# their declared deps pull datasets/pandas/pyarrow (calibration) that the packers never use, and
# autoawq's install_requires name torch; installed after the project, so torch stays the CPU build.
QUANT_ORACLES_SPEC ?= autoawq==0.2.9 auto-gptq==0.7.1
QUANT_ORACLES_STAMP := $(VENV)/.quant-oracles-installed
# The CPU build on disk; installed first so nothing later pulls a CUDA torch.
TORCH_SPEC ?= torch==2.13.0
PIP := $(BIN)/python -m pip
# -qq: errors only (this machine's pip config warns about every missing local index entry).
PIP_FLAGS ?= -qq --progress-bar off --disable-pip-version-check

# mypy over the package ([tool.mypy] in pyproject.toml); run from the root, where `loraplex/`
# links the parts.
MYPY = $(BIN)/mypy -p loraplex.platform -p loraplex.adapters -p loraplex.moe -p loraplex.loader -p loraplex.api \
	-p loraplex.bench -p loraplex.infra

ARGS ?=
PYTEST_ARGS ?=

.PHONY: venv install up test lint typecheck format clean

venv install: $(STAMP) $(QUANT_ORACLES_STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml setup.py
	@echo "installing $(TORCH_SPEC) (CPU build) into $(VENV)"
	$(PIP) install $(PIP_FLAGS) "$(TORCH_SPEC)"
	@echo "installing loraplex and its extras (embedded, test, dev, infra, kubernetes)"
	$(PIP) install $(PIP_FLAGS) -e '.[embedded,test,dev,infra,kubernetes]'
	@touch $@

$(QUANT_ORACLES_STAMP): $(STAMP)
	@echo "installing $(QUANT_ORACLES_SPEC) with --no-deps (AWQ/GPTQ test oracles)"
	$(PIP) install $(PIP_FLAGS) --no-deps $(QUANT_ORACLES_SPEC)
	@touch $@

$(CHECKOV_STAMP):
	@echo "installing $(CHECKOV_SPEC) into $(CHECKOV_VENV) (infra policy checks)"
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install $(PIP_FLAGS) "$(CHECKOV_SPEC)"
	@touch $@

up: $(STAMP)
	$(BIN)/loraplex up $(ARGS)

# The type checker first (a minute), then the suite.
test: $(STAMP) $(QUANT_ORACLES_STAMP) $(CHECKOV_STAMP)
	$(MYPY)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# mypy over the package ([tool.mypy] in pyproject.toml: the parts, the third-party modules
# without types); exits non-zero on any error. Run from the root: `loraplex/` links the parts.
typecheck: $(STAMP)
	$(MYPY)

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) build *.egg-info .pytest_cache .ruff_cache .mypy_cache
