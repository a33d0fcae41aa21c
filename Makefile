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
	$(BIN)/ruff check hango_worker tests $(wildcard bench)
	$(BIN)/ruff format --check hango_worker tests $(wildcard bench)

typecheck: $(STAMP)
	$(BIN)/mypy hango_worker

unit: $(STAMP)
	$(BIN)/python -m pytest -q -x -p no:cacheprovider

test: lint typecheck unit

chaos: $(STAMP)
	$(BIN)/python -m hango_worker.testing.chaos

# Benchmarks side by side with LangChain and pgqueuer (docs/benchmarks.md), in their
# own environment: the `bench` extra never enters the product's .venv.
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP): pyproject.toml
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install -q -e '.[bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python -m bench.run $(BENCH_ARGS)
	$(BENCH_VENV)/bin/python -m bench.report

# Mutation testing of agent/ and run/ (docs/mutation-testing.md): slow, so not part
# of `make test`. MUTATE_JOBS mutants at once; MUTATE picks the profiles.
MUTATE_JOBS ?= 2
MUTATE ?= agent run
.PHONY: mutate
mutate: $(STAMP)
	$(BIN)/python -m tests.mutation --jobs $(MUTATE_JOBS) $(MUTATE)

clean:
	rm -rf $(VENV) .hango build dist *.egg-info
