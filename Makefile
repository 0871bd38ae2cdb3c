# equeue developer commands. Every target sets up what it needs itself.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed-stamp

.PHONY: venv zookeeper observability-tools console-shots bench-metrics test test-fast lint typecheck pytest pytest-fast bench bench-spark bench-delay bench-filter bench-keys bench-broker demo proto clean

venv: $(STAMP)

# The editable install is a link tree (editable_mode=strict): broker/equeue_broker
# appears as equeue_broker, and pyspark_equeue.py sits in a real directory on sys.path,
# where Spark's scan for pyspark_* modules finds it. A link tree does not see new
# or removed modules, so it is rebuilt whenever the list of source files changes.
MODULES := $(sort $(shell find broker equeue_spark equeue_proto -name '*.py' -o -name '*.c' -o -name '*.pyi' 2>/dev/null))
MODULE_LIST = $(VENV)/.module-list

$(MODULE_LIST): FORCE
	@mkdir -p $(VENV)
	@echo '$(MODULES)' | cmp -s - $@ 2>/dev/null || echo '$(MODULES)' > $@

# Re-install whenever the package metadata, the C codec or the module list changes.
$(STAMP): setup.cfg setup.py pyproject.toml equeue_proto/_codec.c equeue_proto/_keyhash.c equeue_proto/_avro.c equeue_proto/crc32c.h $(MODULE_LIST)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The distribution was called "equeue" before 0.2 (PyPI's equeue is another project).
	$(BIN)/python -m pip uninstall --quiet --yes equeue 2>/dev/null || true
	$(BIN)/python -m pip install --quiet -e '.[dev]' --config-settings editable_mode=strict
	touch $(STAMP)

.PHONY: FORCE
FORCE:

# The demo needs the connector only (pyspark, pyarrow, pandas), not the lint,
# type-check and test tools; a venv that has the dev install already is reused.
DEMO_STAMP = $(VENV)/.demo-stamp

$(DEMO_STAMP): setup.cfg setup.py pyproject.toml equeue_proto/_codec.c equeue_proto/_keyhash.c equeue_proto/_avro.c equeue_proto/crc32c.h $(MODULE_LIST)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	if [ $(STAMP) -nt $(MODULE_LIST) ] && [ $(STAMP) -nt setup.cfg ]; then \
		echo "reusing the dev install in $(VENV)"; \
	else \
		$(BIN)/python -m pip install --quiet --upgrade pip && \
		$(BIN)/python -m pip uninstall --quiet --yes equeue 2>/dev/null; \
		$(BIN)/python -m pip install --quiet -e '.[spark]' --config-settings editable_mode=strict; \
	fi
	touch $@

CFLAGS_CHECK = -std=c11 -Wall -Wextra -Wno-unused-parameter -Werror -fsyntax-only
PY_INCLUDE = $(shell $(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['include'])")

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(CC) $(CFLAGS_CHECK) -I$(PY_INCLUDE) equeue_proto/_codec.c
	$(CC) $(CFLAGS_CHECK) -I$(PY_INCLUDE) equeue_proto/_keyhash.c
	$(CC) $(CFLAGS_CHECK) -I$(PY_INCLUDE) equeue_proto/_avro.c

typecheck: $(STAMP)
	$(BIN)/mypy

# The tests that run a C accelerator's code again on its pure-Python reference
# (EQUEUE_PURE_PYTHON=1: what runs where the extensions are not built). Every
# C/Python pair is exercised in process by tests/contract and tests/storage:
# equeue_proto._codec's varints and blob split (test_wire), murmur2
# (test_message_keys), select_frames (test_selector, test_filtered_reads),
# decode_columns (test_columns), the record encoders, index_segments/index_runs,
# check_frames and timer_entries (tests/storage), and equeue_proto._keyhash
# (test_key_index). The broker files below add the same paths in a real broker
# process with the client's decoders: produce and pull (test_broker), staged
# records patched at commit (test_transactions), the timer wheel (test_delayed),
# damaged frames (test_damaged_records), the produce and pull hot paths
# (test_hot_path_broker). The other broker tests (access, budgets, metrics,
# security, key queries, filters, ...) go through no pair these do not; they
# ran here until 2026-11-27 and made the rerun 7 minutes under load. _avro's reference runs in
# tests/client/test_avro_columns.py, in a subprocess of the main pass.
PURE_PYTHON_TESTS = tests/contract tests/storage tests/broker/test_broker.py \
	tests/broker/test_transactions.py tests/broker/test_delayed.py \
	tests/broker/test_damaged_records.py tests/broker/test_hot_path_broker.py

# ZooKeeper for the election and failover tests (equeue_broker.testing_zk starts
# private instances): Debian's package, its jars in /usr/share/java (Java 17 runs it).
# Installed once when missing (as root, or through sudo); silent when present.
ZOOKEEPER_JAR = /usr/share/java/zookeeper.jar
SUDO = $(if $(filter 0,$(shell id -u)),,sudo)

zookeeper:
	@test -e $(ZOOKEEPER_JAR) || { \
		echo "installing ZooKeeper (apt-get install zookeeper)"; \
		export DEBIAN_FRONTEND=noninteractive; \
		$(SUDO) apt-get install -y -qq zookeeper >/dev/null 2>&1 || \
		{ $(SUDO) apt-get update -qq >/dev/null && $(SUDO) apt-get install -y -qq zookeeper >/dev/null; }; \
	}
	@test -e $(ZOOKEEPER_JAR) || { echo "ZooKeeper is missing: $(ZOOKEEPER_JAR)"; exit 1; }

# Prometheus and Chromium (with its WebDriver) for issue 30's tests: a real
# Prometheus scrapes the brokers, a real headless Chromium drives the console.
# Debian's packages; installed once when missing (as root, or through sudo).
OBSERVABILITY_BINS = /usr/bin/prometheus /usr/bin/promtool /usr/bin/chromium /usr/bin/chromedriver

observability-tools:
	@for f in $(OBSERVABILITY_BINS); do test -e $$f || missing=1; done; \
	if [ -n "$$missing" ]; then \
		echo "installing prometheus, chromium, chromium-driver (apt-get)"; \
		export DEBIAN_FRONTEND=noninteractive; \
		$(SUDO) apt-get install -y -qq --no-install-recommends prometheus chromium chromium-driver >/dev/null 2>&1 || \
		{ $(SUDO) apt-get update -qq >/dev/null && $(SUDO) apt-get install -y -qq --no-install-recommends prometheus chromium chromium-driver >/dev/null; }; \
	fi
	@for f in $(OBSERVABILITY_BINS); do test -e $$f || { echo "missing: $$f (apt-get install prometheus chromium chromium-driver)"; exit 1; }; done

# Bytecode caches on: with PYTHONDONTWRITEBYTECODE=1 in the caller's environment
# every process a test run starts (brokers, name servers, CLI runs, Spark's Python
# workers, and each pytest-xdist worker's collection) compiles the project's
# modules from source again: 0.2 s of CPU per broker start, 6 s per worker's
# collection, 30 s of the 215 s of CPU make test-fast took. The caches go to
# build/ (the editable install's link tree) and __pycache__/, both ignored by git.
PYTEST = env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest

# Three workers, a test file each at a time (--dist loadfile: a module's fixtures,
# e.g. the shared standalone Spark cluster, stay in one process). The suite
# spends most of its time waiting (process start-ups, long polls, JVMs), so on
# 2 cores three workers beat two once issue 30 and 31's tiers (real Prometheus,
# Chromium, every benchmark's quick run) joined it; the pure-Python rerun is
# fast tests only and takes four, as pytest-fast does. The files are queued
# longest first (tests/support/schedule.py, with the seconds in
# tests/support/durations.py). The 20 slowest tests are printed: what to look
# at when the suite nears its budget (docs/testing.md).
PYTEST_WORKERS ?= 3
PURE_PYTHON_WORKERS ?= 4
pytest: $(STAMP) zookeeper observability-tools
	$(PYTEST) -n $(PYTEST_WORKERS) --dist loadfile --durations=20
	EQUEUE_PURE_PYTHON=1 $(PYTEST) -q -n $(PURE_PYTHON_WORKERS) --dist loadfile $(PURE_PYTHON_TESTS)

# Everything but the tests marked slow (Spark, cluster, kill, hardening, and single
# tests that take long): meant for under 2 minutes on an idle 2-core machine
# (docs/testing.md). The 15 slowest are printed: a test that grows past a few
# seconds belongs in the slow tier (make test runs it).
# Four workers: the fast tests mostly wait (broker and JVM start-ups, long polls),
# so on 2 idle cores 4 workers took 130 s where 2 took 199 s (6: 128 s, CPU-bound).
PYTEST_FAST_WORKERS ?= 4
pytest-fast: $(STAMP) zookeeper observability-tools
	$(PYTEST) -n $(PYTEST_FAST_WORKERS) --dist loadfile -m "not slow" --durations=15

test: zookeeper lint typecheck pytest

test-fast: zookeeper lint typecheck pytest-fast

# Regenerate the gRPC code from protos/ (tests fail if it drifts).
proto: $(STAMP)
	$(BIN)/python protos/generate.py

bench: $(STAMP)
	$(BIN)/python bench/storage_bench.py

bench-spark: $(STAMP)
	$(BIN)/python bench/spark_bench.py

.PHONY: bench-pushdown
bench-pushdown: $(STAMP)
	$(BIN)/python bench/spark_pushdown_bench.py

bench-delay: $(STAMP)
	$(BIN)/python bench/delay_bench.py --scenario all

bench-filter: $(STAMP)
	$(BIN)/python bench/filter_bench.py

bench-keys: $(STAMP)
	$(BIN)/python bench/key_index_bench.py

# Against Redis Streams and NATS JetStream, when their servers are installed
# (apt-get install redis-server nats-server).
bench-broker: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]' --config-settings editable_mode=strict
	$(BIN)/python bench/broker_bench.py --repeat 3

.PHONY: bench-txn-check
bench-txn-check: $(STAMP)
	$(BIN)/python bench/txn_check_bench.py

# Issue 29: the Spark bench's ceiling templates against the read schema (seconds,
# no broker, no Spark); the Avro decoder alone; the Avro-decoding Spark read
# against the plain read of the same topic; schema validation in the producer.
.PHONY: bench-check bench-avro bench-spark-formats bench-schemas
bench-check: $(STAMP)
	$(BIN)/python bench/spark_bench.py --check

bench-avro: $(STAMP)
	$(BIN)/python bench/avro_decode_bench.py

bench-spark-formats: $(STAMP)
	$(BIN)/python bench/spark_bench.py --repeat 3 --formats binary,avro

bench-schemas: $(STAMP)
	$(BIN)/python bench/schema_bench.py

# Spark's Python workers must run this interpreter (the examples set PYSPARK_PYTHON).
# Metrics on against off (issue 30): produce and pull throughput, same run.
bench-metrics: $(STAMP)
	$(BIN)/python bench/metrics_bench.py

# The console's screenshots for docs/operations.md (a demo cluster, ~2.5 min).
console-shots: $(STAMP) zookeeper observability-tools
	$(BIN)/python -m tests.support.console_shots --out docs/images

demo: $(DEMO_STAMP)
	$(BIN)/python examples/streaming_demo.py

clean:
	rm -rf $(VENV) build .mypy_cache .ruff_cache .pytest_cache

# Hardening: the long runs of tests/hardening/test_crash_loop.py, test_fuzz.py and test_load.py.
.PHONY: crash-loop fuzz load
CRASH_CYCLES ?= 50
FUZZ_REQUESTS ?= 10000
LOAD_SECONDS ?= 600

# SIGKILL under load, restart, verify; sync mode (nothing acked may be lost), then
# async mode with a simulated power loss after each kill (loss only in the last flush window).
crash-loop: $(STAMP)
	$(BIN)/python hardening/crash_loop.py --cycles $(CRASH_CYCLES) --mode sync
	$(BIN)/python hardening/crash_loop.py --cycles $(CRASH_CYCLES) --mode async --machine-crash
	$(BIN)/python hardening/crash_loop.py --cycles $(CRASH_CYCLES) --scenario delete-topic
	$(BIN)/python hardening/crash_loop.py --cycles $(CRASH_CYCLES) --scenario retention --chunk-size 65536
	$(BIN)/python hardening/crash_loop.py --cycles $(CRASH_CYCLES) --scenario transaction

fuzz: $(STAMP)
	$(BIN)/python hardening/fuzz_broker.py --requests $(FUZZ_REQUESTS)

load: $(STAMP)
	$(BIN)/python hardening/load_broker.py --seconds $(LOAD_SECONDS)

# The exactly-once kill tests at full length (make test runs three kill cycles and
# two catch tries): KILLS driver kills around one broker kill, and up to KILL_TRIES
# driver runs trying to catch the driver between two brokers' commits.
.PHONY: kill-loop
KILLS ?= 6
KILL_TRIES ?= 5

kill-loop: $(STAMP)
	EQUEUE_KILLS=$(KILLS) EQUEUE_BETWEEN_COMMIT_TRIES=$(KILL_TRIES) \
		$(PYTEST) -s tests/spark/test_exactly_once_kill.py tests/spark/test_exactly_once_kill_two_brokers.py

# Master kills under load in a replicated group (ZooKeeper failover, sync
# replication): every acknowledged message exactly once in the surviving log.
.PHONY: crash-loop-cluster
CLUSTER_KILLS ?= 20

crash-loop-cluster: $(STAMP) zookeeper
	$(BIN)/python hardening/crash_loop_cluster.py --kills $(CLUSTER_KILLS)
