# Hotseat developer commands. Everything installs into .venv from the project's own files.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
MEMBERS := -e libs/common -e services/router -e services/pool-controller -e services/audit -e services/sim
PYPROJECTS := pyproject.toml $(wildcard libs/*/pyproject.toml services/*/pyproject.toml)
PYTEST_ARGS ?=

.PHONY: install system-deps llama run test test-fault fuzz soak check lint typecheck bench clean

$(BIN)/.installed: $(PYPROJECTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(MEMBERS) -e '.[dev]'
	touch $@

install: $(BIN)/.installed

## Debian packages some tests need (libfaketime); installs only what is missing.
system-deps:
	bash scripts/system_deps.sh

## Start the whole stack (NATS and Redis reused or launched, sim GPUs, router, controller, audit).
run: install
	$(BIN)/hotseat up $(if $(CONFIG),--config $(CONFIG))

## Test worker processes (pytest-xdist): one per logical CPU; TEST_WORKERS=0 runs the
## tests in pytest's own process. Each worker starts its own nats-server and redis-server.
TEST_WORKERS ?= logical
XDIST := -n $(TEST_WORKERS) --dist worksteal

## Run the test suite against real NATS, Redis and PostgreSQL.
test: install system-deps llama
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

## Only the fault-injection tests (tests/fault, marker fault); docs/reliability.md lists them.
test-fault: install system-deps
	$(BIN)/python -m pytest -m fault $(XDIST) $(PYTEST_ARGS)

## llama-server and the models the realserver tests run, cached under ~/.cache/hotseat: a
## check of under a second, or about 10 minutes of compiling on a fresh machine, with its
## progress shown here (test workers print nothing until their tests run). On failure the
## realserver tests say why (docs/llama.md).
llama: install
	-$(BIN)/python scripts/llama/prepare.py

## The router fuzz run (tests/security/test_fuzz.py) for FUZZ_SECONDS (default 30 minutes).
FUZZ_SECONDS ?= 1800
fuzz: install
	HOTSEAT_FUZZ_SECONDS=$(FUZZ_SECONDS) $(BIN)/python -m pytest tests/security/test_fuzz.py -s -p no:randomly $(PYTEST_ARGS)

## Chaos soak: a fleet under traffic while its processes are killed (SOAK_ARGS=--ci: 1 min).
soak: install
	$(BIN)/python bench/soak.py $(SOAK_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy libs/common/src services/*/src src

check: lint typecheck

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

.PHONY: deploy-check docs docs-reference

## Validate compose.yaml, the Dockerfile, the Kubernetes manifests and the dashboard offline.
deploy-check: install
	$(BIN)/python -m deploy.check

## Build the documentation site; broken links and missing pages fail the build.
docs: install
	$(BIN)/mkdocs build --strict --site-dir .hotseat/site

## Regenerate the metrics and audit-event references in docs/ from the code.
docs-reference: install
	$(BIN)/python -m tests.docs.reference

.PHONY: compose-test

## Build the image and run compose.yaml under a real Docker engine, then check it as a user
## would (docs/getting-started.md); starts a private dockerd when none answers.
compose-test: install
	$(BIN)/python -m deploy.compose_test $(COMPOSE_TEST_ARGS)
