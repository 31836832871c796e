# aieng: `make run` (demo end to end) and `make test` (the whole suite) do all set-up themselves.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin

export AIENG_HOME ?= $(CURDIR)/.aieng
export AIENG_CONFIG ?= configs/pipeline.yaml
export DAGSTER_HOME ?= $(AIENG_HOME)/dagster

DEMO_RANGE ?= 2026-01-01...2026-01-03
PYTEST_ARGS ?=

.PHONY: install system-deps run serve dev lint docs test bench lock clean-state

# torch first, pinned to the CPU build on local disk: a bare `torch` pulls a multi-GB CUDA build.
# constraints.txt pins every package to the versions the tests last passed with.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

$(DAGSTER_HOME)/dagster.yaml: configs/dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp configs/dagster.yaml $@

## run: set up, check the machine (aieng doctor), land demo data, materialize the whole graph (data, model, benchmark, bundle, gate), show what it made
run: install $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/aieng doctor
	$(BIN)/aieng demo-data --if-missing
	$(BIN)/dg launch --assets '*' --partition-range $(DEMO_RANGE) || { \
	  echo "make run: materializing the model and bundle once more (a model stopped by training.max_minutes resumes where it stopped; a partial model is never bundled)" >&2; \
	  $(BIN)/dg launch --assets 'model_checkpoint*'; }
	$(BIN)/aieng data status
	$(BIN)/aieng deploy status
	$(BIN)/aieng bundle current

## serve: serve production (following its pointer) on http://127.0.0.1:8000, else the current bundle (Ctrl-C stops it)
serve: install
	status="$$($(BIN)/aieng deploy status --json)" || exit 1; \
	if $(BIN)/python -c 'import json, sys; sys.exit(json.loads(sys.argv[1])["current"] is None)' "$$status"; then \
	  exec $(BIN)/aieng serve --deployment current; \
	else bundle="$$($(BIN)/aieng bundle current --path)" && exec $(BIN)/aieng serve --bundle "$$bundle"; fi

## dev: the Dagster UI on http://127.0.0.1:3000 (same AIENG_HOME and DAGSTER_HOME)
dev: export AIENG_DAGSTER_URL = http://127.0.0.1:3000
dev: install $(DAGSTER_HOME)/dagster.yaml
	@echo "make dev: for \`aieng deploy promote|rollback\` in another shell to tell this UI: export AIENG_DAGSTER_URL=$$AIENG_DAGSTER_URL" >&2
	$(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

# Debian packages some tests drive as real programs: a PostgreSQL server (the Postgres-backed
# Dagster instance), Prometheus, headless Chromium, HAProxy (the load balancer in front of two
# replicas) and Redis (the Celery executor's broker). Chromium renders text with fontconfig's
# fonts; fonts-dejavu-core is named so a screenshot never lacks one.
SYSTEM_PACKAGES := postgresql prometheus chromium fonts-dejavu-core haproxy redis-server

## system-deps: apt-get install those packages if one of their programs is missing (no apt at all when every one is there)
system-deps:
	@missing=""; \
	compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing="$$missing postgresql"; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v haproxy >/dev/null || missing="$$missing haproxy"; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo=sudo; else \
	  echo "make system-deps: missing$$missing; installing the Debian packages $(SYSTEM_PACKAGES) needs root or sudo: install them and run make again" >&2; exit 1; fi; \
	command -v apt-get >/dev/null || { \
	  echo "make system-deps: missing$$missing and no apt-get here: install the packages $(SYSTEM_PACKAGES) (Debian names) and run make again" >&2; exit 1; }; \
	echo "make system-deps: missing$$missing; apt-get install $(SYSTEM_PACKAGES)" >&2; \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(SYSTEM_PACKAGES)

## lint: formatting, lint rules (incl. the import boundaries) and types; `make test` runs it first
lint: install
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

## docs: check docs/reference/ is current, then build the site into site/ (MkDocs --strict: a broken link or anchor fails it)
docs: install
	$(BIN)/python scripts/docs_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

## test: set up (Debian packages included), lint, build the docs, and run the whole test suite
test: system-deps lint docs
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## bench: side-by-side benchmarks, JSON results in bench-results/
bench: install
	$(BIN)/aieng bench data --out bench-results/data.json
	$(BIN)/aieng bench model --out bench-results/model.json
	$(BIN)/aieng bench serving --out bench-results/serving.json
	$(BIN)/aieng bench prefix --out bench-results/prefix.json

## lock: re-pin constraints.txt to what the venv has now (after changing dependencies)
lock: install
	{ sed -n '1,2p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$$/torch==\1/'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

## clean-state: remove $(AIENG_HOME) (artifacts, landed data, Dagster runs)
clean-state:
	rm -rf $(AIENG_HOME)
