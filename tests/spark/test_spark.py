"""The Spark connector against a real broker process and a real local SparkSession."""

from __future__ import annotations

import collections
import itertools
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.errors import PySparkException
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import spark_partition_id
from pyspark.sql.streaming.query import StreamingQuery

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, Producer
from tests.support.spark_conf import progress_every_trigger
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow  # make test-fast skips it (see pyproject.toml)

SparkError = (PySparkException, CapturedException)
_names = itertools.count()


def produce(
    address: str,
    topic: str,
    values: list[bytes],
    *,
    keys: list[bytes | None] | None = None,
    tags: list[str] | None = None,
    queues: int = 0,
) -> None:
    """Send ``values``; with ``queues``, message i goes to queue i % queues."""
    queue_ids = [i % queues for i in range(len(values))] if queues else None
    with Producer(address) as producer:
        for lo in range(0, len(values), 1000):
            producer.send_batch(
                topic,
                values[lo : lo + 1000],
                keys=None if keys is None else keys[lo : lo + 1000],
                tags=None if tags is None else tags[lo : lo + 1000],
                queue_ids=None if queue_ids is None else queue_ids[lo : lo + 1000],
            )


def reader(spark: SparkSession, broker: BrokerProcess, **options: Any) -> Any:
    stream = options.pop("stream", False)
    source = spark.readStream if stream else spark.read
    source = source.format("equeue").option("broker", broker.address)
    for key, value in options.items():
        source = source.option(key, str(value))
    return source


