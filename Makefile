# make demo — set up everything, start a dev server, run one real offline agent run and a two-message session.
# make test — set up everything, run lint, type check and every test.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Test processes (pytest-xdist, one test file per process at a time). Most tests wait on servers, timers
# and subprocesses, so three processes keep 2 cores busy: the suite takes under half its serial time.
TEST_WORKERS ?= 3

.PHONY: demo test server stop bwrap chromium venv bytecode lint bench clean mcp-servers cluster cluster-stop deploy-check docs docs-serve docs-gen

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# The project's bytecode, written once. With PYTHONDONTWRITEBYTECODE=1 (set on this machine and in many
# CI images) no process writes it, so every worker, CLI call and fake server a test starts would compile
# the project from source first: ~0.2 s of CPU each, a few hundred times per `make test`.
bytecode: venv
	@$(PY) -m compileall -q -j 0 -x '/\.' activities workflows durable_agents bench examples scripts tests starter.py worker.py >/dev/null

# The sandbox needs bubblewrap; install it when we can (root + apt), otherwise say how.
bwrap:
	@if ! command -v bwrap >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing bubblewrap"; apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; \
	  else \
	    echo "bubblewrap (bwrap) is missing: install it with 'sudo apt-get install bubblewrap'"; exit 1; \
	  fi; \
	fi

# The approval inbox's browser test drives Debian's chromium through chromium-driver (selenium).
chromium:
	@if ! command -v chromedriver >/dev/null || ! { command -v chromium >/dev/null || command -v chromium-browser >/dev/null; }; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium and chromium-driver"; apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else \
	    echo "chromium or chromium-driver is missing: install them with 'sudo apt-get install chromium chromium-driver'"; exit 1; \
	  fi; \
	fi

server: venv
	@$(PY) scripts/devserver.py start

stop: venv
	@$(PY) scripts/devserver.py stop

# A local cluster: Temporal dev server, PostgreSQL run store, N workers (make cluster WORKERS=5); see README.
cluster: venv bwrap
	@$(PY) -m scripts.cluster start --workers $(or $(WORKERS),3)

cluster-stop: venv
	@$(PY) -m scripts.cluster stop

demo: venv bytecode bwrap server
	@$(PY) scripts/demo.py

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

# Third-party MCP servers the MCP tests run against (pinned; installed once into .agent/npm).
EVERYTHING_VERSION := 2026.8.31
EVERYTHING_STAMP := .agent/npm/.everything-$(EVERYTHING_VERSION).stamp

mcp-servers:
	@if ! command -v npm >/dev/null; then \
	  echo "npm is missing: MCP tests that need @modelcontextprotocol/server-everything will be skipped (install node + npm, then run 'make mcp-servers')"; \
	elif [ ! -f $(EVERYTHING_STAMP) ]; then \
	  mkdir -p .agent/npm && \
	  echo "npm install --no-audit --no-fund --prefix .agent/npm @modelcontextprotocol/server-everything@$(EVERYTHING_VERSION)" && \
	  npm install --no-audit --no-fund --prefix .agent/npm @modelcontextprotocol/server-everything@$(EVERYTHING_VERSION) && \
	  touch $(EVERYTHING_STAMP); \
	fi

# Offline validation of deploy/ (Kubernetes and compose-spec JSON schemas; under 2 s).
deploy-check: venv
	BIN=$(VENV)/bin deploy/check.sh

# The docs site (MkDocs + Material) into site/; tests/test_docs.py runs the same strict build in `make test`.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# Regenerate docs/reference/configuration.md (from Settings) and contract.md (from workflows/types.py).
docs-gen: venv
	$(PY) -m scripts.gen_docs

test: venv bytecode bwrap chromium mcp-servers lint deploy-check
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25

# Each writes bench/results/<name>.json. A bench that misses its target exits 1: `make -k bench` runs them all.
bench: venv bytecode bwrap mcp-servers
	$(PY) -m bench.history_size --turns 200 --kb 10
	$(PY) -m bench.sandbox_latency --n 50
	$(PY) -m bench.kill_storm --runs 100 --kills 12
	$(PY) -m bench.checkpoints --files 50 --file-mb 1 --steps 100 --change-kb 10
	$(PY) -m bench.checkpoint_budget --steps 100 --change-kb 10 --rewrite-steps 6 --rewrite-mb 60 --run-max-mb 400
	$(PY) -m bench.scale overhead --turns 10 50 200
	$(PY) -m bench.scale throughput --runs 100 --turns 10 --workers 3 --rounds 3
	$(PY) -m bench.scale durable-bytes --turns 200 --kb 10
	$(PY) -m bench.scale waiting --runs 10000 --approvals 500
	$(PY) -m bench.scale sessions-idle --sessions 10000 --sends 500
	$(PY) -m bench.cluster_storm --runs 100 --workers 3 --kills 12 --pg-down 20
	$(PY) -m bench.encryption --turns 20 --kb 10 --repeat 15
	$(PY) -m bench.regex_isolation --repeat 7
	$(PY) -m bench.codec_latency --samples 50
	$(PY) -m bench.cli_tools --repeat 7
	$(PY) -m bench.sse_fanout --clients 200 --turns 20
	$(PY) -m bench.memory_search --entries 100000 --queries 200

clean: stop
	rm -rf .agent .temporal
