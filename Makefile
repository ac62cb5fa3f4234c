# Two entry points: `make run` and `make test`. Both create .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# `make run` installs what `up` needs: the embedded broker and Postgres, and torch, which
# the local platform's jobs run with (the venv's torchrun; `make example`). `make test`
# adds the test tools and the simulator (`sim`: virtual envs, A/B runs, their report).
RUN_EXTRAS  := embedded,torch
TEST_EXTRAS := embedded,torch,dev,sim
STAMP      := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
# The suite's worker processes (pytest-xdist; a file's tests stay on one worker).
TEST_WORKERS ?= 2

.PHONY: run test test-deps kube-testenv lint typecheck unit schemas example clean

$(STAMP): pyproject.toml sdk/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./sdk -e '.[$(RUN_EXTRAS)]'
	touch $(STAMP)

$(TEST_STAMP): pyproject.toml sdk/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./sdk -e '.[$(TEST_EXTRAS)]'
	touch $(STAMP) $(TEST_STAMP)

## Start the embedded stack: broker, Postgres, env `prod`, and the services.
run: $(STAMP)
	$(BIN)/dlrover-events up

## Lint, type-check and run the whole suite against real parts.
test: lint typecheck test-deps kube-testenv
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

## The console's browser test drives Debian's Chromium (playwright-core comes from npm
## inside the test); the deploy/ tests render the manifests with kubectl (kustomize v5).
## The Kubernetes tests build their API server themselves (cached).
test-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	  else \
	    echo "make test needs Debian's chromium (sudo apt-get install chromium)"; exit 1; \
	  fi; }
	@command -v npm >/dev/null 2>&1 || { echo "make test needs node and npm"; exit 1; }
	@command -v kubectl >/dev/null 2>&1 || { \
	  echo "make test needs kubectl with kustomize v5 (kubectl 1.27+) to render deploy/"; exit 1; }

## A real kube-apiserver v1.20.2 + etcd for the operator tests, built once from Debian's
## kubernetes source package and cached in ~/.cache/dlrover-events (needs root or sudo).
kube-testenv:
	deploy/testenv/kube-testenv.sh build

## A small real torch training job reporting to the stack `make run` started.
example: $(STAMP)
	DLROVER_EVENTS_JOB_ID=$${DLROVER_EVENTS_JOB_ID:-mnist-1} $(BIN)/python examples/train_mnist_like.py --steps 3000

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(TEST_STAMP)
	$(BIN)/mypy

unit: $(TEST_STAMP)
	$(BIN)/pytest tests/unit tests/property

## Regenerate the JSON Schema files for non-Python producers.
schemas: $(TEST_STAMP)
	$(BIN)/dlrover-events schemas export
	$(BIN)/dlrover-events schemas settings-doc

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
