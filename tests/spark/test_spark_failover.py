"""The Spark exactly-once kill test with the sink's master killed mid-run (issue 18).

A streaming query copies topic A of a plain broker into topic B of a replicated
group: three brokers of one broker name, elected through ZooKeeper
(``--zookeeper``, 2 s sessions) with ``--replication sync``, registered with a
name server that the sink routes through (option ``namesrv``; exactly-once, the
default). Once the sink has committed a few micro-batches on the group, its
master is SIGKILLed. The query either rides the failover out (the writer
retries on the group's new master) or fails; a failed query is started again
from its checkpoint. The killed broker is restarted and rejoins as a replica.
An AvailableNow run from the same checkpoint then copies the rest, and B, read
from the group's final master, must hold every row of A exactly once (equal
multisets of key and value), and every member's copy of B must be the same.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from equeue_broker.testing import BrokerProcess
from equeue_broker.testing_group import Group, GroupConfig, Member, require_flags
from equeue_spark.client import Admin, EqueueError, NotFoundError, Producer
from tests.support.topics import topic_contents

pytestmark = pytest.mark.slow

ROWS = 12_000
BATCH = 1_000
QUEUES = 2
PER_TRIGGER = "1500"
RUN_S = 40.0
"""Budget for the streaming query to finish copying after the kill."""


def contents(address: str, topic: str) -> collections.Counter[tuple[bytes | None, bytes]]:
    return topic_contents(address, topic, QUEUES)


def stored(member: Member, topic: str) -> int:
    """Messages in ``topic`` on ``member`` (0 when it does not answer)."""
    try:
        with Admin(member.address) as admin:
            return sum(q.end_offset for q in admin.describe_topic(topic).queues)
    except EqueueError:
        return 0


def sink_batch(member: Member) -> int:
    """The last micro-batch the sink committed on ``member`` (-1: none yet)."""
    with Admin(member.address) as admin:
        sinks = admin.list_transactions().sinks
    return max((s.batch_id for s in sinks), default=-1)


@pytest.fixture
def group(tmp_path: Path, zk_hosts: str) -> Iterator[Group]:
    require_flags("the Spark failover test", "--zookeeper", "--replication")
    config = GroupConfig(
        replication="sync", session_timeout_ms=2000, namesrv=True, zk_hosts=zk_hosts,
        extra_flags=("--register-interval-ms", "300"),
    )  # fmt: skip
    started = Group(tmp_path / "group", config)
    try:
        yield started.start()
    finally:
        started.stop()


def start_query(spark: Any, source: str, namesrv: str, checkpoint: Path, now: bool) -> Any:
    stream = (
        spark.readStream.format("equeue").option("broker", source).option("topic", "A")
        .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", PER_TRIGGER)
        .load()
    )  # fmt: skip
    writer = (
        stream.select("key", "value").writeStream.format("equeue")
        .option("namesrv", namesrv).option("topic", "B")
        .option("checkpointLocation", str(checkpoint))
    )  # fmt: skip
    if now:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime="300 milliseconds").start()


def wait_until(what: str, check: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.1)


@pytest.mark.timeout(240)
def test_exactly_once_sink_survives_its_masters_sigkill(
    spark: Any, group: Group, tmp_path: Path
) -> None:
    assert group.namesrv is not None
    namesrv = group.namesrv.address
    source = BrokerProcess(tmp_path / "source", "--flush", "async")
    source.start()
    try:
        with Admin(source.address) as admin:
            admin.create_topic("A", queues=QUEUES)
        with Producer(source.address) as producer:
            for start in range(0, ROWS, BATCH):
                keys = [b"key-%d" % (i % 97) for i in range(start, start + BATCH)]
                producer.send_batch("A", [b"value-%d" % i for i in range(start, start + BATCH)],
                                    keys=keys)  # fmt: skip
        master = group.wait_master(60)
        with Admin(master.address) as admin:
            admin.create_topic("B", queues=QUEUES)

        def routed() -> bool:
            with Admin(namesrv=namesrv) as admin:
                try:
                    return len(admin.route("B").queues()) == QUEUES
                except NotFoundError:
                    return False

        wait_until("B's route on the name server", routed, 30)
        group.in_sync(60)

        checkpoint = tmp_path / "checkpoint"
        query = start_query(spark, source.address, namesrv, checkpoint, now=False)
        restarts = 0
        try:
            # Mid-run: the sink has committed two micro-batches on the master.
            wait_until("two committed micro-batches", lambda: sink_batch(master) >= 1, 60)
            group.kill(master)
            new_master = group.wait_master(30, exclude=[master])
            group.restart(master)  # rejoins as a replica
            deadline = time.monotonic() + RUN_S
            while time.monotonic() < deadline:
                if not query.isActive:
                    print(f"query failed after the kill: {query.exception()}")
                    restarts += 1
                    assert restarts <= 3, "the query failed again and again"
                    query = start_query(spark, source.address, namesrv, checkpoint, now=False)
                if stored(new_master, "B") >= ROWS:
                    break  # everything copied (a replay would show as more, below)
                time.sleep(0.3)
        finally:
            query.stop()
        final = start_query(spark, source.address, namesrv, checkpoint, now=True)
        try:
            assert final.awaitTermination(120), "the AvailableNow run did not finish in 120 s"
        finally:
            final.stop()
        assert final.exception() is None, final.exception()

        master = group.in_sync(60)
        copied = contents(master.address, "B")
        expected = contents(source.address, "A")
        assert sum(expected.values()) == ROWS
        missing, extra = expected - copied, copied - expected
        assert not missing and not extra, (
            f"B differs from A: {sum(missing.values())} missing, {sum(extra.values())} extra "
            f"(query restarts: {restarts})"
        )
        for member in group.members:
            assert contents(member.address, "B") == copied, f"{member.name}'s copy of B differs"
        print(f"B holds every row of A once; query restarts after the kill: {restarts}; "
              f"master {master.name} after the failover")  # fmt: skip
    finally:
        source.stop()
