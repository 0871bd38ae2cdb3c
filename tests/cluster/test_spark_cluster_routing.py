"""The Spark connector over a cluster (option ``namesrv``): two name servers, three brokers.

Batch and streaming reads (partitions per (broker, queue), the ``broker``
column, offsets naming brokers), group progress per broker, writes routed like
the producer, exactly-once writes spanning brokers, and the exactly-once
commit protocol when the driver dies between two brokers' commits;
startingTimestamp and minOffsetsPerTrigger over the brokers, and
failOnDataLoss when one broker's retention removed records a query still
wanted or a topic was recreated (on one broker or all).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from equeue_broker.testing import LocalCluster
from equeue_spark.client import Admin, Consumer, Message, Producer
from equeue_spark.client.cluster_consumer import ClusterConsumer
from equeue_spark.spark.offsets import from_json, incarnations, to_json
from equeue_spark.spark.options import WriteOptions
from equeue_spark.spark.write_task import commit_on_brokers, write_batches
from tests.support.spark_conf import progress_every_trigger

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
        if not query.isActive:  # say why at once, not after the wait
            raise AssertionError(f"the query stopped: {query.exception()}")
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


# -- startingTimestamp, minOffsetsPerTrigger and failOnDataLoss over the cluster ------

RETENTION_FLAGS = (
    "--chunk-size", "65536", "--max-message-bytes", "16384",
    "--retention-max-chunks", "2", "--retention-check-interval-ms", "100",
)  # fmt: skip


def send_to(cluster: LocalCluster, topic: str, broker: str, values: list[bytes],
            queue: int = 0) -> None:  # fmt: skip
    """Send ``values`` to one (broker, queue), 1000 a request."""
    with Producer(namesrv=cluster.namesrv) as producer:
        for lo in range(0, len(values), 1000):
            part = values[lo : lo + 1000]
            producer.send_batch(topic, part, queue_ids=[queue] * len(part),
                                brokers=[broker] * len(part))  # fmt: skip


def stream(spark: Any, cluster: LocalCluster, topic: str, **options: str) -> Any:
    source = spark.readStream.format("equeue").option("namesrv", cluster.namesrv)
    source = source.option("topic", topic)
    for key, value in options.items():
        source = source.option(key, value)
    return source.load()


def run_available_now(df: Any, checkpoint: Path, sink: Path, timeout_s: int = 180) -> Any:
    query = (
        df.writeStream.format("parquet").option("path", str(sink))
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )  # fmt: skip
    assert query.awaitTermination(timeout_s), "AvailableNow query did not finish in time"
    assert query.exception() is None
    return query


def start_available_now(df: Any, checkpoint: Path, sink: Path) -> Any:
    return (
        df.writeStream.format("parquet").option("path", str(sink))
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )  # fmt: skip


def parquet_rows(spark: Any, sink: Path) -> list[Any]:
    return spark.read.parquet(str(sink)).collect() if sink.exists() else []


@pytest.mark.timeout(600)
def test_starting_timestamp_picks_each_brokers_first_offset_at_or_after_it(
    spark: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    pytest.importorskip("pyspark")
    from equeue_spark.spark.options import ReadOptions
    from equeue_spark.spark.source import EqueueStreamReader

    make_topic(cluster, "stamps")
    # A different number of early records in each (broker, queue), so each
    # queue's first offset at or after the cutoff is its own.
    early = {(b, q): 2 + 2 * i + q for i, b in enumerate(BROKERS) for q in (0, 1)}
    for (b, q), n in early.items():
        send_to(cluster, "stamps", b, [b"early-%s%d-%d" % (b.encode(), q, i) for i in range(n)], q)
    with Admin(namesrv=cluster.namesrv) as admin:
        cutoff = 1 + max(
            admin.get_message_at("stamps", q, n - 1, broker=b).store_timestamp_ms
            for (b, q), n in early.items()
        )  # fmt: skip
    wait_for(lambda: time.time() * 1000 > cutoff + 1)
    late: list[bytes] = []
    for i, (b, q) in enumerate(sorted(early)):
        if (b, q) == ("c", 1):
            continue  # nothing late here: it starts at its end offset
        values = [b"late-%s%d-%d" % (b.encode(), q, j) for j in range(i + 1)]
        send_to(cluster, "stamps", b, values, q)
        late += values
    # The stream's initial offsets: per (broker, queue), the first at or after the cutoff.
    options = ReadOptions.parse(
        {"namesrv": cluster.namesrv, "topic": "stamps", "startingTimestamp": str(cutoff)},
        streaming=True,
    )
    reader = EqueueStreamReader(options, None)  # type: ignore[arg-type]
    try:
        assert from_json(reader.initialOffset()) == {
            (f"{b}/stamps", q): n for (b, q), n in early.items()
        }
    finally:
        reader.stop()
    # A batch read and a streaming query from the timestamp read the late records only.
    batch = (
        spark.read.format("equeue").option("namesrv", cluster.namesrv)
        .option("topic", "stamps").option("startingTimestamp", str(cutoff)).load()
        .select("broker", "queue", "offset", "value").collect()
    )  # fmt: skip
    assert sorted(r.value for r in batch) == sorted(late)
    assert all(r.offset >= early[(r.broker, r.queue)] for r in batch)
    before = (
        spark.read.format("equeue").option("namesrv", cluster.namesrv)
        .option("topic", "stamps").option("endingTimestamp", str(cutoff)).load().count()
    )  # fmt: skip
    assert before == sum(early.values())
    df = stream(spark, cluster, "stamps", startingTimestamp=str(cutoff))
    run_available_now(df.select("broker", "queue", "offset", "value"),
                      tmp_path / "ck", tmp_path / "out")  # fmt: skip
    streamed = parquet_rows(spark, tmp_path / "out")
    assert sorted(r.value for r in streamed) == sorted(late)
    assert {r.broker for r in streamed} == set(BROKERS)


@pytest.mark.timeout(600)
def test_min_offsets_per_trigger_waits_for_rows_across_brokers(
    spark: Any, cluster: LocalCluster
) -> None:
    make_topic(cluster, "minrows", queues=1)
    make_topic(cluster, "mindelay", queues=1)
    queries = []

    def start(topic: str, table: str, **options: str) -> Any:
        query = (
            stream(spark, cluster, topic, **options).select("broker", "value")
            .writeStream.format("memory").queryName(table)
            .trigger(processingTime="200 milliseconds").start()
        )  # fmt: skip
        queries.append(query)
        return query

    def count(table: str) -> int:
        return int(spark.sql(f"select count(*) from {table}").collect()[0][0])

    try:
        with progress_every_trigger(spark):  # a trigger without a batch is seen at once
            query = start("minrows", "min_rows", minOffsetsPerTrigger="100",
                          maxTriggerDelay="10m")  # fmt: skip
        wait_for(lambda: query.lastProgress is not None, 120)
        for b in BROKERS:
            send_to(cluster, "minrows", b, [b"x"] * 20)  # 60 rows, fewer than 100
        # Several triggers pass without a batch: fewer rows than minOffsetsPerTrigger.
        seen = len(query.recentProgress)
        wait_for(lambda: len(query.recentProgress) >= seen + 3, 120)
        assert count("min_rows") == 0
        for b in BROKERS:
            send_to(cluster, "minrows", b, [b"y"] * 15)  # 105 in all now
        wait_for(lambda: count("min_rows") == 105, 120)
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        assert sizes == [105]  # one batch, over the three brokers
        brokers = spark.sql("select distinct broker from min_rows").collect()
        assert {r.broker for r in brokers} == set(BROKERS)
        assert query.exception() is None
        # maxTriggerDelay: too few rows, but the delay passes and they are read.
        delayed = start("mindelay", "min_delay", minOffsetsPerTrigger="1000",
                        maxTriggerDelay="3s")  # fmt: skip
        wait_for(lambda: delayed.lastProgress is not None, 120)
        for b in BROKERS:
            send_to(cluster, "mindelay", b, [b"z"] * 5)
        wait_for(lambda: count("min_delay") == 15, 120)
        assert delayed.exception() is None
    finally:
        for q in queries:
            q.stop()


@pytest.fixture(scope="module")
def retention_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Like ``cluster``, but broker c keeps only two small chunks per queue."""
    started = LocalCluster(
        tmp_path_factory.mktemp("retention-cluster"),
        broker_flags=("--flush", "sync", "--register-interval-ms", "300"),
    )
    try:
        started.start(2, ("a", "b"))
        started.add_broker("c", *RETENTION_FLAGS)
        yield started
    finally:
        started.kill()