def available_now(
    df: DataFrame, checkpoint: Path, sink: Path, timeout_s: int = 120
) -> StreamingQuery:
    """Run ``df`` to a parquet sink with Trigger.AvailableNow until it ends."""
    query = (
        df.writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(timeout_s), "AvailableNow query did not finish in time"
    assert query.exception() is None
    return query


def rows_of(spark: SparkSession, sink: Path) -> list[Any]:
    return spark.read.parquet(str(sink)).collect() if sink.exists() else []


@pytest.fixture
def memory_query(spark: SparkSession) -> Iterator[Callable[..., tuple[StreamingQuery, str]]]:
    """Start streaming queries into memory tables; all stopped at teardown."""
    started: list[StreamingQuery] = []

    def start(df: DataFrame, **trigger: Any) -> tuple[StreamingQuery, str]:
        name = f"mem{next(_names)}"
        writer = df.writeStream.format("memory").queryName(name)
        query = writer.trigger(**(trigger or {"processingTime": "200 milliseconds"})).start()
        started.append(query)
        return query, name

    yield start
    for query in started:
        query.stop()


def count_of(spark: SparkSession, table: str) -> int:
    return int(spark.sql(f"select count(*) from {table}").collect()[0][0])


# -- batch reads and writes ---------------------------------------------------------


def test_write_then_read_round_trip(spark: SparkSession, broker: BrokerProcess) -> None:
    rows = [(f"k{i % 37}", f"value-{i}") for i in range(3000)]
    df = spark.createDataFrame(rows, "key string, value string")
    df.write.format("equeue").option("broker", broker.address).option("topic", "rt").mode(
        "append"
    ).save()

    read = reader(spark, broker, topic="rt").load().collect()
    assert len(read) == 3000
    assert collections.Counter((r.key, r.value) for r in read) == collections.Counter(
        (k.encode(), v.encode()) for k, v in rows
    )
    queues_by_key = collections.defaultdict(set)
    for r in read:
        queues_by_key[r.key].add(r.queue)
    assert all(len(q) == 1 for q in queues_by_key.values())  # one queue per key
    by_queue = collections.defaultdict(list)
    for r in read:
        by_queue[r.queue].append(r.offset)
    assert len(by_queue) == 4
    for offsets in by_queue.values():
        assert sorted(offsets) == list(range(len(offsets)))  # contiguous from 0
    assert {r.topic for r in read} == {"rt"} and all(r.message_id for r in read)
    with Admin(broker.address) as admin:
        message = admin.get_message(read[0].message_id)
    assert (message.value, message.offset) == (read[0].value, read[0].offset)


def test_batch_offsets_timestamps_and_partition_split(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("bo", queues=2)
    produce(broker.address, "bo", [b"%d" % i for i in range(100)], queues=2)  # 50 each
    starting = '{"bo": {"0": 10, "1": -2}}'
    ending = '{"bo": {"0": 20, "1": -1}}'
    df = reader(spark, broker, topic="bo", startingOffsets=starting, endingOffsets=ending,
                maxRecordsPerPartition=7).load()  # fmt: skip
    partition_ids = df.select(spark_partition_id().alias("p")).distinct().count()
    assert partition_ids == 2 + 8  # ceil(10/7) + ceil(50/7)
    got = df.collect()
    assert sorted(r.offset for r in got if r.queue == 0) == list(range(10, 20))
    assert sorted(r.offset for r in got if r.queue == 1) == list(range(50))

    with Admin(broker.address) as admin:
        cutoff = 1 + max(admin.get_message_at("bo", q, 49).store_timestamp_ms for q in (0, 1))
    wait_for("the clock to pass the last store time", lambda: time.time() * 1000 > cutoff + 1)
    produce(broker.address, "bo", [b"late-%d" % i for i in range(6)], queues=2)
    late = reader(spark, broker, topic="bo", startingTimestamp=cutoff).load().collect()
    assert sorted(r.value for r in late) == sorted(b"late-%d" % i for i in range(6))
    early = reader(spark, broker, topic="bo", endingTimestamp=cutoff).load().count()
    assert early == 100


def test_timestamp_options_compare_store_time(spark: SparkSession, broker: BrokerProcess) -> None:
    """Issue 25 item 6: ``timestamp`` shows the producer's time (2023 here),
    ``startingTimestamp`` compares the broker's store time: rows stamped in 2023
    but stored now come back for ``startingTimestamp=<now>``. The schema says
    so: ``timestampType`` 0 (CreateTime) and ``storeTimestamp`` (LogAppendTime)."""
    stamp_2023 = 1_690_000_000_000  # 2023-07-22
    with Admin(broker.address) as admin:
        admin.create_topic("ts", queues=1)
    produce(broker.address, "ts", [b"before"])
    with Admin(broker.address) as admin:
        cutoff = 1 + admin.get_message_at("ts", 0, 0).store_timestamp_ms
    wait_for("the clock to pass the first store time", lambda: time.time() * 1000 > cutoff + 1)
    with Producer(broker.address) as producer:
        producer.send_batch("ts", [b"old-0", b"old-1"], timestamps_ms=[stamp_2023] * 2)
    rows = reader(spark, broker, topic="ts", startingTimestamp=cutoff).load().collect()
    assert sorted(r.value for r in rows) == [b"old-0", b"old-1"]
    for r in rows:
        assert r.timestamp.year == 2023 and r.timestampType == 0
        assert r.storeTimestamp.timestamp() * 1000 >= cutoff
    every = reader(spark, broker, topic="ts").load()
    assert every.columns[-2:] == ["timestampType", "storeTimestamp"]
    assert every.count() == 3
    with pytest.raises(PySparkException, match="compared with the broker's store time"):
        reader(spark, broker, topic="ts", startingTimestamp="now").load().collect()


def test_write_columns_headers_tags_and_queues(spark: SparkSession, broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("cols", queues=3)
    df = spark.createDataFrame(
        [
            (b"v1", None, "cols", 2, "red", [("h", b"x"), ("n", b"")]),
            (b"v2", b"k", "ignored", None, None, []),
            (b"v3", b"", None, 0, "blue", None),
        ],
        "value binary, key binary, topic string, queue int, tag string, "
        "headers array<struct<key:string,value:binary>>",
    )
    df.write.format("equeue").option("broker", broker.address).option("topic", "cols").mode(
        "append"
    ).save()
    got = {
        r.value: r
        for r in reader(spark, broker, topic="cols", includeHeaders="true").load().collect()
    }
    assert got[b"v1"].key is None and got[b"v1"].queue == 2 and got[b"v1"].tag == "red"
    assert [(h.key, h.value) for h in got[b"v1"].headers] == [("h", b"x"), ("n", b"")]
    assert got[b"v2"].key == b"k" and got[b"v2"].tag == "" and got[b"v2"].headers == []
    assert got[b"v3"].key == b"" and got[b"v3"].queue == 0 and got[b"v3"].tag == "blue"

    tagged = reader(spark, broker, topic="cols", tags="red|blue").load().collect()
    assert sorted(r.value for r in tagged) == [b"v1", b"v3"]


def test_tag_filter_skips_long_runs(spark: SparkSession, broker: BrokerProcess) -> None:
    values = [b"%d" % i for i in range(5000)]
    tags = ["keep" if i % 1000 == 999 else "skip" for i in range(5000)]
    with Admin(broker.address) as admin:
        admin.create_topic("tags", queues=1)
    produce(broker.address, "tags", values, tags=tags)
    got = reader(spark, broker, topic="tags", tags="keep").load().collect()
    assert sorted(r.offset for r in got) == [999, 1999, 2999, 3999, 4999]
    assert {r.tag for r in got} == {"keep"}


def test_write_rejects_bad_input(spark: SparkSession, broker: BrokerProcess) -> None:
    df = spark.createDataFrame([("v",)], "value string")

    def writer() -> Any:
        return df.write.format("equeue").option("broker", broker.address).mode("append")

    with pytest.raises(SparkError, match="no topic"):
        writer().save()
    with pytest.raises(SparkError, match="overwrite"):
        writer().option("topic", "t").mode("overwrite").save()
    numbers = spark.createDataFrame([(1,)], "value int")
    with pytest.raises(SparkError, match="column value has type int"):
        numbers.write.format("equeue").option("broker", broker.address).option("topic", "t").mode(
            "append"
        ).save()
    with pytest.raises(SparkError, match="batchSize"):
        writer().option("topic", "t").option("batchSize", "0").save()


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"topic": "t", "bogus": "1"}, "unknown option 'bogus'"),
        ({"topic": "t", "maxOffsetsPerTrigger": "ten"}, "maxOffsetsPerTrigger='ten'"),
        ({"topic": "t", "topicPattern": "t.*"}, "exactly one of"),
        ({"topic": "t", "startingOffsets": "middle"}, "startingOffsets='middle'"),
        ({"topic": "t", "startingOffsets": '{"other": {"0": 1}}'}, "'other' is not one"),
        ({"topic": "t", "startingOffsets": "group"}, "needs the group option"),
        ({"topic": "t", "failOnDataLoss": "maybe"}, "failOnDataLoss='maybe'"),
        ({"topic": "t", "maxTriggerDelay": "soon"}, "maxTriggerDelay='soon'"),
        ({"topicPattern": "(unclosed"}, "not a regular expression"),
    ],
)
def test_option_errors_name_the_option(
    spark: SparkSession, broker: BrokerProcess, options: dict[str, str], fragment: str
) -> None:
    """A stream's bad option fails its load(), as a batch read's does (not start())."""
    with pytest.raises(SparkError, match=fragment.replace("(", r"\(")):
        reader(spark, broker, stream=True, **options).load()


