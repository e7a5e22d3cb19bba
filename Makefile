# Highwater developer entry points. Every target sets up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv run test lint protos protos-check bench bench-deps clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# The embedded server (a controller and a broker in one process) on 127.0.0.1:9092, data
# under .run/; it produces and consumes a few records, then serves until Ctrl-C.
RUN_DIR ?= .run
LISTEN ?= 127.0.0.1:9092
run: venv
	$(BIN)/highwater server --listen $(LISTEN) --data-dir $(RUN_DIR) --demo

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
	@command -v nats-server >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nats-server; }

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(RUN_DIR)