@pytest.mark.timeout(600)
def test_fail_on_data_loss_when_retention_removes_one_brokers_records(
    spark: Any, retention_cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster = retention_cluster
    make_topic(cluster, "lossy", queues=1)
    for b in BROKERS:
        send_to(cluster, "lossy", b, [b"early-" + b.encode()] * 10)
    run_available_now(stream(spark, cluster, "lossy", startingOffsets="earliest"),
                      tmp_path / "ck", tmp_path / "out")  # fmt: skip
    assert len(parquet_rows(spark, tmp_path / "out")) == 30
    for b in ("a", "b"):
        send_to(cluster, "lossy", b, [b"later-" + b.encode()] * 5)
    send_to(cluster, "lossy", "c", [b"z" * 1000] * 1000)  # ~16 chunks on c
    with Admin(namesrv=cluster.namesrv) as admin:
        on_c = admin.broker_admin("c", "lossy")

        def earliest_on_c() -> int:
            return on_c.list_offsets("lossy")[0].earliest_offset

        wait_for(lambda: earliest_on_c() > 10, 60)
        earliest = earliest_on_c()

    query = start_available_now(stream(spark, cluster, "lossy"), tmp_path / "ck", tmp_path / "out")
    lost = r"c/lossy/0: offsets \[10, \d+\) were removed by retention"
    with pytest.raises(Exception, match=lost):
        query.awaitTermination(180)
    assert len(parquet_rows(spark, tmp_path / "out")) == 30  # nothing written by that query

    lenient = stream(spark, cluster, "lossy", failOnDataLoss="false")
    run_available_now(lenient, tmp_path / "ck", tmp_path / "out")
    rows = parquet_rows(spark, tmp_path / "out")
    by_broker: dict[str, list[int]] = {b: [] for b in BROKERS}
    for r in rows:
        by_broker[r.broker].append(r.offset)
    for b in ("a", "b"):  # the other brokers: every record once
        assert sorted(by_broker[b]) == list(range(15))
    later = sorted(o for o in by_broker["c"] if o >= 10)
    assert later[0] >= earliest and later[-1] == 1009  # skipped the lost, read the rest
    assert later == list(range(later[0], 1010))
    assert sorted(o for o in by_broker["c"] if o < 10) == list(range(10))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("recreated", [("b",), BROKERS], ids=["on-one-broker", "everywhere"])
def test_recreated_topic_fails_or_is_read_from_earliest(
    spark: Any, cluster: LocalCluster, tmp_path: Path, recreated: tuple[str, ...]
) -> None:
    topic = f"reborn-{len(recreated)}"
    make_topic(cluster, topic, queues=1)
    for b in BROKERS:
        send_to(cluster, topic, b, [b"old-%s-%d" % (b.encode(), i) for i in range(5)])
    run_available_now(stream(spark, cluster, topic, startingOffsets="earliest"),
                      tmp_path / "ck", tmp_path / "out")  # fmt: skip
    with Admin(namesrv=cluster.namesrv) as admin:
        named = recreated[0]  # the first recreated broker, by name, is the one reported
        old = admin.broker_admin(named).describe_topic(topic).incarnation
        if recreated == BROKERS:
            admin.delete_topic(topic)
            admin.create_topic(topic, queues=1)
        else:
            admin.broker_admin(named).delete_topic(topic)
            admin.broker_admin(named).create_topic(topic, queues=1)
        new = admin.broker_admin(named).describe_topic(topic).incarnation
        assert new != old
        wait_for(lambda: len(admin.route(topic).queues()) == len(BROKERS))
    # Past the checkpoint's offsets (5 per queue) on each broker: read from
    # there, a recreated topic's first 5 records would be skipped without a word.
    new_values = {b: [b"new-%s-%d" % (b.encode(), i) for i in range(8)] for b in BROKERS}
    for b, values in new_values.items():
        send_to(cluster, topic, b, values)

    query = start_available_now(stream(spark, cluster, topic), tmp_path / "ck", tmp_path / "out")
    with pytest.raises(
        Exception,
        match=rf"topic {named}/{topic} was deleted .* incarnation {old}, .* incarnation {new};",
    ):
        query.awaitTermination(180)

    lenient = stream(spark, cluster, topic, failOnDataLoss="false")
    run_available_now(lenient, tmp_path / "ck", tmp_path / "out")
    read = sorted(r.value for r in parquet_rows(spark, tmp_path / "out"))
    old_values = [b"old-%s-%d" % (b.encode(), i) for b in BROKERS for i in range(5)]
    assert read == sorted(old_values + [v for vs in new_values.values() for v in vs])


@pytest.mark.timeout(300)
def test_a_read_task_meeting_retention_names_the_broker(
    spark: Any, retention_cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Retention removes records after the batch was planned: the read task
    applies failOnDataLoss itself, and its error (or, lenient, its warning)
    names the broker (three brokers each have a queue 0 of the topic); so
    does the planner's, for the next batch."""
    from pyspark.sql.types import StructType

    from equeue_spark.spark.arrow import arrow_schema, read_schema
    from equeue_spark.spark.errors import OffsetsLostError
    from equeue_spark.spark.options import ReadOptions
    from equeue_spark.spark.planning import Planner
    from equeue_spark.spark.read_task import read_range

    cluster = retention_cluster
    make_topic(cluster, "late-loss", queues=1)
    options = ReadOptions.parse(
        {"namesrv": cluster.namesrv, "topic": "late-loss", "startingOffsets": "earliest"},
        streaming=True,
    )
    planner = Planner(options)
    struct = StructType.fromDDL(read_schema(False))
    assert isinstance(struct, StructType)
    schema = arrow_schema(struct)
    try:
        send_to(cluster, "late-loss", "c", [b"first"] * 10)
        planned = planner.ranges({("c/late-loss", 0): 0}, {("c/late-loss", 0): 10})
        assert [(p.start, p.end) for p in planned] == [(0, 10)]
        send_to(cluster, "late-loss", "c", [b"z" * 1000] * 1000)  # retention removes 0..9
        with Admin(namesrv=cluster.namesrv) as admin:
            on_c = admin.broker_admin("c", "late-loss")
            wait_for(lambda: on_c.list_offsets("late-loss")[0].earliest_offset > 10, 60)
            earliest = on_c.list_offsets("late-loss")[0].earliest_offset
        with pytest.raises(OffsetsLostError, match=r"c/late-loss/0 offsets \[0, 10\) were removed"):
            list(read_range(planned[0], schema))
        lenient = dataclasses.replace(planned[0], fail_on_data_loss=False)
        with caplog.at_level(logging.WARNING, logger="equeue.spark"):
            assert list(read_range(lenient, schema)) == []
        assert "skipping c/late-loss/0 offsets [0, 10): removed by retention" in caplog.text
        with pytest.raises(OffsetsLostError, match=r"c/late-loss/0: offsets \[0, \d+\) were"):
            planner.ranges({("c/late-loss", 0): 0}, {("c/late-loss", 0): 1010})
        skipping = Planner(dataclasses.replace(options, fail_on_data_loss=False))
        try:
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="equeue.spark"):
                ranges = skipping.ranges({("c/late-loss", 0): 0}, {("c/late-loss", 0): 1010})
            assert [(r.broker_name, r.end) for r in ranges] == [("c", 1010)]
            skipped_to = ranges[0].start  # retention may have gone on: at least earliest
            assert skipped_to >= earliest
            assert f"c/late-loss/0: offsets [0, {skipped_to}) were removed" in caplog.text
        finally:
            skipping.close()
    finally:
        planner.close()