def test_ending_offsets_in_a_stream_fail_at_start(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    """The one check load() cannot make: Spark's schema call does not say whether
    the read is a stream, and endingOffsets is valid for batch reads."""
    df = reader(spark, broker, stream=True, topic="t", endingOffsets="latest").load()
    with pytest.raises(SparkError, match="only batch reads take it"):
        df.writeStream.format("noop").start().awaitTermination(60)


def test_batch_read_with_nothing_to_read_returns_no_rows(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    """Spark runs one task with InputPartition(None) when a read plans no
    partitions: an empty topic, a caught-up group, startingOffsets=latest."""
    with Admin(broker.address) as admin:
        admin.create_topic("empty", queues=2)
        admin.create_topic("caught", queues=2)
        produce(broker.address, "caught", [b"%d" % i for i in range(10)], queues=2)
        admin.commit_offsets("done", {("caught", 0): 5, ("caught", 1): 5})
    reads = [
        reader(spark, broker, topic="empty"),
        reader(spark, broker, topic="caught", startingOffsets="group", group="done"),
        reader(spark, broker, topic="caught", startingOffsets="latest"),
    ]
    assert [r.load().count() for r in reads] == [0, 0, 0]
    assert reader(spark, broker, topic="caught").load().count() == 10


# -- streaming ----------------------------------------------------------------------


def test_streaming_json_start_leaves_unnamed_queues_at_latest(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    """Queues a startingOffsets JSON leaves out take the stream's default (latest)."""
    with Admin(broker.address) as admin:
        admin.create_topic("json", queues=2)
    produce(broker.address, "json", [b"%d" % i for i in range(20)], queues=2)
    df = reader(spark, broker, stream=True, topic="json", startingOffsets='{"json": {"0": 3}}')
    available_now(df.load(), tmp_path / "ck", tmp_path / "out")
    rows = rows_of(spark, tmp_path / "out")
    assert sorted((r.queue, r.offset) for r in rows) == [(0, o) for o in range(3, 10)]


def test_one_offsets_listing_per_trigger(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """latestOffset lists the queues; reportLatestOffset and partitions, which
    Spark calls right after it, reuse that listing instead of asking again."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from pyspark.sql.types import StructType

    from equeue_spark.spark.options import ReadOptions
    from equeue_spark.spark.source import EqueueStreamReader

    with Admin(broker.address) as admin:
        admin.create_topic("listing", queues=3)
    produce(broker.address, "listing", [b"%d" % i for i in range(30)], queues=3)
    options = {"broker": broker.address, "topic": "listing", "startingOffsets": "earliest"}
    source = EqueueStreamReader(ReadOptions.parse(options, streaming=True), StructType())
    try:
        start = source.initialOffset()
        listings: list[str] = []
        real = Admin.list_topic_offsets

        def counted(self: Admin, topic: str, timestamp_ms: int | None = None) -> Any:
            listings.append(topic)  # on whichever member's Admin the routes chose
            return real(self, topic, timestamp_ms)

        monkeypatch.setattr(Admin, "list_topic_offsets", counted)
        end = source.latestOffset(start, ReadAllAvailable())
        assert source.reportLatestOffset() == end
        ranges = [p.value for p in source.partitions(start, end)]
    finally:
        source.stop()
    assert listings == ["listing"]
    assert sorted((r.queue_id, r.start, r.end) for r in ranges) == [(q, 0, 10) for q in range(3)]


def test_available_now_in_several_batches_then_lag_zero(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    produce(
        broker.address,
        "an",
        [b"%d" % i for i in range(1000)],
        keys=[b"%d" % i for i in range(1000)],
    )
    df = reader(spark, broker, stream=True, topic="an", startingOffsets="earliest",
                maxOffsetsPerTrigger=300, group="an-group").load()  # fmt: skip
    query = available_now(df, tmp_path / "ck", tmp_path / "out")
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 1000 and len(sizes) >= 4 and max(sizes) <= 304
    assert len({(r.queue, r.offset) for r in rows_of(spark, tmp_path / "out")}) == 1000
    with Admin(broker.address) as admin:
        group = admin.describe_group("an-group")
    assert group.total_lag == 0 and sum(q.committed_offset for q in group.queues) == 1000


def test_restart_from_checkpoint_no_gap_no_duplicate(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    ck, out = tmp_path / "ck", tmp_path / "out"
    produce(broker.address, "rs", [b"a%d" % i for i in range(700)])
    stream = reader(spark, broker, stream=True, topic="rs", startingOffsets="earliest",
                    maxOffsetsPerTrigger=250)  # fmt: skip
    available_now(stream.load(), ck, out)
    produce(broker.address, "rs", [b"b%d" % i for i in range(500)])
    # The restarted query's startingOffsets would skip everything: the checkpoint wins.
    restarted = reader(spark, broker, stream=True, topic="rs", startingOffsets="latest",
                       maxOffsetsPerTrigger=250)  # fmt: skip
    available_now(restarted.load(), ck, out)
    rows = rows_of(spark, out)
    assert len(rows) == 1200
    assert len({(r.queue, r.offset) for r in rows}) == 1200
    assert sorted(r.value for r in rows) == sorted(
        [b"a%d" % i for i in range(700)] + [b"b%d" % i for i in range(500)]
    )


def test_continuous_query_commits_group_lag_zero_when_idle(
    spark: SparkSession,
    broker: BrokerProcess,
    memory_query: Callable[..., tuple[StreamingQuery, str]],
) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("idle", queues=3)
    df = reader(spark, broker, stream=True, topic="idle", group="live",
                maxOffsetsPerTrigger=400).load()  # fmt: skip
    query, table = memory_query(df)
    wait_for("the query's first batch", lambda: query.lastProgress)
    produce(broker.address, "idle", [b"%d" % i for i in range(1500)])
    wait_for("all rows in the sink", lambda: count_of(spark, table) == 1500)
    with Admin(broker.address) as admin:
        wait_for("group lag 0 on the broker", lambda: admin.describe_group("live").total_lag == 0)
        assert sum(q.committed_offset for q in admin.describe_group("live").queues) == 1500
    progress = query.lastProgress
    assert progress is not None and progress.sources[0].latestOffset is not None


def test_starting_offsets_group_with_fallback(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("grp", queues=2)
        produce(broker.address, "grp", [b"%d" % i for i in range(40)], queues=2)
        admin.commit_offsets("resume", {("grp", 0): 15})  # queue 1: never committed
    df = reader(
        spark, broker, stream=True, topic="grp", startingOffsets="group", group="resume"
    ).load()
    available_now(df, tmp_path / "ck", tmp_path / "out")
    rows = rows_of(spark, tmp_path / "out")
    assert sorted(r.offset for r in rows if r.queue == 0) == list(range(15, 20))
    assert sorted(r.offset for r in rows if r.queue == 1) == list(range(20))  # earliest
    latest = reader(spark, broker, stream=True, topic="grp", startingOffsets="group", group="fresh",
                    groupFallback="latest").load()  # fmt: skip
    available_now(latest, tmp_path / "ck2", tmp_path / "out2")
    assert rows_of(spark, tmp_path / "out2") == []


def test_streaming_tag_filter_and_headers(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    produce(broker.address, "st", [b"%d" % i for i in range(300)], tags=["a", "b", "c"] * 100)
    df = reader(spark, broker, stream=True, topic="st", startingOffsets="earliest", tags="a|c",
                includeHeaders="true").load()  # fmt: skip
    available_now(df, tmp_path / "ck", tmp_path / "out")
    rows = rows_of(spark, tmp_path / "out")
    assert len(rows) == 200 and {r.tag for r in rows} == {"a", "c"}


def test_topic_pattern_picks_up_new_topics(
    spark: SparkSession,
    broker: BrokerProcess,
    memory_query: Callable[..., tuple[StreamingQuery, str]],
) -> None:
    produce(broker.address, "pat-1", [b"one"] * 10)
    df = reader(
        spark, broker, stream=True, topicPattern="pat-.*", startingOffsets="earliest"
    ).load()
    _, table = memory_query(df)
    wait_for("pat-1's rows", lambda: count_of(spark, table) == 10)
    produce(broker.address, "pat-2", [b"two"] * 7)
    produce(broker.address, "other", [b"no"] * 5)
    wait_for("pat-2's rows", lambda: count_of(spark, table) == 17)
    topics = collections.Counter(r.topic for r in spark.sql(f"select topic from {table}").collect())
    assert topics == {"pat-1": 10, "pat-2": 7}


def test_min_offsets_waits_for_enough_rows(
    spark: SparkSession,
    broker: BrokerProcess,
    memory_query: Callable[..., tuple[StreamingQuery, str]],
) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("minrows", queues=1)
    df = reader(spark, broker, stream=True, topic="minrows", minOffsetsPerTrigger=100,
                maxTriggerDelay="10m").load()  # fmt: skip
    with progress_every_trigger(spark):  # a trigger without a batch is seen at once
        query, table = memory_query(df)
        wait_for("the query to start", lambda: query.lastProgress)
        produce(broker.address, "minrows", [b"x"] * 60)
        # Several triggers pass without a batch: fewer rows than minOffsetsPerTrigger.
        seen = len(query.recentProgress)
        wait_for("three more triggers", lambda: len(query.recentProgress) >= seen + 3)
        assert count_of(spark, table) == 0
        produce(broker.address, "minrows", [b"y"] * 50)
        wait_for("one batch of all 110 rows", lambda: count_of(spark, table) == 110)


def test_max_bytes_per_trigger_limits_batches(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("bytes", queues=2)
    produce(broker.address, "bytes", [b"x" * 1000] * 200)
    df = reader(spark, broker, stream=True, topic="bytes", startingOffsets="earliest",
                maxBytesPerTrigger=50_000).load()  # fmt: skip
    query = available_now(df, tmp_path / "ck", tmp_path / "out")
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 200 and len(sizes) >= 4 and max(sizes) <= 50


def test_fail_on_data_loss_both_ways(
    spark: SparkSession, broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    broker = broker_factory("--chunk-size", "65536", "--max-message-bytes", "16384",
                            "--retention-max-chunks", "2",
                            "--retention-check-interval-ms", "100")  # fmt: skip
    with Admin(broker.address) as admin:
        admin.create_topic("lossy", queues=1)
        produce(broker.address, "lossy", [b"early"] * 10)
        first = reader(spark, broker, stream=True, topic="lossy", startingOffsets="earliest")
        available_now(first.load(), tmp_path / "ck", tmp_path / "out")
        produce(broker.address, "lossy", [b"z" * 1000] * 1000)  # ~16 chunks
        earliest = wait_for(
            "retention to remove the query's next offsets",
            lambda: (
                admin.list_offsets("lossy")[0].earliest_offset > 10
                and admin.list_offsets("lossy")[0].earliest_offset
            ),
        )
    strict = reader(spark, broker, stream=True, topic="lossy").load()
    query = strict.writeStream.format("parquet").option("path", str(tmp_path / "out")).option(
        "checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()  # fmt: skip
    with pytest.raises(SparkError, match=r"lossy/0: offsets \[10, \d+\) were removed by retention"):
        query.awaitTermination(120)

    lenient = reader(spark, broker, stream=True, topic="lossy", failOnDataLoss="false")
    available_now(lenient.load(), tmp_path / "ck", tmp_path / "out")
    rows = rows_of(spark, tmp_path / "out")
    later = [r.offset for r in rows if r.offset >= 10]
    assert min(later) >= earliest and max(later) == 1009  # skipped the lost, read the rest
    assert len(later) == len(set(later)) == 1010 - min(later)


def test_recreated_topic_under_a_checkpoint_fails_or_is_read_from_earliest(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("reborn", queues=2)
        produce(broker.address, "reborn", [b"old-%d" % i for i in range(10)], queues=2)
        first = reader(spark, broker, stream=True, topic="reborn", startingOffsets="earliest")
        available_now(first.load(), tmp_path / "ck", tmp_path / "out")
        old = admin.describe_topic("reborn").incarnation
        admin.delete_topic("reborn")
        new = admin.create_topic("reborn", queues=2).incarnation
    # Past the checkpoint's offsets (5 per queue): read from there, the new
    # topic's first 5 records of each queue would be skipped without a word.
    new_values = [b"new-%d" % i for i in range(30)]
    produce(broker.address, "reborn", new_values, queues=2)

    strict = reader(spark, broker, stream=True, topic="reborn").load()
    query = strict.writeStream.format("parquet").option("path", str(tmp_path / "out")).option(
        "checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()  # fmt: skip
    with pytest.raises(
        SparkError, match=rf"topic reborn was deleted .* incarnation {old}, .* incarnation {new};"
    ):
        query.awaitTermination(120)

    lenient = reader(spark, broker, stream=True, topic="reborn", failOnDataLoss="false")
    available_now(lenient.load(), tmp_path / "ck", tmp_path / "out")
    read = sorted(r.value for r in rows_of(spark, tmp_path / "out"))
    assert read == sorted([b"old-%d" % i for i in range(10)] + new_values)


def test_checkpoint_without_incarnations_resumes_and_adopts_the_current_one(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    """Offsets written before incarnations existed: the query resumes where it
    was, with failOnDataLoss=true, and records the topic's incarnation."""
    produce(broker.address, "legacy", [b"a-%d" % i for i in range(10)])
    first = reader(spark, broker, stream=True, topic="legacy", startingOffsets="earliest")
    available_now(first.load(), tmp_path / "ck", tmp_path / "out")
    logged = sorted((tmp_path / "ck" / "offsets").glob("[0-9]*"))
    assert logged
    for path in logged:  # as the previous version wrote them
        text = path.read_text()
        assert '"incarnation": ' in text
        path.write_text(re.sub(r', "incarnation": \d+', "", text))
    produce(broker.address, "legacy", [b"b-%d" % i for i in range(5)])

    again = reader(spark, broker, stream=True, topic="legacy")
    available_now(again.load(), tmp_path / "ck", tmp_path / "out")
    read = sorted(r.value for r in rows_of(spark, tmp_path / "out"))
    assert read == sorted([b"a-%d" % i for i in range(10)] + [b"b-%d" % i for i in range(5)])
    with Admin(broker.address) as admin:
        incarnation = admin.describe_topic("legacy").incarnation
    latest = max((tmp_path / "ck" / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    assert f'"incarnation": {incarnation}' in latest.read_text()


def test_replayed_batch_of_a_recreated_topic_fails_or_is_skipped(broker: BrokerProcess) -> None:
    """A restarted query replays its last planned batch (partitions before any
    latestOffset): if the topic was recreated since, that batch's offsets are
    the old topic's."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from pyspark.sql.types import StructType

    from equeue_spark.spark.errors import OffsetsLostError
    from equeue_spark.spark.options import ReadOptions
    from equeue_spark.spark.source import EqueueStreamReader

    def source(**options: str) -> EqueueStreamReader:
        options = {"broker": broker.address, "topic": "replay", **options}
        return EqueueStreamReader(ReadOptions.parse(options, streaming=True), StructType())

    with Admin(broker.address) as admin:
        admin.create_topic("replay", queues=1)
    produce(broker.address, "replay", [b"old"] * 5)
    first = source(startingOffsets="earliest")
    start = first.initialOffset()
    end = first.latestOffset(start, ReadAllAvailable())
    first.stop()
    with Admin(broker.address) as admin:
        admin.delete_topic("replay")
        admin.create_topic("replay", queues=1)
    produce(broker.address, "replay", [b"new"] * 8)

    strict = source()
    with pytest.raises(OffsetsLostError, match="topic replay was deleted and created again"):
        strict.partitions(start, end)
    strict.stop()
    lenient = source(failOnDataLoss="false")
    try:
        assert lenient.partitions(start, end) == []  # the old topic's records are gone
        after = lenient.latestOffset(end, ReadAllAvailable())
        ranges = [p.value for p in lenient.partitions(end, after)]
    finally:
        lenient.stop()
    assert [(r.queue_id, r.start, r.end) for r in ranges] == [(0, 0, 8)]


def test_progress_in_a_recreated_topic_is_not_committed_to_the_group(
    broker: BrokerProcess,
) -> None:
    """Spark's commit() brings a batch's end one trigger late: if the topic was
    recreated meanwhile, those offsets are the old topic's, not the group's
    progress in the new one."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from pyspark.sql.types import StructType

    from equeue_spark.spark.options import ReadOptions
    from equeue_spark.spark.source import EqueueStreamReader

    with Admin(broker.address) as admin:
        admin.create_topic("regroup", queues=1)
        produce(broker.address, "regroup", [b"old"] * 5)
        options = {"broker": broker.address, "topic": "regroup", "group": "etl",
                   "startingOffsets": "earliest", "failOnDataLoss": "false"}  # fmt: skip
        source = EqueueStreamReader(ReadOptions.parse(options, streaming=True), StructType())
        try:
            start = source.initialOffset()
            end = source.latestOffset(start, ReadAllAvailable())
            admin.delete_topic("regroup")
            admin.create_topic("regroup", queues=1)
            produce(broker.address, "regroup", [b"new"] * 8)
            source.latestOffset(end, ReadAllAvailable())  # the next trigger
            source.commit(end)
        finally:
            source.stop()
        assert admin.fetch_offsets("etl", "regroup") == {}


def test_explicit_registration_works_too(spark: SparkSession, broker: BrokerProcess) -> None:
    from equeue_spark.spark import EqueueDataSource

    spark.dataSource.register(EqueueDataSource)
    produce(broker.address, "reg", [b"x"] * 5)
    assert reader(spark, broker, topic="reg").load().count() == 5
