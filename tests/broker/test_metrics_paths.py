"""Every way into and out of a real broker shows in its /metrics: delayed
produce, Nack's retry and dead-letter copies, transaction commits, fetch-port
reads; and what bounds clients' connections and calls (docs/metrics.md)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, Producer
from equeue_spark.client.fetch import Pool, fetch_replies
from tests.broker.delayed_support import nack, produce, pull_until
from tests.broker.test_metrics_http import Samples, fast, http_url, scrape, value
from tests.support.raw_client import RawClient

StartBroker = Callable[..., BrokerProcess]
VALUES = [b"value-%04d" % i for i in range(40)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape_until(url: str, ready: Callable[[Samples], bool], timeout_s: float = 20) -> Samples:
    """Scrapes until ``ready`` holds (renders are cached for 0.5 s: a figure
    changes on the broker before it shows)."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(url)
        if ready(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def test_delayed_and_transactions_count_their_bytes(broker_factory: StartBroker) -> None:
    broker = broker_factory("--http-port", "0", "--default-queues", "1")
    with Producer(config=fast(broker.address)) as producer:
        producer.send_batch("plain", VALUES)  # the yardstick: same values, plain produce
        producer.send_batch("later", VALUES, delay_s=3600)
        txn = producer.transaction("tx-1")
        txn.send_batch("staged", VALUES[:25])
        txn.send_batch("staged", VALUES[25:])
        before = scrape(http_url(broker))
        txn.commit()
    # Staged messages count at commit, not when staged.
    assert not [k for k in before if k[0] == "equeue_messages_in_total" and
                ("topic", "staged") in k[1]]  # fmt: skip
    samples = scrape_until(
        http_url(broker),
        lambda s: any(k[0] == "equeue_bytes_in_total" and ("topic", "staged") in k[1] for k in s),
    )
    plain = value(samples, "equeue_bytes_in_total", topic="plain")
    assert plain >= sum(map(len, VALUES))
    # Delayed: counted once accepted (written to the log), with its stored bytes.
    assert value(samples, "equeue_messages_in_total", topic="later") == len(VALUES)
    later = value(samples, "equeue_bytes_in_total", topic="later")
    assert plain <= later < 2 * plain  # the same records plus their due times
    # Committed: the staged records' bytes (two stage calls, one queue).
    assert value(samples, "equeue_messages_in_total", topic="staged") == len(VALUES)
    staged = value(samples, "equeue_bytes_in_total", topic="staged")
    assert plain * 0.9 <= staged <= plain * 1.5
    assert value(samples, "equeue_broker_messages_in_total") == 3 * len(VALUES)


def test_nack_copies_and_resends_count_as_appends(broker_factory: StartBroker) -> None:
    broker = broker_factory("--http-port", "0")
    client = RawClient(broker.address)
    try:
        produce(client, "orders", [b"payment failed once"])

        assert nack(client, "orders", 0, delay_ms=0, max_=1).action == "retry"
        after_retry = scrape(http_url(broker))
        (copy,) = pull_until(client, "%RETRY%billing", 0, 1)
        assert nack(client, "%RETRY%billing", copy.offset, delay_ms=0, max_=1).action == "dlq"
        samples = scrape_until(
            http_url(broker),
            lambda s: value(s, "equeue_messages_in_total", topic="%reserved") == 2,
        )
    finally:
        client.close()
    # The retry copy counts when Nack writes it (a delayed append), the dead
    # letter when it is written; both under %reserved, not as their own topics.
    assert value(after_retry, "equeue_messages_in_total", topic="%reserved") == 1
    assert value(samples, "equeue_messages_in_total", topic="%reserved") == 2
    assert value(samples, "equeue_bytes_in_total", topic="%reserved") > 2 * len(
        b"payment failed once"
    )
    assert value(samples, "equeue_messages_in_total", topic="orders") == 1
    assert value(samples, "equeue_broker_messages_in_total") == 3
    # A resent dead letter counts on its origin topic, its %RESENT% record on %reserved.
    with Admin(config=fast(broker.address)) as admin:
        assert admin.resend_dead_letters("billing", all=True).resent == 1
    resent = scrape_until(
        http_url(broker),
        lambda s: value(s, "equeue_messages_in_total", topic="orders") == 2,
    )
    assert value(resent, "equeue_messages_in_total", topic="orders") == 2
    assert value(resent, "equeue_messages_in_total", topic="%reserved") == 3
    assert value(resent, "equeue_group_dlq_resent_messages", group="billing") == 1


def test_fetch_port_reads_count_as_out(broker_factory: StartBroker) -> None:
    fetch_port = free_port()
    broker = broker_factory("--http-port", "0", "--fetch-port", str(fetch_port))
    with Producer(config=fast(broker.address)) as producer:
        producer.send_batch("orders", VALUES, queue_ids=[0] * len(VALUES))
    pool = Pool()
    try:
        replies = list(fetch_replies(f"127.0.0.1:{fetch_port}", "orders", 0, 0, 0, pool=pool))
    finally:
        pool.close()
    assert sum(r.count for r in replies) == len(VALUES)
    samples = scrape_until(
        http_url(broker),
        lambda s: any(k[0] == "equeue_messages_out_total" for k in s),
    )
    assert value(samples, "equeue_messages_out_total", topic="orders") == len(VALUES)
    out = value(samples, "equeue_bytes_out_total", topic="orders")
    assert out == value(samples, "equeue_bytes_in_total", topic="orders")  # the same records
    assert value(samples, "equeue_fetch_connections_limit") > 0
    assert value(samples, "equeue_fetch_connections") == 0  # the pool is closed


@pytest.mark.timeout(90)
def test_connections_and_calls_in_flight(broker_factory: StartBroker, tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("max_connections = 50\nmax_streams_per_connection = 7\n")
    broker = broker_factory("--http-port", "0", "--config", str(config))
    url = http_url(broker)
    client = RawClient(broker.address)
    try:
        produce(client, "orders", [b"x"])
        # A long-poll Pull past the end parks: a call in flight on one connection.
        request = pb.PullRequest(topic="orders", queue_id=0, offset=1, max_wait_ms=20_000)
        parked = client.broker.Pull.future(request, timeout=60)
        samples = scrape_until(url, lambda s: value(s, "equeue_parked_pulls") == 1)
        assert value(samples, "equeue_parked_pulls") == 1
        assert value(samples, "equeue_calls_in_flight") >= 1
        assert value(samples, "equeue_connection_calls_max") >= 1
        assert value(samples, "equeue_connection_calls_limit") == 7
        assert value(samples, "equeue_connections") >= 1
        assert value(samples, "equeue_connections_limit") == 50
        assert value(samples, "equeue_streams", kind="pull") == 0
        assert value(samples, "equeue_streams_limit", kind="pull") > 0
        produce(client, "orders", [b"y"])  # wakes the parked pull
        reply: pb.PullReply = parked.result(timeout=30)
        assert reply.status == pb.PULL_STATUS_OK
        samples = scrape_until(url, lambda s: value(s, "equeue_parked_pulls") == 0)
        assert value(samples, "equeue_parked_pulls") == 0
    finally:
        client.close()
    closed = scrape_until(url, lambda s: value(s, "equeue_connections") == 0)
    assert value(closed, "equeue_connections") == 0  # the client's connection is gone
    assert value(closed, "equeue_calls_in_flight") == 0


def test_a_refused_call_is_not_in_flight(broker_factory: StartBroker, tmp_path: Path) -> None:
    """Calls over max_streams_per_connection are refused before they count."""
    config = tmp_path / "broker.toml"
    config.write_text("max_streams_per_connection = 1\n")
    broker = broker_factory("--http-port", "0", "--config", str(config))
    client = RawClient(broker.address)
    try:
        produce(client, "orders", [b"x"])
        request = pb.PullRequest(topic="orders", queue_id=0, offset=1, max_wait_ms=20_000)
        parked = client.broker.Pull.future(request, timeout=60)
        scrape_until(http_url(broker), lambda s: value(s, "equeue_parked_pulls") == 1)
        with pytest.raises(grpc.RpcError) as refused:
            client.broker.Pull(request, timeout=30)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        samples = scrape(http_url(broker))
        assert value(samples, "equeue_calls_in_flight") == 1
        assert not parked.done()  # closing the client below ends it
    finally:
        client.close()
