"""A cluster on 127.0.0.1: two name servers, three brokers, the client and the CLI over it.

Real processes throughout (``equeue_broker.testing.LocalCluster``); brokers
flush synchronously, so every acknowledged message survives a SIGKILL.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from equeue_broker.testing import BrokerProcess, LocalCluster
from equeue_proto.protocol import key_queue
from equeue_spark.client import (
    Admin,
    BrokerUnavailable,
    ClientConfig,
    Consumer,
    InvalidRequest,
    Message,
    Producer,
)
from equeue_spark.client.batches import build_request
from equeue_spark.client.cluster import split_request
from equeue_spark.client.cluster_consumer import ClusterConsumer

pytestmark = pytest.mark.slow

BROKERS = ("a", "b", "c")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    started = LocalCluster(
        tmp_path,
        broker_flags=("--flush", "sync", "--register-interval-ms", "300"),
        namesrv_flags=("--broker-expiry-ms", "3000"),
    )
    try:
        yield started.start(2, BROKERS)
    finally:
        started.kill()


def wait_for(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def read_all(consumer: Consumer, count: int, timeout_s: float = 30.0) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.poll(timeout_s=0.5)
    return got


def fast_config(namesrv: str, **overrides: float) -> ClientConfig:
    settings: dict[str, float] = {
        "timeout_s": 5.0,
        "retries": 2,
        "backoff_s": 0.05,
        "failover_timeout_s": 1.0,
    }
    settings.update(overrides)
    return ClientConfig(namesrv=namesrv, **settings)  # type: ignore[arg-type]


def test_split_request_routes_keys_over_the_whole_list() -> None:
    writable = [("a", 0), ("a", 1), ("b", 0), ("c", 0), ("c", 1)]
    keys: list[bytes | None] = [b"k%d" % i for i in range(50)] + [None, None]
    request = build_request("t", [b"v%d" % i for i in range(52)], keys=keys)
    parts = split_request(request, writable, ("b", 0))
    placed: dict[int, tuple[str, int]] = {}
    for broker, (rows, part) in parts.items():
        assert part.messages.count == len(rows)
        for row, queue_id, value in zip(rows, part.queue_ids, range(len(rows)), strict=True):
            placed[row] = (broker, queue_id)
            del value
    for i, key in enumerate(keys):
        expected = ("b", 0) if key is None else writable[key_queue(key, len(writable))]
        assert placed[i] == expected
    with pytest.raises(InvalidRequest, match="no broker"):
        split_request(build_request("t", [b"x"], queue_ids=[1]), writable, ("a", 0))


@pytest.mark.timeout(240)
def test_produce_and_consume_across_three_brokers(cluster: LocalCluster) -> None:
    namesrv = cluster.namesrv
    with Admin(namesrv=namesrv) as admin:
        info = admin.create_topic("orders", queues=2)
        assert [(q.broker, q.queue_id) for q in info.queues] == [
            (b, q) for b in BROKERS for q in (0, 1)
        ]
        wait_for(lambda: len(admin.route("orders").queues()) == 6)
        route = admin.route("orders")
    writable = route.queues("writable")
    keys = [b"customer-%d" % i for i in range(300)]
    with Producer(config=fast_config(namesrv)) as producer:
        keyed = producer.send_batch("orders", [b"k:" + k for k in keys], keys=keys)
        for result, key in zip(keyed, keys, strict=True):
            assert (result.broker_id, result.queue_id) == writable[key_queue(key, len(writable))]
        keyless = [producer.send_batch("orders", [b"plain-%d" % i] * 10) for i in range(30)]
        # Round robin over the groups, and within each group over its queues:
        # every queue gets keyless batches.
        assert {(r.broker_id, r.queue_id) for rs in keyless for r in rs} == set(writable)
        futures = [producer.send("orders", b"buffered", key=b"customer-7") for _ in range(5)]
        producer.flush()
        assert {f.result().broker_id for f in futures} == {keyed[7].broker_id}
    total = 300 + 300 + 5
    config = fast_config(namesrv)
    settings = {"config": config, "group": "billing", "topics": ["orders"], "start": "earliest"}
    with Consumer(**settings) as one, Consumer(**settings) as two:  # type: ignore[arg-type]
        assert isinstance(one, ClusterConsumer) and isinstance(two, ClusterConsumer)
        wait_for(lambda: len(one.assignments()) + len(two.assignments()) == 6)
        assert not set(one.assignments()) & set(two.assignments())
        got: list[Message] = []
        deadline = time.monotonic() + 60
        while len(got) < total and time.monotonic() < deadline:
            got += one.poll(0.3) + two.poll(0.3)
        one.commit()
        two.commit()
    ids = {(m.broker_id, m.queue_id, m.offset) for m in got}
    assert len(got) == len(ids) == total
    with Admin(namesrv=namesrv) as admin:
        group = admin.describe_group("billing")
        assert sorted((q.broker, q.queue_id) for q in group.queues) == route.queues()
        assert group.total_lag == 0
        sample = got[0]
        assert admin.get_message(sample.message_id).value == sample.value
        admin.add_queues("orders", 1, brokers=["c"])
        wait_for(lambda: len(admin.route("orders").queues()) == 7)
        admin.delete_topic("orders")
        wait_for(lambda: not admin.list_topics())


def equeue(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "equeue_spark.cli", *args],
        input=stdin, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.timeout(240)
def test_cli_over_the_cluster(cluster: LocalCluster) -> None:
    ns = ["--namesrv", cluster.namesrv]
    created = equeue(*ns, "topics", "create", "events", "--queues", "2", "--brokers", "a,c")
    assert created.returncode == 0, created.stderr
    assert "created topic events with 4 queues" in created.stdout
    listed = equeue(*ns, "--json", "cluster", "list")
    assert [b["broker_name"] for b in json.loads(listed.stdout)["brokers"]] == list(BROKERS)
    wait_for(lambda: "c" in equeue(*ns, "cluster", "routes", "events").stdout)
    routes = json.loads(equeue(*ns, "--json", "cluster", "routes", "events").stdout)
    assert routes["queues"] == [["a", 0], ["a", 1], ["c", 0], ["c", 1]]
    lines = "".join(f"line {i}\n" for i in range(40))
    assert equeue(*ns, "produce", "events", stdin=lines).returncode == 0
    assert equeue(*ns, "produce", "events", "--key", "k", stdin="keyed\n").returncode == 0
    queue_flag = equeue(*ns, "produce", "events", "--queue", "1", stdin="x\n")
    assert queue_flag.returncode == 2 and "--on-broker" in queue_flag.stderr
    explicit = equeue(*ns, "produce", "events", "--queue", "1", "--on-broker", "c", stdin="x\n")
    assert explicit.returncode == 0, explicit.stderr
    consumed = equeue(
        *ns, "--json", "consume", "events", "--group", "g", "--from", "earliest", "--max", "42"
    )
    assert consumed.returncode == 0, consumed.stderr
    messages = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert len(messages) == 42 and {m["broker"] for m in messages} <= {"a", "c"}
    described = equeue(*ns, "groups", "describe", "g")
    assert described.stdout.splitlines()[1].split()[:2] == ["BROKER", "TOPIC"]
    assert "total lag       0" in described.stdout
    topic = equeue(*ns, "topics", "describe", "events")
    assert topic.returncode == 0 and topic.stdout.count("\nc ") == 2
    both = equeue(*ns, "--broker", "127.0.0.1:1", "topics", "list")
    assert both.returncode == 2 and "not both" in both.stderr
    no_ns = equeue("--broker", cluster.brokers["a"].address, "cluster", "list")
    assert no_ns.returncode == 2 and "--namesrv" in no_ns.stderr


@pytest.mark.timeout(180)
def test_cli_timeout_bounds_the_failover_wait(cluster: LocalCluster) -> None:
    """``--timeout-s`` bounds a CLI write to a group without a master, too: the
    CLI gives up after about that long (not the library's 30 s failover wait)
    with an error naming the group. 20 s is a correctness bound, far from 3."""
    ns = ["--namesrv", cluster.namesrv]
    # Group b gets a replica: with its master gone the name servers list the
    # group, with no master (a group of one would vanish from the route).
    replica = BrokerProcess(
        cluster.root / "broker-b-replica", "--broker-name", "b", "--namesrv", cluster.namesrv,
        *cluster.broker_flags, "--role", "replica", "--master", cluster.brokers["b"].address,
    )  # fmt: skip
    cluster.brokers["b-replica"] = replica  # the fixture kills it
    replica.start()
    created = equeue(*ns, "topics", "create", "solo", "--queues", "1", "--brokers", "b")
    assert created.returncode == 0, created.stderr
    wait_for(lambda: equeue(*ns, "produce", "solo", "--key", "k", stdin="x\n").returncode == 0)

    def replica_registered_solo() -> bool:
        # the name servers must know the replica holds the topic, or group b
        # leaves the route with its master (not the case this test is about)
        with Admin(namesrv=cluster.namesrv) as admin:
            entries = admin.routes.brokers(with_topic_names=True)
        return any(e.address == replica.address and "solo" in e.topic_names for e in entries)

    wait_for(replica_registered_solo)
    cluster.brokers["b"].kill()
    started = time.monotonic()
    produced = equeue(*ns, "--timeout-s", "3", "produce", "solo", "--key", "k", stdin="y\n")
    elapsed = time.monotonic() - started
    assert produced.returncode != 0, produced.stdout
    assert elapsed < 20, f"took {elapsed:.1f} s: {produced.stderr}"
    assert "broker group 'b' has no reachable master" in produced.stderr, produced.stderr


@pytest.mark.timeout(300)
def test_a_broker_killed_and_restarted(cluster: LocalCluster) -> None:
    namesrv = cluster.namesrv
    with Admin(namesrv=namesrv) as admin:
        admin.create_topic("jobs", queues=2)
        wait_for(lambda: len(admin.route("jobs").queues()) == 6)
        writable = admin.route("jobs").queues("writable")
    acked: set[tuple[str, int, int]] = set()
    config = fast_config(namesrv, route_refresh_s=0.5)
    with Producer(config=config) as producer:
        for i in range(20):
            acked.update((r.broker_id, r.queue_id, r.offset) for r in producer.send_batch(
                "jobs", [b"before-%d" % i] * 5))  # fmt: skip
        cluster.brokers["b"].kill()
        # Keyless batches go on, on the other brokers.
        for i in range(40):
            results = producer.send_batch("jobs", [b"during-%d" % i] * 5)
            acked.update((r.broker_id, r.queue_id, r.offset) for r in results)
            assert results[0].broker_id in ("a", "c")
        # A key of b's fails, naming b.
        key = next(b"key-%d" % i for i in range(1000)
                   if writable[key_queue(b"key-%d" % i, 6)][0] == "b")  # fmt: skip
        with pytest.raises(BrokerUnavailable, match="broker 'b'"):
            producer.send_batch("jobs", [b"keyed"], keys=[key])
        cluster.brokers["b"].start()
        with Admin(namesrv=namesrv) as admin:
            wait_for(lambda: len(admin.route("jobs").queues()) == 6)
        results = producer.send_batch("jobs", [b"keyed"], keys=[key])
        assert results[0].broker_id == "b"
        acked.add((results[0].broker_id, results[0].queue_id, results[0].offset))
    with Consumer(config=fast_config(namesrv), group="g", topics=["jobs"], start="earliest") as c:
        got = read_all(c, len(acked))
    assert {(m.broker_id, m.queue_id, m.offset) for m in got} == acked


@pytest.mark.timeout(300)
def test_clients_keep_working_with_the_name_servers_down(cluster: LocalCluster) -> None:
    namesrv = cluster.namesrv
    with Admin(namesrv=namesrv) as admin:
        admin.create_topic("logs", queues=1)
        wait_for(lambda: len(admin.route("logs").queues()) == 3)
    config = fast_config(namesrv, route_refresh_s=0.2)
    producer = Producer(config=config)
    consumer = Consumer(config=config, group="g", topics=["logs"], start="earliest")
    try:
        producer.send_batch("logs", [b"first"] * 3, keys=[b"x", b"y", b"z"])
        cluster.namesrvs[0].kill()
        time.sleep(0.3)  # routes are due for a refresh: the second name server answers
        producer.send_batch("logs", [b"second"] * 3)
        cluster.namesrvs[1].kill()
        time.sleep(0.3)  # none answers: the cached routes serve
        for _ in range(5):
            producer.send_batch("logs", [b"third"] * 2, keys=[b"x", b"q"])
            producer.send_batch("logs", [b"third"] * 2)
        got = read_all(consumer, 3 + 3 + 20)
        assert len(got) == 26
        consumer.commit()
    finally:
        producer.close()
        consumer.close()
    # A new client with every name server down cannot find anything, and says so.
    with pytest.raises(BrokerUnavailable, match="no name server answers"), \
            Producer(config=fast_config(namesrv)) as fresh:  # fmt: skip
        fresh.send_batch("logs", [b"x"])
