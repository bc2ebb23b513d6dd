# The targets people look for; CI (.ci/run) calls the same ones.
#
#   make dev        whole fleet + API on this machine (embedded broker/Redis/Postgres)
#   make test       unit, then integration, then end-to-end tests (in parallel)
#   make lint       ruff check + ruff format --check + lint-imports (layers, no cycles)
#   make typecheck  mypy --strict
#   make bench      end-to-end, policy-push, revocation-push and isolation benchmarks
#   make schemas    regenerate schemas/ from the pydantic models
#   make docs       the docs site (mkdocs build --strict into build/site)
#   make clean      caches and build output (keeps .venv and .toolfleet)
#
# The first target that needs it creates .venv with $(PYTHON) and installs the project
# (editable, with the dev extras, Playwright included); it reinstalls only when
# pyproject.toml changed. The console's browser test runs Debian's /usr/bin/chromium,
# never `playwright install`: `make test` installs it with apt when missing (as root).

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.toolfleet-installed
PYTEST_ARGS ?= --durations=15
TEST_LAYERS := unit integration e2e
# Each layer runs on pytest-xdist workers, one test file per worker at a time (a module's
# fixtures stay in one process); a worker is a test session of its own, with its own
# broker, Postgres database and Redis database. Unit tests are CPU-bound: a worker per
# core. Integration and end-to-end tests mostly wait on the broker and the fleet's
# processes, so they run more workers than cores. TEST_WORKERS=0 runs each layer in
# one process: `make test TEST_WORKERS=0`.
TEST_WORKERS ?=
UNIT_WORKERS := $(or $(TEST_WORKERS),logical)
FLEET_WORKERS := $(or $(TEST_WORKERS),4)

.DEFAULT_GOAL := help
.PHONY: help venv browser dev test lint typecheck bench schemas docs clean

help:
	@sed -n 's/^#   make /  make /p' $(firstword $(MAKEFILE_LIST))

$(BIN)/python:
	@test -n "$(PYTHON)" || { echo "need python3.11 (or python3 >= 3.11) on PATH"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  || { echo "$(PYTHON) is older than 3.11; run: make PYTHON=/path/to/python3.11 ..."; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

venv: $(STAMP)

dev: $(STAMP)
	exec $(BIN)/toolfleet dev

# Debian's chromium for the console's browser test (it never skips).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium (the console's browser test)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "chromium is missing; as root: apt-get install -y chromium" >&2; exit 1; \
	  fi; }

# One pytest run per layer, in order; stop at the first failing layer. Exit code 5
# (nothing collected) fails too: an empty layer means tests were lost.
test: $(STAMP) browser
	@for layer in $(TEST_LAYERS); do \
	  echo "==> $$layer tests"; \
	  workers=$(FLEET_WORKERS); [ $$layer = unit ] && workers=$(UNIT_WORKERS); \
	  rc=0; $(BIN)/python -m pytest tests/$$layer -n $$workers --dist loadfile $(PYTEST_ARGS) || rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no $$layer tests were collected"; exit 1; fi; \
	  if [ $$rc -ne 0 ]; then exit $$rc; fi; \
	done

# Python sources only: README snippets are laid out for reading, not by the formatter.
lint: $(STAMP)
	$(BIN)/ruff check services tests bench
	$(BIN)/ruff format --check services tests bench
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/e2e_bench.py
	$(BIN)/python bench/policy_push_bench.py
	$(BIN)/python bench/revocation_push_bench.py
	$(BIN)/python bench/isolation_bench.py
	$(BIN)/python bench/search_bench.py

schemas: $(STAMP)
	$(BIN)/python -m toolfleet.cli.schemas schemas

# A broken link or anchor fails the build (tests/unit/test_docs_site.py builds it too).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf build dist .mypy_cache .ruff_cache .pytest_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name '__pycache__' -type d -exec rm -rf {} +
	find . -path ./$(VENV) -prune -o -name '*.egg-info' -type d -exec rm -rf {} +
