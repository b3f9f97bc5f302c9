# make demo — set up everything, start a dev server, run one real offline agent run.
# make test — set up everything, run lint, type check and every test.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test server stop bwrap venv lint bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# The sandbox needs bubblewrap; install it when we can (root + apt), otherwise say how.
bwrap:
	@if ! command -v bwrap >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing bubblewrap"; apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; \
	  else \
	    echo "bubblewrap (bwrap) is missing: install it with 'sudo apt-get install bubblewrap'"; exit 1; \
	  fi; \
	fi

server: venv
	@$(PY) scripts/devserver.py start

stop: venv
	@$(PY) scripts/devserver.py stop

demo: venv bwrap server
	@$(PY) scripts/demo.py

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

test: venv bwrap lint
	$(VENV)/bin/pytest

bench: venv bwrap
	$(PY) -m bench.history_size --turns 200 --kb 10
	$(PY) -m bench.sandbox_latency --n 50
	$(PY) -m bench.kill_storm --runs 100 --kills 12

clean: stop
	rm -rf .agent .temporal
