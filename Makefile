PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit chaos bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/hango-worker demo

lint: $(STAMP)
	$(BIN)/ruff check hango_worker tests bench
	$(BIN)/ruff format --check hango_worker tests bench

typecheck: $(STAMP)
	$(BIN)/mypy hango_worker

unit: $(STAMP)
	$(BIN)/python -m pytest -q -x -p no:cacheprovider

test: lint typecheck unit

chaos: $(STAMP)
	$(BIN)/python -m hango_worker.testing.chaos

clean:
	rm -rf $(VENV) .hango build dist *.egg-info
