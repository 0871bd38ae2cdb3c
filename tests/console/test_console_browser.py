"""The console's pages in a real Chromium against a real cluster (design30 5.3).

One cluster for the module: a name server, broker group ``a`` (master and a
replica) and ``b``; topics ``orders`` (2 queues on each group), ``work`` (on
``a``, with dead letters of group ``D``), ``staged`` (an open transaction) and
``later`` (a pending delayed message); group ``g`` has read part of
``orders``. The console polls it every second with users (``--tokens-file``).
Each page's ``data-value`` cells are compared with what the client's ``Admin``
says; the plots gain points without a reload; the browser log has no script
error and no CSP violation; an admin resets ``g`` through the form; a
``monitor`` session sees no admin button; a SIGKILLed group shows
``unreachable``.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from equeue_broker.testing import BrokerProcess, LocalCluster
from equeue_spark.client import Admin, ClientConfig, Consumer, Producer
from tests.console.test_console_api import ConsoleProcess
from tests.support.browser import browser_problems, login, open_chromium, wait_round
from tests.support.waits import wait_for

pytestmark = [pytest.mark.slow]

ADMIN, MONITOR = "browser-admin-secret-0123", "browser-monitor-secret-01"
TOKENS = f"""
[[tokens]]
name = "ops"
secret = "{ADMIN}"
roles = ["admin"]

[[tokens]]
name = "dashboards"
secret = "{MONITOR}"
roles = ["monitor"]
"""
SHOTS = Path("/tmp/d30-shots")


@dataclass
class Scene:
    cluster: LocalCluster
    replica: BrokerProcess
    console: ConsoleProcess

    def admin(self) -> Admin:
        return Admin(config=ClientConfig(namesrv=self.cluster.namesrv, timeout_s=5))

    def producer(self) -> Producer:
        return Producer(config=ClientConfig(namesrv=self.cluster.namesrv, timeout_s=5))


def fill(scene_namesrv: str) -> None:
    """Topics, a partly read group, dead letters, an open transaction and a
    pending delayed message."""
    config = ClientConfig(namesrv=scene_namesrv, timeout_s=5)
    with Admin(config=config) as admin:
        admin.create_topic("orders", queues=2)
        for name in ("work", "staged", "later"):
            admin.create_topic(name, queues=1, brokers=["a"])
    with Producer(config=config) as producer:
        producer.send_batch("orders", [b"order-%d" % i for i in range(40)], keys=[b"k"] * 40)
        producer.send_batch("work", [b"a", b"b"], queue_ids=[0, 0], brokers=["a", "a"])
        producer.send_batch("later", [b"d"], queue_ids=[0], brokers=["a"], delay_s=600)
        producer.send_batch(
            "staged", [b"s1", b"s2"], queue_ids=[0, 0], brokers=["a", "a"], transaction_id="tx-1"
        )
    with Consumer(config=config, group="g", topics=["orders"], max_messages=10) as consumer:
        seen = 0

        def read_some() -> bool | None:
            nonlocal seen
            seen += len(consumer.poll(timeout_s=0.5))
            consumer.commit()
            return seen >= 10 or None

        wait_for("group g reading orders", read_some, 30)
    with Consumer(
        config=config, group="D", topics=["work"], max_reconsume_times=1
    ) as consumer:
        dead: list[str] = []

        def nacked() -> bool | None:
            for message in consumer.poll(timeout_s=0.5):
                (outcome,) = consumer.nack(message, delay_s=0.1, error="bad")
                if outcome.action == "dlq":
                    dead.append(message.message_id)
            consumer.commit()
            return len(dead) >= 2 or None

        wait_for("two dead letters", nacked, 30)


@contextmanager
def running_scene(root: Path, interval: str = "1s") -> Iterator[Scene]:
    tokens = root / "tokens.toml"
    root.mkdir(parents=True, exist_ok=True)
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    cluster = LocalCluster(root / "cluster")
    replica: BrokerProcess | None = None
    console: ConsoleProcess | None = None
    try:
        cluster.start(namesrvs=1, brokers=("a", "b"))
        replica = BrokerProcess(
            root / "cluster" / "broker-a-replica", "--broker-name", "a", "--namesrv",
            cluster.namesrv, "--role", "replica", "--master", cluster.brokers["a"].address,
        )  # fmt: skip
        replica.start()
        fill(cluster.namesrv)
        console = ConsoleProcess(
            root / "console", "--namesrv", cluster.namesrv, "--tokens-file", str(tokens),
            "--interval", interval, reader=ADMIN,
        )  # fmt: skip
        console.start()
        yield Scene(cluster, replica, console)
    finally:
        if console is not None:
            console.stop()
        if replica is not None and replica.alive():
            replica.stop()
        cluster.stop()
