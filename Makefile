# agentsessions for Python. `make run` serves the host on the embedded defaults; `make test` runs the suite.
PYTHON ?= python3
# Test processes (pytest-xdist); "auto" = one per core. TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= auto
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROTOS := $(wildcard proto/agentsessions/v1/*.proto) $(wildcard proto/agentsessions/ext/v1/*.proto)
GEN_DIR := sdk/src

.PHONY: run demo test lint proto proto-check bench setup node-client clean

$(STAMP): requirements-dev.txt sdk/pyproject.toml host/pyproject.toml harnesses/pyproject.toml
	@scripts/setup-venv.sh $(PYTHON) $(VENV)
	@touch $(STAMP)

# The Node.js client (clients/node) is installed from its lockfile only where node and npm are on
# PATH, so a machine without Node still sets up; `make node-client` installs it explicitly.
NODE_DIR := clients/node
NODE_STAMP := $(NODE_DIR)/node_modules/.installed
HAVE_NODE := $(shell command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 && echo yes)

$(NODE_STAMP): $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json
	@echo "installing the Node.js client ($(NODE_DIR))..."
	@npm ci --prefix $(NODE_DIR) --no-audit --no-fund --loglevel=error >$(NODE_DIR)/.npm-install.log 2>&1 \
	  || { cat $(NODE_DIR)/.npm-install.log >&2; exit 1; }
	@touch $(NODE_STAMP)

node-client: $(NODE_STAMP)

setup: $(STAMP) $(if $(HAVE_NODE),node-client)

# Serves on 127.0.0.1:50051 with a SQLite journal in ./agentsessions.db; Ctrl-C drains and stops.
# Extra flags: make run RUN_ARGS="--listen 127.0.0.1:6000 --log-format json"
run: $(STAMP)
	$(VENV)/bin/agentsessions serve $(RUN_ARGS)

demo: $(STAMP)
	$(PY) -m agentsessions.host.demo $(DEMO_ARGS)

# Everything the tests use is installed first, the Node.js client included where node and npm exist.
test: setup
	$(PY) -m pytest -q -rs -n $(TEST_WORKERS) $(PYTEST_ARGS)

proto: $(STAMP)
	rm -f $(GEN_DIR)/agentsessions/v1/*_pb2*.py $(GEN_DIR)/agentsessions/v1/*_pb2*.pyi
	rm -f $(GEN_DIR)/agentsessions/ext/v1/*_pb2*.py $(GEN_DIR)/agentsessions/ext/v1/*_pb2*.pyi
	$(PY) -m grpc_tools.protoc -Iproto \
	  --python_out=$(GEN_DIR) --grpc_python_out=$(GEN_DIR) \
	  --plugin=protoc-gen-mypy=$(VENV)/bin/protoc-gen-mypy --plugin=protoc-gen-mypy_grpc=$(VENV)/bin/protoc-gen-mypy_grpc \
	  --mypy_out=$(GEN_DIR) --mypy_grpc_out=$(GEN_DIR) $(PROTOS)

# Fails when the committed generated code differs from what the protos generate.
proto-check: proto
	git diff --exit-code -- $(GEN_DIR)/agentsessions/v1 $(GEN_DIR)/agentsessions/ext/v1

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/buf lint
	$(VENV)/bin/buf breaking --against contract/agentsessions-v1.binpb

# The LangGraph comparison needs bench/requirements.txt; without it that one comparison is skipped.
# BENCH_ARGS=--long adds the 10,000-turn flatness run (a few minutes more).
bench: $(STAMP)
	$(PY) -m pip install -q -r bench/requirements.txt || echo "bench: LangGraph extras not installed"
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist
