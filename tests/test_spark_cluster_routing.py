"""The Spark connector over a cluster (option ``namesrv``): two name servers, three brokers.

Batch and streaming reads (partitions per (broker, queue), the ``broker``
column, offsets naming brokers), group progress per broker, writes routed like
the producer, exactly-once writes spanning brokers, and the exactly-once
commit protocol when the driver dies between two brokers' commits.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from equeue_broker.testing import LocalCluster
from equeue_spark.client import Admin, Consumer, Message, Producer
from equeue_spark.client.consumer import ClusterConsumer
from equeue_spark.spark.offsets import from_json, incarnations, to_json
from equeue_spark.spark.options import WriteOptions
from equeue_spark.spark.write_task import commit_on_brokers, write_batches

pytestmark = pytest.mark.slow

BROKERS = ("a", "b", "c")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    started = LocalCluster(
        tmp_path_factory.mktemp("cluster"),
        broker_flags=("--flush", "sync", "--register-interval-ms", "300"),
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


def make_topic(cluster: LocalCluster, name: str, queues: int = 2) -> None:
    with Admin(namesrv=cluster.namesrv) as admin:
        admin.create_topic(name, queues=queues)
        wait_for(lambda: len(admin.route(name).queues()) == queues * len(BROKERS))


def read_cluster(cluster: LocalCluster, topic: str, count: int) -> list[Message]:
    with Consumer(namesrv=cluster.namesrv) as consumer:
        assert isinstance(consumer, ClusterConsumer)
        with Admin(namesrv=cluster.namesrv) as admin:
            for broker, queue in admin.route(topic).queues():
                consumer.assign(topic, [queue], broker)
        got: list[Message] = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            got += consumer.poll(0.3)
        got += consumer.poll(0.3)  # nothing more
    return got


def test_cluster_offsets_round_trip_and_stay_canonical() -> None:
    offsets = {("b/orders", 0): 5, ("a/orders", 1): 98, ("a/orders", 0): 120, ("orders", 3): 1}
    document = to_json(offsets, {"a/orders": 51, "b/orders": 90})
    assert json.dumps(document) == json.dumps(
        {"orders": {"3": 1, "a/0": 120, "a/1": 98, "b/0": 5,
                    "incarnation/a": 51, "incarnation/b": 90}}
    )  # fmt: skip
    assert from_json(document) == offsets
    assert incarnations(document) == {"a/orders": 51, "b/orders": 90}


@pytest.mark.timeout(600)
def test_batch_and_streaming_reads_over_three_brokers(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    make_topic(cluster, "clicks")
    keys = [b"user-%d" % i for i in range(600)]
    with Producer(namesrv=cluster.namesrv) as producer:
        producer.send_batch("clicks", [b"v-" + k for k in keys], keys=keys)
        for i in range(30):
            producer.send_batch("clicks", [b"plain-%d" % i] * 10)
    df = (
        spark.read.format("equeue")
        .option("namesrv", cluster.namesrv)
        .option("topic", "clicks")
        .load()
    )
    rows = df.select("broker", "queue", "offset", "key", "value").collect()
    assert len(rows) == 900
    assert {r.broker for r in rows} == set(BROKERS)
    assert len({(r.broker, r.queue, r.offset) for r in rows}) == 900
    assert df.rdd.getNumPartitions() == 6
    # Streaming with a group: AvailableNow, the offsets name brokers, lag 0 after.
    checkpoint = tmp_path / "checkpoint"
    out = tmp_path / "out"
    query = (
        spark.readStream.format("equeue").option("namesrv", cluster.namesrv)
        .option("topic", "clicks").option("startingOffsets", "earliest")
        .option("group", "spark-clicks").option("maxOffsetsPerTrigger", "400").load()
        .select("broker", "queue", "offset")
        .writeStream.format("parquet").option("path", str(out))
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(300)
    assert query.exception() is None
    streamed = spark.read.parquet(str(out)).collect()
    assert len(streamed) == 900
    names = [p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()]
    last = max(names, key=lambda p: int(p.name))
    document = json.loads(last.read_text().splitlines()[-1])
    assert sorted(document["clicks"]) == [
        "a/0", "a/1", "b/0", "b/1", "c/0", "c/1", "incarnation/a", "incarnation/b",
        "incarnation/c",
    ]  # fmt: skip
    with Admin(namesrv=cluster.namesrv) as admin:
        group = admin.describe_group("spark-clicks")
        assert {q.broker for q in group.queues} == set(BROKERS)
        assert group.total_lag == 0


@pytest.mark.timeout(600)
def test_exactly_once_write_over_the_cluster(spark: Any, cluster: LocalCluster) -> None:
    make_topic(cluster, "copy-src")
    make_topic(cluster, "copy-dst")
    keys = [b"k%d" % i for i in range(300)]
    with Producer(namesrv=cluster.namesrv) as producer:
        producer.send_batch("copy-src", [b"v" + k for k in keys], keys=keys)
    src = (
        spark.read.format("equeue")
        .option("namesrv", cluster.namesrv)
        .option("topic", "copy-src")
        .load()
    )
    # Batch write, exactly-once (the default): keys route like the producer's.
    src.select("key", "value").write.format("equeue").mode("append").option(
        "namesrv", cluster.namesrv
    ).option("topic", "copy-dst").save()
    got = read_cluster(cluster, "copy-dst", 300)
    assert sorted((m.key, m.value) for m in got) == sorted((k, b"v" + k) for k in keys)
    with Admin(namesrv=cluster.namesrv) as admin:
        writable = admin.route("copy-dst").queues("writable")
    from equeue_proto.protocol import key_queue

    for m in got:
        assert m.key is not None
        assert (m.broker_id, m.queue_id) == writable[key_queue(m.key, len(writable))]
    # A queue column needs a broker column beside it.
    with pytest.raises(Exception, match="broker column"):
        src.select("value", "queue").write.format("equeue").mode("append").option(
            "namesrv", cluster.namesrv
        ).option("topic", "copy-dst").save()


@pytest.mark.timeout(300)
def test_exactly_once_commit_completed_by_the_replay(cluster: LocalCluster) -> None:
    """The driver dies between two brokers' commits of a batch; the replay
    (restaged with a new run's transactions) commits the missing parts and
    the committed broker answers "already committed": every row once."""
    make_topic(cluster, "eo-sink", queues=1)
    import pyarrow as pa

    options = WriteOptions.parse(
        {"namesrv": cluster.namesrv, "topic": "eo-sink", "transactionalId": "eo-test"}
    )
    keys = [f"key-{i}".encode() for i in range(60)]
    table = pa.table({"key": keys, "value": [b"v-" + k for k in keys]})

    def stage(run: str) -> list[Any]:
        return [
            write_batches(options, iter(table.to_batches()), f"eo-test:7:{run}:{p}:0", p)
            for p in range(2)
        ]

    first = stage("run1")
    brokers = sorted({b for s in first for b in s.brokers})
    assert len(brokers) >= 2

    class DriverDied(Exception):
        pass

    def die_on_second(broker: str) -> None:
        if broker == brokers[1]:
            raise DriverDied(broker)

    with pytest.raises(DriverDied):
        commit_on_brokers(options, first, sink="eo-test", batch_id=7,
                          abort_prefix="eo-test:7:", before=die_on_second)  # fmt: skip
    replay = stage("run2")
    outcomes = commit_on_brokers(options, replay, sink="eo-test", batch_id=7,
                                 abort_prefix="eo-test:7:")  # fmt: skip
    assert outcomes[brokers[0]].already_committed
    assert not outcomes[brokers[1]].already_committed
    got = read_cluster(cluster, "eo-sink", 120)
    assert sorted(m.value for m in got) == sorted(b"v-" + k for k in keys * 2)


@pytest.mark.timeout(300)
def test_a_stream_keeps_an_unreachable_brokers_offsets(cluster: LocalCluster) -> None:
    """A broker down while a trigger is planned: its queues keep their offsets
    (no batch skips or re-reads them), the others advance; back, it resumes."""
    pytest.importorskip("pyspark")
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from equeue_spark.spark.options import ReadOptions
    from equeue_spark.spark.source import EqueueStreamReader

    make_topic(cluster, "resume", queues=1)
    options = ReadOptions.parse(
        {"namesrv": cluster.namesrv, "topic": "resume", "startingOffsets": "earliest",
         "timeoutMs": "3000"},
        streaming=True,
    )  # fmt: skip
    reader = EqueueStreamReader(options, None)  # type: ignore[arg-type]
    with Producer(namesrv=cluster.namesrv) as producer:
        for _ in range(9):
            producer.send_batch("resume", [b"x"] * 10)  # round robin: 30 per broker
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert from_json(end) == {("a/resume", 0): 30, ("b/resume", 0): 30, ("c/resume", 0): 30}
    cluster.brokers["b"].kill()
    try:
        with Producer(namesrv=cluster.namesrv) as producer:
            for _ in range(4):
                producer.send_batch("resume", [b"y"] * 10)  # only a and c take them
        later = reader.latestOffset(end, ReadAllAvailable())
        offsets = from_json(later)
        assert offsets[("b/resume", 0)] == 30  # kept, not dropped
        assert offsets[("a/resume", 0)] + offsets[("c/resume", 0)] == 100
        ranges = [p.value for p in reader.partitions(end, later)]
        assert {(r.topic, r.broker) for r in ranges} <= {
            ("resume", cluster.brokers[n].address) for n in ("a", "c")
        }  # fmt: skip
    finally:
        cluster.brokers["b"].start()
    with Admin(namesrv=cluster.namesrv) as admin:
        wait_for(lambda: len(admin.route("resume").queues()) == 3)
    with Producer(namesrv=cluster.namesrv) as producer:
        producer.send_batch("resume", [b"z"] * 3, keys=[b"1", b"2", b"3"])
    resumed = from_json(reader.latestOffset(later, ReadAllAvailable()))
    assert sum(resumed.values()) == 90 + 40 + 3
    reader.stop()


@pytest.mark.timeout(600)
def test_a_streaming_query_rides_out_a_broker_restart(spark: Any, cluster: LocalCluster) -> None:
    """A running query (memory sink) over three brokers: broker b is SIGKILLed
    while the query is idle, keyless produce goes on on a and c and the query
    keeps reading them; b restarts (sync flush: nothing lost), keyed messages
    reach it again, and the query reads everything exactly once."""
    make_topic(cluster, "live", queues=1)
    with Producer(namesrv=cluster.namesrv) as producer:
        for _ in range(6):
            producer.send_batch("live", [b"first"] * 10)
    query = (
        spark.readStream.format("equeue").option("namesrv", cluster.namesrv)
        .option("topic", "live").option("startingOffsets", "earliest")
        .option("timeoutMs", "5000").load()
        .select("broker", "queue", "offset", "value")
        .writeStream.format("memory").queryName("live_rows")
        .trigger(processingTime="300 milliseconds").start()
    )  # fmt: skip

    def seen() -> int:
        count: int = spark.sql("select count(*) from live_rows").collect()[0][0]
        return count

    try:
        wait_for(lambda: seen() == 60, 120)
        cluster.brokers["b"].kill()
        with Producer(namesrv=cluster.namesrv) as producer:
            for _ in range(6):
                assert producer.send_batch("live", [b"second"] * 10)[0].broker_id != "b"
        wait_for(lambda: seen() == 120, 120)
        cluster.brokers["b"].start()
        with Admin(namesrv=cluster.namesrv) as admin:
            wait_for(lambda: len(admin.route("live").queues()) == 3)
        keys = [b"k%d" % i for i in range(30)]
        with Producer(namesrv=cluster.namesrv) as producer:
            results = producer.send_batch("live", [b"third"] * 30, keys=keys)
        assert "b" in {r.broker_id for r in results}
        wait_for(lambda: seen() == 150, 120)
        assert query.exception() is None
        rows = spark.sql("select broker, queue, offset from live_rows").collect()
        assert len({(r.broker, r.queue, r.offset) for r in rows}) == 150
    finally:
        query.stop()


@pytest.mark.timeout(300)
def test_topic_patterns_tags_and_byte_limits_over_the_cluster(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    for name in ("pat-1", "pat-2"):
        make_topic(cluster, name, queues=1)
        with Producer(namesrv=cluster.namesrv) as producer:
            for i in range(12):
                tag = "x" if i % 2 else "y"
                producer.send_batch(name, [b"m"] * 5, tags=[tag] * 5)
    df = (
        spark.read.format("equeue").option("namesrv", cluster.namesrv)
        .option("topicPattern", "pat-.*").option("tags", "x").load()
    )  # fmt: skip
    rows = df.select("topic", "broker", "tag").collect()
    assert len(rows) == 60 and {r.tag for r in rows} == {"x"}
    assert {r.topic for r in rows} == {"pat-1", "pat-2"}
    assert {r.broker for r in rows} == set(BROKERS)
    query = (
        spark.readStream.format("equeue").option("namesrv", cluster.namesrv)
        .option("topic", "pat-1").option("startingOffsets", "earliest")
        .option("maxBytesPerTrigger", "2000").load().select("offset")
        .writeStream.format("memory").queryName("pat_bytes")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination(180)
    assert query.exception() is None
    assert spark.sql("select count(*) from pat_bytes").collect()[0][0] == 60
    assert sum(1 for p in query.recentProgress if p["numInputRows"]) >= 2
