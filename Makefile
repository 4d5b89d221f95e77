# Set-up is two commands: `make demo` and `make test`. Each creates .venv when it
# is missing, installs the project with its extras, checks for Java, then runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-pythons lint typecheck pytest bench system-deps clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark]'
	@touch $(STAMP)

# Spark needs Java 17, the JDBC sinks Debian's SQLite and PostgreSQL jars, and the
# PostgreSQL sink tests Debian's postgresql server: install them when missing.
system-deps:
	@bash scripts/system-deps.sh

DEMO_DIR ?= demo-out

demo: $(STAMP) system-deps
	$(BIN)/tickwheel trace
	$(BIN)/tickwheel pipeline generate --orders 100000 --seed 1 --out $(DEMO_DIR)/orders
	$(BIN)/tickwheel pipeline run --rules examples/orders.toml --input $(DEMO_DIR)/orders --output $(DEMO_DIR)/result
	$(BIN)/tickwheel pipeline report $(DEMO_DIR)/result
	@echo "outputs: $(DEMO_DIR)/result/{outcomes,unmatched,rejected,buffered}/ and $(DEMO_DIR)/result/summary.json"

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy --strict src

pytest: $(STAMP) system-deps
	$(BIN)/python -m pytest

test: lint typecheck pytest

# The library's tests on each newer CPython found (3.12+); see the script.
test-pythons:
	@bash scripts/test-pythons.sh

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_timer.py
	$(BIN)/python benchmarks/bench_purgatory.py
	$(BIN)/python benchmarks/bench_aio.py

clean:
	rm -rf $(VENV) .venvs build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
