"""A cluster with a broker down (issue 26): real name servers and brokers.

- A keyed write whose group has no replica gives up within the client's
  ``timeout_s`` (not ``failover_timeout_s``), naming the group unreachable;
  one whose group's registration expires meanwhile says so (down), at once.
- Once a broker's registration expires, ``topics list``, ``topics
  describe``, ``groups describe`` (Admin and CLI) say the view is partial
  and name the group, instead of silently dropping its queues.
- ``cluster list`` shows a SIGKILLed member as unreachable at once, then
  down; the name server's own suspect state follows a late registration.
- A producer waiting for a group's new master logs once when it starts
  waiting and once when it has one.
- ``stats`` with ``--namesrv`` shows every member and marks those it could
  not reach (table and ``--json``).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from equeue_broker.namesrv.routes import RouteTable
from equeue_broker.replication.follower import Failures
from equeue_broker.testing import BrokerProcess, LocalCluster
from equeue_proto.protocol import key_queue
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, BrokerUnavailable, ClientConfig, NotFoundError, Producer
from equeue_spark.client.route import Route
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow

EXPIRY_MS = 3000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    started = LocalCluster(
        tmp_path,
        broker_flags=("--flush", "sync", "--register-interval-ms", "300"),
        namesrv_flags=("--broker-expiry-ms", str(EXPIRY_MS)),
    )
    try:
        yield started.start(1, ("a", "b"))
    finally:
        started.kill()


def equeue(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "equeue_spark.cli", *args],
        input=stdin, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def routed(admin: Admin, topic: str) -> Route | None:
    """The topic's route, None until a broker registered it (registrations are asynchronous)."""
    try:
        return admin.route(topic)
    except NotFoundError:
        return None


def topic_on_both(cluster: LocalCluster, topic: str) -> list[tuple[str, int]]:
    with Admin(namesrv=cluster.namesrv) as admin:
        admin.create_topic(topic, queues=2)

        def both() -> Route | None:
            route = routed(admin, topic)
            return route if route is not None and len(route.queues()) == 4 else None

        return wait_for("both brokers in the route", both).queues("writable")


def key_on(writable: list[tuple[str, int]], broker: str) -> bytes:
    return next(
        k for k in (b"key-%d" % i for i in range(1000))
        if writable[key_queue(k, len(writable))][0] == broker
    )  # fmt: skip


def expired(cluster: LocalCluster, broker: str) -> None:
    """Wait until the name servers route no queue of ``broker`` (its registration expired)."""
    with Admin(namesrv=cluster.namesrv) as admin:
        wait_for(
            f"{broker} to expire",
            lambda: broker not in {b.broker_name for b in admin.cluster_brokers()},
            timeout_s=30,
        )


@pytest.mark.timeout(180)
def test_keyed_write_to_a_dead_group_fails_within_the_clients_timeout(
    cluster: LocalCluster,
) -> None:
    writable = topic_on_both(cluster, "orders")
    key = key_on(writable, "b")
    # A group of one (no replica): nothing can fail over, so the call's own
    # timeout_s bounds the wait, not failover_timeout_s (60 s here).
    config = ClientConfig(namesrv=cluster.namesrv, timeout_s=2.0, failover_timeout_s=60.0)
    with Producer(config=config) as producer:
        producer.send_batch("orders", [b"before"], keys=[key])
        cluster.brokers["b"].kill()
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable) as raised:
            producer.send_batch("orders", [b"during"], keys=[key])
        elapsed = time.monotonic() - started
    message = str(raised.value)
    assert "broker group 'b' is unreachable" in message, message
    assert "no replica to fail over to" in message and "timeout_s=2" in message, message
    assert elapsed < 15, f"took {elapsed:.1f} s (timeout_s=2): {message}"
    # Its registration expires while a write waits: said at once, naming it as
    # down (not "topic 'orders' has no queues on broker 'b'").
    cluster.brokers["b"].start()
    with Admin(namesrv=cluster.namesrv) as admin:
        wait_for(
            "b back", lambda: (r := routed(admin, "orders")) is not None and len(r.queues()) == 4
        )
    config = ClientConfig(namesrv=cluster.namesrv, timeout_s=60.0, failover_timeout_s=60.0)
    with Producer(config=config) as producer:
        producer.send_batch("orders", [b"again"], keys=[key])
        cluster.brokers["b"].kill()
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable) as raised:
            producer.send_batch("orders", [b"during"], keys=[key])
        elapsed = time.monotonic() - started
    message = str(raised.value)
    assert "broker group 'b' is unreachable: the name servers no longer list it" in message
    assert "down: its registration expired" in message, message
    assert elapsed < 30, f"took {elapsed:.1f} s (expiry 3 s): {message}"


