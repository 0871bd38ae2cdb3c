"""Shared fixtures: small-chunk store configs, real brokers, ZooKeeper, one SparkSession."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from equeue_broker.storage import MessageLimits, StorageConfig, Store
from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_zk import ZooKeeperProcess, java_available
from tests.support.spark_home import shadow_spark_home

KiB = 1024

# The longest test files first under pytest-xdist (tests/support/schedule.py).
pytest_plugins = ["tests.support.schedule"]

# Hypothesis fails an example slower than 200 ms by default: on a 2-core machine
# busy with another suite that is load, not a bug (test_columns' UTF-8 and Arrow
# properties hit it). Every test is bounded by pytest-timeout instead.
settings.register_profile("equeue", deadline=None)
settings.load_profile("equeue")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that needs a SparkSession is slow (``make test-fast`` skips them),
    wherever it lives; whole modules of slow tests say so with ``pytestmark``."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


MakeConfig = Callable[..., StorageConfig]


@pytest.fixture
def make_config(tmp_path: Path) -> MakeConfig:
    """Build a ``StorageConfig`` with tiny chunks (so tests cross chunk boundaries)."""

    def make(**overrides: Any) -> StorageConfig:
        settings: dict[str, Any] = {
            "data_dir": tmp_path / "data",
            "chunk_capacity_bytes": 64 * KiB,
            "index_entries_per_chunk": 64,
            "flush_interval_ms": 20,
            "limits": MessageLimits(max_message_bytes=16 * KiB, max_key_bytes=1 * KiB),
        }
        settings.update(overrides)
        return StorageConfig(**settings)

    return make


@pytest.fixture
def open_store(make_config: MakeConfig) -> Iterator[Callable[..., Store]]:
    """Open stores (without the background thread unless asked); all closed at teardown."""
    opened: list[Store] = []

    def open_(config: StorageConfig | None = None, background: bool = False) -> Store:
        store = Store(config or make_config(), background=background)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Start real broker processes (``factory(*flags)``); all stopped at teardown."""
    started: list[BrokerProcess] = []

    def start(*args: str, data_dir: Path | None = None) -> BrokerProcess:
        broker = BrokerProcess(data_dir or tmp_path / f"broker{len(started)}", *args)
        broker.start()
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.kill()


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    """One running broker with default settings (async flush)."""
    return broker_factory()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One local SparkSession for the whole run (starting one takes seconds). Its
    JVM starts with a ``SPARK_HOME`` whose Python workers import pyspark from
    site-packages, with cached bytecode, not from pyspark.zip: fast enough to
    connect back within Spark's fixed 10 s on a loaded machine (spark_home.py)."""
    pytest.importorskip("pyspark")
    from equeue_spark.spark.testing import local_session

    shadow = shadow_spark_home(tmp_path_factory.mktemp("spark"))
    given = os.environ.get("SPARK_HOME")
    if shadow is not None:
        os.environ["SPARK_HOME"] = str(shadow)
    try:
        session = local_session()
    finally:  # the JVM keeps it; other children of this process see the user's
        if given is None:
            os.environ.pop("SPARK_HOME", None)
        else:
            os.environ["SPARK_HOME"] = given
    yield session
    session.stop()


def _require_java() -> None:
    if not java_available():
        pytest.skip("java is not installed: ZooKeeper needs a JRE (CI has Java 17)")


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperProcess]:
    """One private ZooKeeper (127.0.0.1, free port, temp data) shared by the session;
    tests keep apart through ``zk_hosts``' chroots. A test that stops or pauses
    ZooKeeper uses ``zookeeper_factory`` instead."""
    _require_java()
    zk = ZooKeeperProcess(tmp_path_factory.mktemp("zookeeper"))
    zk.start()
    yield zk
    zk.stop()


@pytest.fixture
def zk_hosts(zookeeper: ZooKeeperProcess, request: pytest.FixtureRequest) -> str:
    """``127.0.0.1:PORT/<chroot of this test>`` on the shared ZooKeeper."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return f"{zookeeper.hosts}/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def zookeeper_factory(tmp_path: Path) -> Iterator[Callable[[], ZooKeeperProcess]]:
    """Start private ZooKeepers this test may stop, restart and pause; all stopped
    at teardown."""
    _require_java()
    started: list[ZooKeeperProcess] = []

    def start() -> ZooKeeperProcess:
        zk = ZooKeeperProcess(tmp_path / f"zookeeper{len(started)}")
        started.append(zk)
        zk.start()
        return zk

    yield start
    for zk in started:
        zk.stop()
