# equeue developer commands. Every target sets up what it needs itself.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-stamp

.PHONY: venv test lint typecheck pytest bench bench-spark bench-broker demo proto clean

venv: $(STAMP)

# Re-install whenever the package metadata changes.
$(STAMP): setup.cfg setup.py pyproject.toml broker/storage/_codec.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# compat mode puts the checkout on sys.path, so Spark's scan for pyspark_* modules sees it.
	$(BIN)/python -m pip install --quiet -e '.[dev]' --config-settings editable_mode=compat
	touch $(STAMP)

CFLAGS_CHECK = -std=c11 -Wall -Wextra -Wno-unused-parameter -Werror -fsyntax-only
PY_INCLUDE = $(shell $(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['include'])")

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(CC) $(CFLAGS_CHECK) -I$(PY_INCLUDE) broker/storage/_codec.c

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

test: lint typecheck pytest

# Regenerate the gRPC code from protos/ (tests fail if it drifts).
proto: $(STAMP)
	$(BIN)/python protos/generate.py

bench: $(STAMP)
	$(BIN)/python bench/storage_bench.py

bench-spark: $(STAMP)
	$(BIN)/python bench/spark_bench.py

# Against Redis Streams and NATS JetStream, when their servers are installed
# (apt-get install redis-server nats-server).
bench-broker: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]' --config-settings editable_mode=compat
	$(BIN)/python bench/broker_bench.py --repeat 3

# Spark's Python workers must run this interpreter (the examples set PYSPARK_PYTHON).
demo: $(STAMP)
	$(BIN)/python examples/streaming_demo.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# Hardening: the long runs of tests/test_crash_loop.py, test_fuzz.py and test_load.py.
.PHONY: crash-loop fuzz load
CRASH_CYCLES ?= 50
FUZZ_REQUESTS ?= 10000
LOAD_SECONDS ?= 600

# SIGKILL under load, restart, verify; sync mode (nothing acked may be lost), then
# async mode with a simulated power loss after each kill (loss only in the last flush window).
crash-loop: $(STAMP)
	$(BIN)/python bench/crash_loop.py --cycles $(CRASH_CYCLES) --mode sync
	$(BIN)/python bench/crash_loop.py --cycles $(CRASH_CYCLES) --mode async --machine-crash

fuzz: $(STAMP)
	$(BIN)/python bench/fuzz_broker.py --requests $(FUZZ_REQUESTS)

load: $(STAMP)
	$(BIN)/python bench/load_broker.py --seconds $(LOAD_SECONDS)
