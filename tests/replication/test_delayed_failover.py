"""Delayed messages fail over: a master holding pending delayed messages is
SIGKILLed once its replica has copied them; the replica, promoted by hand
(SetRole) or elected through ZooKeeper, delivers every one exactly once and
none before its time (a replica that delivered on its own would have written
deliveries its master also writes: duplicates).

The promotion by hand is the issue's full case: 100,000 messages due 3 to
60 s after they were sent, the master killed part-way through delivering
them (a quarter delivered and copied); the election kills a master before any
delivery, with fewer messages.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_zk import ZooKeeperProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.records import Message
from tests.broker.delayed_support import error_of, now_ms, produce, pull
from tests.support.raw_client import RawClient
from tests.support.waits import wait_for

GROUP = "delayed-group"


def read_all(client: RawClient, out: list[Message], ends: list[int]) -> int:
    while True:
        messages, reply = pull(client, "timed", ends[0])
        out += messages
        ends[0] = reply.next_offset
        if not messages:
            return len(out)


def produce_pending(client: RawClient, count: int, latest_ms: int) -> dict[bytes, int]:
    """``count`` messages due 3 s to ``latest_ms`` from now; value -> due time."""
    rng = random.Random(27)
    due: dict[bytes, int] = {}
    for start in range(0, count, 500):
        values = [b"m%06d" % i for i in range(start, start + 500)]
        times = [now_ms() + rng.randint(3_000, latest_ms) for _ in values]
        produce(client, "timed", values, deliver_at_ms=times)
        due.update(zip(values, times, strict=True))
    return due


def check_delivered_once(client: RawClient, due: dict[bytes, int]) -> None:
    got: list[Message] = []
    ends = [0]
    wait_for("every delivery", lambda: read_all(client, got, ends) >= len(due), 180)
    wait_for("nothing pending", lambda: client.stats().delayed_pending == 0, 30)
    read_all(client, got, ends)  # anything more would be a duplicate
    copies = Counter(m.value for m in got)
    assert set(copies) == set(due)
    assert max(copies.values()) == 1, copies.most_common(3)
    assert not [m for m in got if m.store_timestamp_ms < due[m.value]]


@pytest.mark.slow  # about 70 s: two brokers, a kill, a promotion, deliveries over 60 s
@pytest.mark.timeout(420)
def test_the_promoted_replica_delivers_the_pending_messages(tmp_path: Path) -> None:
    flags = ("--broker-name", GROUP)
    master = BrokerProcess(tmp_path / "m", *flags)
    master.start()
    replica = BrokerProcess(tmp_path / "r", *flags, "--role", "replica", "--master", master.address)
    try:
        replica.start()
        mc = RawClient(master.address)
        mc.admin.CreateTopic(pb.CreateTopicRequest(name="timed", queue_count=1), timeout=10)
        due = produce_pending(mc, 100_000, 60_000)
        rc = RawClient(replica.address)
        end = mc.stats().log_end_position
        wait_for("the replica to copy them", lambda: rc.stats().log_end_position >= end, 60)
        assert rc.stats().delayed_pending > len(due) // 2  # the replica holds them too
        # The master delivers a quarter of them; the replica copies those deliveries.
        wait_for("a quarter delivered", lambda: mc.stats().delayed_pending <= 75_000, 120)
        end = mc.stats().log_end_position
        wait_for("the replica to copy them", lambda: rc.stats().log_end_position >= end, 60)
        # A replica takes no Nack, cancel or dead-letter call: they write.
        for call, request in (
            (rc.broker.Nack, pb.NackRequest(group="g", entries=[pb.NackEntry(topic="timed")])),
            (rc.broker.CancelDelayed, pb.CancelDelayedRequest(message_id="x-0000000000000000")),
            (rc.admin.PurgeDeadLetters, pb.PurgeDeadLettersRequest(group="g")),
        ):
            error = error_of(lambda c=call, r=request: c(r, timeout=10))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
        master.kill()
        mc.close()
        rc.admin.SetRole(pb.SetRoleRequest(role="master", epoch=1), timeout=10)
        check_delivered_once(rc, due)
        rc.close()
    finally:
        master.kill()
        replica.kill()


@pytest.mark.slow  # about 25 s: ZooKeeper, two brokers, a kill, an election
@pytest.mark.timeout(240)
def test_the_elected_replica_delivers_the_pending_messages(
    tmp_path: Path, zookeeper_factory: Callable[[], ZooKeeperProcess]
) -> None:
    zk = zookeeper_factory()
    flags = ("--broker-name", GROUP, "--zookeeper", f"{zk.hosts}/delayed",
             "--zk-session-timeout-ms", "2000")  # fmt: skip
    first, second = BrokerProcess(tmp_path / "a", *flags), BrokerProcess(tmp_path / "b", *flags)
    try:
        first.start()
        wait_for("a master", lambda: stats_of(first).role == "master", 30)
        second.start()
        fc = RawClient(first.address)
        fc.admin.CreateTopic(pb.CreateTopicRequest(name="timed", queue_count=1), timeout=10)
        due = produce_pending(fc, 2_000, 8_000)
        sc = RawClient(second.address)
        end = fc.stats().log_end_position
        # In sync (an election takes only an in-sync replica) with every record.
        wait_for(
            "the replica in sync",
            lambda: len(fc.stats().in_sync) == 2 and sc.stats().log_end_position >= end,
            30,
        )
        first.kill()
        fc.close()
        wait_for("the replica elected", lambda: stats_of(second).role == "master", 60)
        check_delivered_once(sc, due)
        sc.close()
    finally:
        first.kill()
        second.kill()


def stats_of(broker: BrokerProcess) -> pb.BrokerStats:
    client = RawClient(broker.address)
    try:
        return client.try_stats() or pb.BrokerStats()
    finally:
        client.close()
