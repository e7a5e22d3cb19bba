# Highwater developer entry points. Every target sets up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv test lint protos protos-check bench bench-deps clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

test: venv protos-check
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check services tests bench scripts
	$(BIN)/ruff format --check services tests bench scripts
	$(BIN)/mypy

protos: venv
	$(BIN)/python scripts/gen_protos.py

protos-check: venv
	$(BIN)/python scripts/gen_protos.py --check

bench: venv bench-deps
	$(BIN)/python -m bench

# The peers the benchmarks measure beside Highwater, from Debian's packages.
bench-deps:
	@command -v etcd >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq etcd-server etcd-client; }

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