@pytest.mark.timeout(180)
def test_partial_views_name_the_missing_group(cluster: LocalCluster) -> None:
    ns = ["--namesrv", cluster.namesrv]
    writable = topic_on_both(cluster, "orders")
    with Producer(config=ClientConfig(namesrv=cluster.namesrv)) as producer:
        keys = [key_on(writable, "a"), key_on(writable, "b")]
        producer.send_batch("orders", [b"x"] * 20, keys=keys * 10)
    consumed = equeue(*ns, "consume", "orders", "--group", "billing", "--max", "4")
    assert consumed.returncode == 0, consumed.stderr
    with Admin(namesrv=cluster.namesrv) as admin:
        admin.create_topic("only-b", queues=1, brokers=["b"])
        wait_for("b to register only-b", lambda: routed(admin, "only-b"))
    cluster.brokers["b"].kill()
    expired(cluster, "b")
    with Admin(namesrv=cluster.namesrv) as admin:
        topics = {t.name: t for t in admin.list_topics()}
        assert list(topics["orders"].unreachable_brokers) == ["b"]
        assert {q.broker for q in topics["orders"].queues} == {"a"}
        assert list(topics["only-b"].unreachable_brokers) == ["b"] and not topics["only-b"].queues
        assert list(admin.describe_topic("orders").unreachable_brokers) == ["b"]
        group = admin.describe_group("billing")
        assert list(group.unreachable_brokers) == ["b"]
        assert {q.broker for q in group.queues} == {"a"}
        assert admin.down_brokers().keys() == {"b"}
    listed = equeue(*ns, "topics", "list")
    assert listed.returncode == 0, listed.stderr
    assert "partial: broker group b unreachable (down: not heard from for" in listed.stdout
    assert "only-b" in listed.stdout
    as_json = json.loads(equeue(*ns, "--json", "topics", "list").stdout)
    assert [u["broker"] for u in as_json["unreachable_brokers"]] == ["b"]
    described = equeue(*ns, "groups", "describe", "billing")
    assert described.returncode == 0, described.stderr
    assert "partial: broker group b unreachable" in described.stdout
    groups = equeue(*ns, "groups", "list")
    assert "partial: broker group b unreachable" in groups.stdout, groups.stdout
    topic = equeue(*ns, "topics", "describe", "orders")
    assert "partial: broker group b unreachable" in topic.stdout, topic.stdout
    routes = equeue(*ns, "cluster", "routes", "orders")
    assert "down: b" in routes.stdout, routes.stdout


@pytest.mark.timeout(180)
def test_cluster_list_shows_a_killed_member_at_once(cluster: LocalCluster) -> None:
    ns = ["--namesrv", cluster.namesrv]
    before = json.loads(equeue(*ns, "--json", "cluster", "list").stdout)["brokers"]
    assert {b["broker_name"]: b["state"] for b in before} == {"a": "live", "b": "live"}
    cluster.brokers["b"].kill()
    killed = time.monotonic()
    # At once: the probe does not answer (no waiting for the name servers).
    listed = equeue(*ns, "cluster", "list")
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith("b "))
    # "down" only if the command itself outlived the 3 s expiry (a loaded machine).
    late = time.monotonic() - killed > EXPIRY_MS / 1000
    assert "unreachable" in row or (late and "down" in row), listed.stdout
    assert "STATE" in listed.stdout.splitlines()[0]
    expired(cluster, "b")
    after = json.loads(equeue(*ns, "--json", "cluster", "list").stdout)["brokers"]
    assert {b["broker_name"]: b["state"] for b in after} == {"a": "live", "b": "down"}


def test_name_server_marks_a_late_registration_suspect() -> None:
    now = [0.0]
    table = RouteTable(expiry_s=30.0, clock=lambda: now[0])
    request = pb.RegisterBrokerRequest(
        cluster="c", broker_name="b", address="127.0.0.1:5000", instance_id="i", role="master"
    )
    request.topics.add(name="t", queues=[pb.RouteQueue(queue_id=0, writable=True)])
    for t in (0.0, 1.0, 2.0, 3.0):  # every second
        now[0] = t
        table.register(request)
    now[0] = 4.9
    assert [b.state for b in table.brokers()] == ["live"]
    now[0] = 5.1  # 2.1 s late: more than 1.5 x 1 s + 0.5 s
    assert [b.state for b in table.brokers()] == ["suspect"]
    assert table.brokers()[0].silent_ms == 2100
    now[0] = 34.0  # expired: out of routes, remembered as down
    assert table.brokers() == []
    (down,) = table.brokers(include_down=True, with_topic_names=True)
    assert (down.state, list(down.topic_names)) == ("down", ["t"])
    with pytest.raises(Exception, match="its broker groups are down: b"):
        table.route("t")
    table.register(request)  # back: no longer down
    assert [b.state for b in table.brokers(include_down=True)] == ["live"]
    assert not table.route("t").down_brokers


