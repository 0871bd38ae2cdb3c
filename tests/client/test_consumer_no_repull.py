"""A consumer's polls do not make the broker serve records twice.

A poll sends one long-polling pull per queue and returns at the first
replies; the others stay in flight and the next poll takes their replies
(it used to cancel them, after the broker had often answered already: those
records were served, thrown away and pulled again). Real broker processes;
the broker's own counters (GetStats ``queue_counters``: records sent in pull
replies) and its ``equeue_parked_pulls`` gauge (/metrics) are the witnesses.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, ClientConfig, Consumer, Message, Producer
from tests.support.waits import wait_for

StartBroker = Callable[..., BrokerProcess]

pytestmark = pytest.mark.timeout(180)

QUEUES = 8
PER_QUEUE = 500
MAX_MESSAGES = 20


def config(broker: BrokerProcess) -> ClientConfig:
    return ClientConfig(broker=broker.address, timeout_s=10)


def served(broker: BrokerProcess, topic: str) -> int:
    """Records of ``topic`` the broker sent in pull replies."""
    with Admin(config=config(broker)) as admin:
        stats = admin.stats()
    return sum(c.consumed for c in stats.queue_counters if c.topic == topic)


def parked_pulls(broker: BrokerProcess) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.http_port()}/metrics", timeout=10) as r:
        body = r.read().decode()
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == "equeue_parked_pulls":
                return float(sample.value)
    raise AssertionError("no equeue_parked_pulls in /metrics")


def fill(broker: BrokerProcess, topic: str, queues: int, per_queue: int) -> None:
    with Admin(config=config(broker)) as admin:
        admin.create_topic(topic, queues=queues)
    with Producer(config=config(broker)) as producer:
        for queue_id in range(queues):
            values = [b"%d-%d" % (queue_id, i) for i in range(per_queue)]
            producer.send_batch(topic, values, queue_ids=[queue_id] * per_queue)


def drain(consumer: Consumer, total: int) -> list[Message]:
    """Poll and commit after every poll until ``total`` messages came."""
    got: list[Message] = []
    polls = 0
    while len(got) < total:
        polls += 1
        assert polls < 20 * total, f"only {len(got)} of {total} messages after {polls} polls"
        got += consumer.poll(timeout_s=5.0)
        consumer.commit()
    return got


def assert_in_order_once(got: list[Message], queues: int, per_queue: int) -> None:
    by_queue: dict[int, list[int]] = {}
    for message in got:
        by_queue.setdefault(message.queue_id, []).append(message.offset)
        assert message.value == b"%d-%d" % (message.queue_id, message.offset)
    assert by_queue == {q: list(range(per_queue)) for q in range(queues)}


def test_a_group_consumer_is_served_each_record_about_once(broker_factory: StartBroker) -> None:
    broker = broker_factory("--http-port", "0")
    fill(broker, "t", QUEUES, PER_QUEUE)
    total = QUEUES * PER_QUEUE
    with Consumer(
        config=config(broker), group="g", topics=["t"], start="earliest",
        max_messages=MAX_MESSAGES, max_wait_ms=2000,
    ) as consumer:  # fmt: skip
        got = drain(consumer, total)
        assert_in_order_once(got, QUEUES, PER_QUEUE)
        # At most one reply per queue may still be in flight, unread.
        assert served(broker, "t") <= total + QUEUES * MAX_MESSAGES
    wait_for("no parked pull left", lambda: parked_pulls(broker) == 0, timeout_s=30)


def test_an_assigned_consumer_is_served_each_record_about_once(
    broker_factory: StartBroker,
) -> None:
    broker = broker_factory("--http-port", "0")
    fill(broker, "t", QUEUES, PER_QUEUE)
    total = QUEUES * PER_QUEUE
    with Consumer(config=config(broker), max_messages=MAX_MESSAGES, max_wait_ms=2000) as consumer:
        consumer.assign("t", range(QUEUES))
        got: list[Message] = []
        while len(got) < total:
            got += consumer.poll(timeout_s=5.0)
        assert_in_order_once(got, QUEUES, PER_QUEUE)
        assert served(broker, "t") <= total + QUEUES * MAX_MESSAGES


def test_seek_while_a_pull_is_in_flight_reads_from_the_new_offset(
    broker_factory: StartBroker,
) -> None:
    broker = broker_factory("--http-port", "0")
    fill(broker, "t", 2, 10)
    with Consumer(config=config(broker), max_messages=100, max_wait_ms=20_000) as consumer:
        consumer.assign("t", [0, 1])
        consumer.seek("t", 1, 10)  # queue 1 at its end: its pull parks
        first = consumer.poll(timeout_s=20.0)
        assert [(m.queue_id, m.offset) for m in first] == [(0, i) for i in range(10)]
        wait_for("queue 1's pull parked", lambda: parked_pulls(broker) >= 1, timeout_s=30)
        consumer.seek("t", 1, 3)
        second = consumer.poll(timeout_s=20.0)
        # Queue 1 again from offset 3, at once (not the parked pull's empty
        # answer after its 20 s); queue 0 has nothing more.
        assert [(m.queue_id, m.offset) for m in second] == [(1, i) for i in range(3, 10)]
        assert consumer.position("t", 1) == 10


def test_close_leaves_no_pull_parked(broker_factory: StartBroker) -> None:
    broker = broker_factory("--http-port", "0")
    fill(broker, "t", 4, 5)
    consumer = Consumer(config=config(broker), max_messages=100, max_wait_ms=60_000)
    consumer.assign("t", range(4))
    for queue_id in range(1, 4):
        consumer.seek("t", queue_id, 5)  # at their ends: their pulls park
    assert len(consumer.poll(timeout_s=60.0)) == 5
    wait_for("3 pulls parked", lambda: parked_pulls(broker) == 3, timeout_s=30)
    consumer.close()
    wait_for("no parked pull left", lambda: parked_pulls(broker) == 0, timeout_s=30)
