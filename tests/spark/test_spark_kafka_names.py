"""A query written for Spark's Kafka source runs on equeue with two changes: the
format name and the address option (real broker, real SparkSession)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.errors import PySparkException
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import DataFrame, SparkSession

from equeue_broker.testing import BrokerProcess, LocalCluster
from equeue_spark.client import Admin, Producer
from equeue_spark.client.errors import NotFoundError
from equeue_spark.spark.options import ReadOptions
from equeue_spark.spark.planning import Planner
from equeue_spark.spark.progress import NAMES, offsets_behind

pytestmark = pytest.mark.slow  # make test-fast skips it

SparkError = (PySparkException, CapturedException)
Row = tuple[str, int, int]
"""(topic, queue, offset)"""


def as_equeue(options: dict[str, str], broker: BrokerProcess) -> dict[str, str]:
    """The one option a Kafka query changes (with the format name): the address."""
    renamed = dict(options)
    assert renamed.pop("kafka.bootstrap.servers") == "KAFKA:9092"
    renamed["broker"] = broker.address
    return renamed


def load(spark: SparkSession, options: dict[str, str], *, stream: bool = False) -> DataFrame:
    source = spark.readStream if stream else spark.read
    return source.format("equeue").options(**options).load()


def rows(df: DataFrame) -> set[Row]:
    return {(r.topic, r.queue, r.offset) for r in df.select("topic", "queue", "offset").collect()}


def produce(address: str, topic: str, per_queue: dict[int, int]) -> None:
    with Producer(address) as producer:
        for queue, count in per_queue.items():
            if count:
                values = [f"{topic}-{queue}-{i}".encode() for i in range(count)]
                producer.send_batch(topic, values, queue_ids=[queue] * count)


@dataclass
class Stamped:
    """A topic of 4 queues written in three rounds A, B, C, with store-time
    cuts ``t1`` (after A, at or before B) and ``t2`` (after B, at or before C)."""

    t1: int
    t2: int
    rounds: dict[str, set[Row]]


def stamped_topic(spark: SparkSession, broker: BrokerProcess, topic: str) -> Stamped:
    with Admin(broker.address) as admin:
        admin.create_topic(topic, queues=4)
    seen: set[Row] = set()
    rounds: dict[str, set[Row]] = {}
    cuts: list[int] = []
    last_ms = 0
    plan = (
        ("A", {0: 5, 1: 5, 2: 5, 3: 5}),
        ("B", {0: 4, 1: 4, 2: 0, 3: 4}),
        ("C", {0: 3, 1: 3, 2: 3, 3: 3}),
    )
    for name, per_queue in plan:
        if rounds:
            # A cut just after the last round's store times; the next round is
            # stored at or after it once the clock has passed it (polled: the
            # readiness condition is the clock itself, a few ms).
            cuts.append(last_ms + 1)
            deadline = time.monotonic() + 5
            while time.time() * 1000 <= cuts[-1] and time.monotonic() < deadline:
                time.sleep(0.001)
        produce(broker.address, topic, per_queue)
        read = load(spark, {"broker": broker.address, "topic": topic}).selectExpr(
            "topic", "queue", "offset", "unix_millis(storeTimestamp) AS ms"
        )
        stored = read.collect()
        everything = {(r.topic, r.queue, r.offset) for r in stored}
        new_ms = [r.ms for r in stored if (r.topic, r.queue, r.offset) not in seen]
        assert not cuts or min(new_ms) >= cuts[-1], "round stored before its cut"
        last_ms = max(r.ms for r in stored)
        rounds[name], seen = everything - seen, everything
    return Stamped(cuts[0], cuts[1], rounds)


def only(rows_: set[Row], *queues: int) -> set[Row]:
    return {r for r in rows_ if r[1] in queues}


@pytest.mark.timeout(300)
def test_a_kafka_streaming_query_runs_with_its_option_names(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = stamped_topic(spark, broker, "orders")
    # Written as for format("kafka"), verbatim: every queue named with its
    # starting time (Kafka requires all of them), queue 3 from the beginning.
    kafka_options = {
        "kafka.bootstrap.servers": "KAFKA:9092",
        "subscribe": "orders",
        "startingOffsetsByTimestamp": json.dumps(
            {"orders": {"0": topic.t1, "1": topic.t2, "2": topic.t1, "3": 0}}
        ),
        "minPartitions": "6",
        "maxOffsetsPerTrigger": "7",
        "failOnDataLoss": "true",
    }
    df = load(spark, as_equeue(kafka_options, broker), stream=True)
    query = (
        df.select("topic", "queue", "offset")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "sink"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180), "the AvailableNow query did not finish in time"
    assert query.exception() is None
    got = {
        (r.topic, r.queue, r.offset) for r in spark.read.parquet(str(tmp_path / "sink")).collect()
    }
    a, b, c = topic.rounds["A"], topic.rounds["B"], topic.rounds["C"]
    # Queue 2 had nothing in round B: its time t1 finds C's first record.
    expected = only(b | c, 0, 2) | only(c, 1) | only(a | b | c, 3)
    assert got == expected
    batches = [p for p in query.recentProgress if p.numInputRows > 0]
    assert len(batches) >= len(expected) // 7  # maxOffsetsPerTrigger=7 admitted in steps
    # Kafka's offsets-behind figures from the progress (fact 1: not in metrics):
    # behind while maxOffsetsPerTrigger holds the query back, caught up at the end.
    figures = [offsets_behind(p.sources[0]) for p in query.recentProgress]
    assert all(set(f) == set(NAMES) for f in figures)
    assert int(figures[0]["maxOffsetsBehindLatest"]) > 0
    assert figures[-1]["maxOffsetsBehindLatest"] == "0"


@pytest.mark.timeout(240)
def test_a_batch_read_with_assign_and_times_per_queue(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    topic = stamped_topic(spark, broker, "orders")
    kafka_options = {
        "kafka.bootstrap.servers": "KAFKA:9092",
        "assign": json.dumps({"orders": [1, 3]}),
        "startingOffsetsByTimestamp": json.dumps({"orders": {"1": topic.t1, "3": 0}}),
        "endingOffsetsByTimestamp": json.dumps({"orders": {"1": topic.t2, "3": topic.t2}}),
    }
    got = rows(load(spark, as_equeue(kafka_options, broker)))
    a, b = topic.rounds["A"], topic.rounds["B"]
    assert got == only(b, 1) | only(a | b, 3)

    # An assigned queue the topic does not have fails a batch read naming it.
    missing = {"broker": broker.address, "assign": json.dumps({"orders": [1, 7]})}
    with pytest.raises(SparkError, match="assign names orders/7, which does not exist"):
        load(spark, missing).collect()


def partitions_and_rows(spark: SparkSession, options: dict[str, str]) -> tuple[int, set[Row]]:
    df = load(spark, options)
    return df.rdd.getNumPartitions(), rows(df)


@pytest.mark.timeout(240)
def test_min_partitions_splits_as_kafka_does(spark: SparkSession, broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("equal", queues=4)
        admin.create_topic("skewed", queues=4)
    produce(broker.address, "equal", {q: 100 for q in range(4)})
    produce(broker.address, "skewed", {0: 700, 1: 100, 2: 100, 3: 100})
    base = {"broker": broker.address}
    for topic, split in (("equal", 12), ("skewed", 10)):  # Kafka: round(2.5) = 3 per queue
        plain = partitions_and_rows(spark, {**base, "subscribe": topic})
        assert plain[0] == 4
        assert partitions_and_rows(spark, {**base, "subscribe": topic, "minPartitions": "10"}) == (
            split,
            plain[1],
        )
    # maxRecordsPerPartition then cuts Kafka's pieces: 7 x 100 and 3 x 100 -> 20 of 50.
    cut = {**base, "subscribe": "skewed", "minPartitions": "10", "maxRecordsPerPartition": "50"}
    assert partitions_and_rows(spark, cut)[0] == 20


@pytest.mark.timeout(240)
def test_starting_offsets_by_timestamp_strategy(spark: SparkSession, broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("sparse", queues=2)
    produce(broker.address, "sparse", {0: 10})  # queue 1 stays empty
    options = {
        "broker": broker.address,
        "subscribe": "sparse",
        "startingOffsetsByTimestamp": json.dumps({"sparse": {"0": 0, "1": 0}}),
    }
    error = {**options, "startingOffsetsByTimestampStrategy": "error"}
    no_match = r"startingOffsetsByTimestamp: sparse/1 has no record stored at or after 0 \("
    with pytest.raises(SparkError, match=no_match + r"1970-01-01T00:00:00Z\)"):
        load(spark, error).collect()
    latest = {**options, "startingOffsetsByTimestampStrategy": "latest"}
    assert rows(load(spark, latest)) == {("sparse", 0, o) for o in range(10)}
    # The strategy applies to startingTimestamp too (Kafka's rule).
    timed: dict[str, Any] = {"broker": broker.address, "subscribe": "sparse"}
    timed |= {"startingTimestamp": "0", "startingOffsetsByTimestampStrategy": "error"}
    with pytest.raises(SparkError, match="startingTimestamp: sparse/1 has no record"):
        load(spark, timed).collect()


@pytest.mark.timeout(60)
def test_an_assigned_queue_created_later_is_read_by_a_stream(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """Planning alone (no session): a stream warns once about an assigned queue
    that does not exist, then reads it from its earliest offset once it does."""
    with Admin(broker.address) as admin:
        admin.create_topic("grows", queues=2)
    produce(broker.address, "grows", {0: 3, 1: 4})
    options = {"broker": broker.address, "assign": '{"grows": [0, 2]}'}
    stream = Planner(ReadOptions.parse(options, streaming=True))
    batch = Planner(ReadOptions.parse(options, streaming=False))
    try:
        with caplog.at_level("WARNING", logger="equeue.spark"):
            first = stream.listing()
            stream.listing()
        warned = [r.getMessage() for r in caplog.records if "assign names" in r.getMessage()]
        assert len(warned) == 1 and "grows/2, which does not exist" in warned[0]
        assert set(first.queues) == {("grows", 0)}  # queue 1 exists but is not assigned
        with pytest.raises(NotFoundError, match="assign names grows/2, which does not exist"):
            batch.listing()
        with Admin(broker.address) as admin:
            admin.add_queues("grows", 1)
        produce(broker.address, "grows", {2: 5})
        later = stream.listing()
        assert set(later.queues) == {("grows", 0), ("grows", 2)}
        ends = {k: q.end_offset for k, q in later.queues.items()}
        ranges = stream.ranges({("grows", 0): 3}, ends, later)
        assert [(r.queue_id, r.start, r.end) for r in ranges] == [(2, 0, 5)]
    finally:
        stream.close()
        batch.close()


@pytest.mark.timeout(120)
def test_assign_and_times_per_queue_over_a_cluster(tmp_path: Path) -> None:
    """Planning alone over two broker groups: ``assign`` names queues
    ``BROKER/QUEUE``, and so do the ``*ByTimestamp`` JSONs."""
    cluster = LocalCluster(tmp_path / "cluster", broker_flags=("--flush", "sync"))
    try:
        cluster.start(1, ("a", "b"))
        with Admin(namesrv=cluster.namesrv) as admin:
            admin.create_topic("orders", queues=2)
            deadline = time.monotonic() + 20
            while len(admin.route("orders").queues()) < 4:
                assert time.monotonic() < deadline, "the route never listed 4 queues"
                time.sleep(0.05)
        with Producer(namesrv=cluster.namesrv) as producer:
            for broker in ("a", "b"):
                for queue in (0, 1):
                    producer.send_batch("orders", [b"x"] * 6, queue_ids=[queue] * 6,
                                        brokers=[broker] * 6)  # fmt: skip
        future = int(time.time() * 1000) + 3_600_000
        options = {
            "namesrv": cluster.namesrv,
            "assign": '{"orders": ["a/0", "b/1"]}',
            "startingOffsetsByTimestamp": json.dumps({"orders": {"a/0": 0, "b/1": future}}),
            "startingOffsets": '{"orders": {"a/0": 2}}',  # overridden for a/0
        }
        planner = Planner(ReadOptions.parse(options, streaming=False))
        try:
            o = planner.options
            starts = planner.resolve(o.starting, o.starting_timestamp_ms, end=False)
            ends = planner.resolve(o.ending, o.ending_timestamp_ms, end=True)
            assert starts == {("a/orders", 0): 0, ("b/orders", 1): 6}  # b/1: none after: its end
            assert ends == {("a/orders", 0): 6, ("b/orders", 1): 6}
            ranges = planner.ranges(starts, ends)
            assert [(r.broker_name, r.queue_id, r.start, r.end) for r in ranges] == [("a", 0, 0, 6)]
        finally:
            planner.close()
        bare_options = {"namesrv": cluster.namesrv, "assign": '{"orders": [0]}'}
        bare = Planner(ReadOptions.parse(bare_options, streaming=False))
        try:
            with pytest.raises(NotFoundError, match='over a cluster, name queues "BROKER/QUEUE"'):
                bare.listing()
        finally:
            bare.close()
    finally:
        cluster.kill()