def copied(admin: Admin) -> bool:
    try:
        return admin.describe_topic("solo").queues[0].end_offset == 1
    except NotFoundError:  # the topic not replicated yet
        return False


@pytest.mark.timeout(240)
def test_a_producer_says_once_that_it_waits_for_a_new_master(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # Group b gets a replica: with its master gone, the group waits for a new one.
    replica = BrokerProcess(
        cluster.root / "broker-b-replica", "--broker-name", "b", "--namesrv", cluster.namesrv,
        *cluster.broker_flags, "--role", "replica", "--master", cluster.brokers["b"].address,
    )  # fmt: skip
    cluster.brokers["b-replica"] = replica
    replica.start()
    with Admin(namesrv=cluster.namesrv) as admin:
        admin.create_topic("solo", queues=1, brokers=["b"])
        wait_for(
            "b's replica in the route",
            lambda: (
                (r := routed(admin, "solo")) is not None
                and list(r.brokers[0].replica_addresses) == [replica.address]
            ),
        )
    config = ClientConfig(namesrv=cluster.namesrv, timeout_s=2.0, failover_timeout_s=90.0)
    producer = Producer(config=config)
    producer.send_batch("solo", [b"before"], keys=[b"k"])
    with Admin(replica.address) as copy:
        wait_for("the replica to copy it", lambda: copied(copy))
    cluster.brokers["b"].kill()
    caplog.set_level(logging.INFO, logger="equeue_spark.client.routing")
    outcome: list[object] = []
    sender = threading.Thread(
        target=lambda: outcome.append(producer.send_batch("solo", [b"after"], keys=[b"k"]))
    )
    sender.start()
    try:
        wait_for(
            "the producer to say it waits",
            lambda: any("writes wait up to" in r.getMessage() for r in caplog.records),
            timeout_s=30,
        )
        with Admin(replica.address) as promote:
            promote.set_role("master", epoch=2)
        sender.join(timeout=90)
    finally:
        producer.close()
    assert not sender.is_alive() and outcome, "the write did not end on the new master"
    lines = [r.getMessage() for r in caplog.records if r.name == "equeue_spark.client.routing"]
    waits = [line for line in lines if "writes wait up to" in line]
    assert len(waits) == 1, lines
    assert "broker group 'b'" in waits[0] and "does not answer" in waits[0]
    assert any(f"writing to master {replica.address}" in line for line in lines), lines


@pytest.mark.timeout(180)
def test_cluster_wide_stats_mark_unreachable_members(cluster: LocalCluster) -> None:
    ns = ["--namesrv", cluster.namesrv]
    topic_on_both(cluster, "orders")
    table = equeue(*ns, "stats")
    assert table.returncode == 0, table.stderr
    header = table.stdout.splitlines()[0].split()
    assert header[:5] == ["BROKER", "ROLE", "EPOCH", "ADDRESS", "STATE"]
    assert "DISK" in header and "PRODUCE/S" in header
    cluster.brokers["b"].kill()
    table = equeue(*ns, "stats")
    assert table.returncode == 0, table.stderr
    # Unreachable while listed; down once its registration expired (3 s here).
    assert f"no stats from b ({cluster.brokers['b'].address}): " in table.stdout, table.stdout
    doc = json.loads(equeue(*ns, "--json", "stats").stdout)
    by_name = {m["broker"]: m for m in doc["brokers"]}
    assert by_name["a"]["stats"]["topics"] == 1 and by_name["a"]["state"] == "live"
    assert by_name["b"]["stats"] is None and by_name["b"]["state"] in ("unreachable", "down")
    assert [u["broker"] for u in doc["unreachable"]] == ["b"]
    expired(cluster, "b")
    doc = json.loads(equeue(*ns, "--json", "stats").stdout)
    assert {m["broker"]: m["state"] for m in doc["brokers"]} == {"a": "live", "b": "down"}


def test_a_replicas_repeated_failures_are_logged_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A replica whose master is gone retries every 2 s: it warns once, then
    once a minute with the count, and once when replication resumes."""
    now = [0.0]
    failures = Failures(every_s=60.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="equeue.replication")
    for attempt in range(40):  # 80 s of attempts every 2 s
        now[0] = attempt * 2.0
        failures.failed("10.0.0.1:5000", "replication from %s: %s", "10.0.0.1:5000", "UNAVAILABLE")
    failures.resumed()
    lines = [r.getMessage() for r in caplog.records if r.name == "equeue.replication"]
    assert len(lines) == 3, lines
    assert "repeats are summarised every 60 s" in lines[0]
    assert "(30 failed attempts in 60 s, still retrying)" in lines[1]
    assert lines[2] == "replication from 10.0.0.1:5000 resumed after 40 failed attempts over 78.0 s"
