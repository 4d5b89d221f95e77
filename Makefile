# Set-up is two commands: `make demo` and `make test`. Each creates .venv when it
# is missing, installs the project with its extras, checks for Java, then runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test check test-pythons lint typecheck class-archive pytest pytest-pure pytest-spark bench bench-floors bench-env-pyflink system-deps clean

# The install builds the compiled core (src/tickwheel/_speedups.pyx, which includes
# one twin per pure module from src/tickwheel/_twins/, and src/tickwheel/pipeline/_loop.pyx)
# with Cython, and falls back to pure Python, saying so, when there is no C compiler.
CYTHON_SOURCES := $(wildcard src/tickwheel/*.pyx src/tickwheel/*.pxd src/tickwheel/_twins/*.px[di] \
		src/tickwheel/pipeline/*.pyx)
$(STAMP): pyproject.toml setup.py $(CYTHON_SOURCES)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# The extras' packages (scripts/requirements.py reads them from pyproject.toml) install
	@# while the compiled core builds: one core each, rather than one after the other.
	$(BIN)/python scripts/requirements.py dev spark > $(VENV)/requirements.txt
	$(BIN)/python -m pip install --quiet -r $(VENV)/requirements.txt & packages=$$!; \
		$(BIN)/python -m pip install --quiet --no-deps -e .; built=$$?; \
		wait $$packages && test $$built = 0
	@# Bytecode for the editable tree, as pip writes it for an installed package: where
	@# PYTHONDONTWRITEBYTECODE is set, each process (every Spark worker among them)
	@# would otherwise compile the modules it imports, every time.
	$(BIN)/python -m compileall -q src tests benchmarks examples > /dev/null
	@touch $(STAMP)

# Spark needs Java 17, the JDBC sinks Debian's SQLite and PostgreSQL jars, and the
# PostgreSQL sink tests Debian's postgresql server: install them when missing.
system-deps:
	@bash scripts/system-deps.sh

DEMO_DIR ?= demo-out

# `pipeline prepare` archives the JVM's classes once (~180 MB in ~/.cache/tickwheel), so
# that the JVM starts sooner; it does nothing when the archive is there. The
# archive is only a speed-up: if it cannot be made (no disk space, say), the demo goes on.
demo: $(STAMP) system-deps
	$(BIN)/tickwheel trace
	-$(BIN)/tickwheel pipeline prepare
	$(BIN)/tickwheel pipeline generate --orders 100000 --seed 1 --out $(DEMO_DIR)/orders
	$(BIN)/tickwheel pipeline run --rules examples/orders.toml --input $(DEMO_DIR)/orders --output $(DEMO_DIR)/result
	$(BIN)/tickwheel pipeline report $(DEMO_DIR)/result
	@echo "outputs: $(DEMO_DIR)/result/{outcomes,unmatched,rejected,buffered}/ and $(DEMO_DIR)/result/summary.json"

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck: $(STAMP)
	$(BIN)/mypy --strict src

# The whole suite on the compiled core (with the benchmarks' compiled floors, which
# the benchmark tests run), then the pipeline tests marked `connect` again on Spark
# Connect sessions (PySpark's functions follow one session kind per process, so they
# run in processes of their own: tests/pipeline/conftest.py; run beside the compiled
# pass, the two took longer than one after the other, as both keep the two cores
# busy); and the library's suite (all but the Spark tests) on the
# pure-Python path. The packaging test builds from source whichever path runs, so it
# runs once. TICKWHEEL_NO_EXTENSIONS=1 runs only the pure path, for a machine without
# a C compiler.
#
# The tests run in PYTEST_WORKERS processes (pytest-xdist; each Spark one has its own
# local[2] session): most of the Spark tests' time is spent starting child JVMs, which
# two workers overlap on two cores.
# A worker that runs out of tests takes some from the other's queue (worksteal): with
# xdist's default hand-out, one worker held the slow stream tests for the last minutes
# while the other core idled; with worksteal both stay busy.
PYTEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal

pytest: pytest-pure pytest-spark

pytest-pure: $(STAMP)
	TICKWHEEL_NO_EXTENSIONS=1 $(PYTEST) tests --ignore=tests/pipeline --ignore=tests/test_packaging.py

pytest-spark: $(STAMP) system-deps
ifeq ($(TICKWHEEL_NO_EXTENSIONS),)
	@$(BIN)/python -c 'import sys, tickwheel; sys.exit(0 if tickwheel.COMPILED else "make test: the compiled core was not built; see the install output, or set TICKWHEEL_NO_EXTENSIONS=1 to test the pure path only")'
	$(BIN)/python benchmarks/setup_floors.py
	$(PYTEST)
	TICKWHEEL_TEST_SESSION=connect $(PYTEST) -m connect tests/pipeline
endif

# The JVM's class archive (`pipeline prepare`, which `make demo` runs too) is recorded
# beside the library's pure-path suite, the lint, the type check and the benchmarks'
# compiled floors (which `pytest-spark` then finds built): the suite's JVMs on a local
# master then start sooner, each of them (docs/benchmarks.md, "Cold start"). Like the
# demo, the suite goes on without it if it cannot be made.
test: $(STAMP) system-deps
	@$(MAKE) --no-print-directory -j2 --output-sync=target class-archive pytest-pure lint \
		typecheck bench-floors
	@$(MAKE) --no-print-directory pytest-spark

# The inner loop, between edits: the lint and the type check beside each other, then
# the tests that start no JVM in a child process (marker `jvm_process`: a command-line
# job, a Connect server, a cluster) on the compiled core; each worker's in-process Spark
# session is the one JVM it starts; the placements' model-based test runs three of its
# ten random streams (TICKWHEEL_TEST_EXAMPLES=few). `make test` and CI run everything.
check: $(STAMP) system-deps
	@$(MAKE) --no-print-directory -j2 --output-sync=target lint typecheck bench-floors
	TICKWHEEL_TEST_EXAMPLES=few $(PYTEST) -m "not jvm_process" tests

class-archive: $(STAMP) system-deps
	-$(BIN)/tickwheel pipeline prepare

# The library's tests on each newer CPython found (3.12+), each claimed one required;
# see the script. CI runs it after `make test` (.ci/run).
test-pythons:
	@bash scripts/test-pythons.sh

# The benchmarks' compiled floors (benchmarks/_floors.pyx: the least C work of a timer,
# the floor-c rows), built against the compiled core; not part of the package.
bench-floors: $(STAMP)
	$(BIN)/python benchmarks/setup_floors.py

bench: bench-floors
	$(BIN)/python benchmarks/bench_timer.py
	$(BIN)/python benchmarks/bench_purgatory.py
	$(BIN)/python benchmarks/bench_aio.py

# PyFlink's environment, for the stream benchmark's PyFlink peer only
# (bench_pipeline_incremental.py --cli --cli-peers pyflink): PyFlink pins its own
# apache-beam, pyarrow and protobuf, so it gets a venv of its own, which neither .venv
# nor `make test` needs. Its Python is $(PYTHON) (PyFlink 2.3 lists 3.9 to 3.12).
PYFLINK_VENV := .venvs/pyflink
$(PYFLINK_VENV)/.installed-stamp: benchmarks/requirements-pyflink.txt
	@test -x $(PYFLINK_VENV)/bin/python || $(PYTHON) -m venv $(PYFLINK_VENV)
	$(PYFLINK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PYFLINK_VENV)/bin/python -m pip install --quiet -r benchmarks/requirements-pyflink.txt
	@touch $@

bench-env-pyflink: $(PYFLINK_VENV)/.installed-stamp system-deps

clean:
	rm -rf $(VENV) .venvs build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
	rm -f src/tickwheel/_speedups.c src/tickwheel/*.so src/tickwheel/pipeline/_loop.c src/tickwheel/pipeline/*.so
	rm -f benchmarks/*.so
