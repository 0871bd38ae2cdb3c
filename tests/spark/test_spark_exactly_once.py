"""Exactly-once writes from Spark: task retries and replayed micro-batches write once.

Real broker process, real local SparkSession (``local[2,2]``: a failed task is
retried once, as on a cluster). Each test first shows the failure it injects
does duplicate rows with ``delivery=at_least_once``, so it cannot pass by
failing to inject anything.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, read_range
from tests.spark.test_spark import SparkError, produce, reader
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow  # make test-fast skips it (see pyproject.toml)

ROWS = 6_000


def topic_values(address: str, topic: str, queues: int = 2) -> list[bytes]:
    return [
        m.value for q in range(queues) for b in read_range(topic, q, 0, broker=address) for m in b
    ]


def failing_first_attempt(frame: DataFrame, address: str, topic: str) -> DataFrame:
    """``frame`` (one partition) whose first task attempt fails once the broker
    holds 1,000 of its rows, appended or staged (a bounded wait: the signal
    that the writer really sent rows before the failure)."""

    def fail(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        context = TaskContext.get()
        doomed = context is not None and context.attemptNumber() == 0
        for n, batch in enumerate(batches):
            if doomed and n == 3:
                wait_for("rows on the broker", lambda: rows_on_broker(address, topic) >= 1_000)
                raise RuntimeError("injected failure of a first task attempt")
            yield batch

    return frame.coalesce(1).mapInArrow(fail, frame.schema)


def rows_on_broker(address: str, topic: str) -> int:
    """Messages of ``topic``, appended or staged in open transactions."""
    with Admin(address) as admin:
        appended = sum(q.end_offset for q in admin.list_offsets(topic))
        staged = sum(
            q.count
            for t in admin.list_transactions().transactions
            for q in t.queues
            if q.topic == topic
        )
    return appended + staged


@pytest.fixture
def small_arrow_batches(spark: SparkSession) -> Iterator[None]:
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    old = spark.conf.get(key)
    spark.conf.set(key, "500")
    yield
    spark.conf.set(key, str(old))


def write(frame: DataFrame, broker: BrokerProcess, topic: str, delivery: str) -> None:
    (
        frame.write.format("equeue")
        .mode("append")
        .option("broker", broker.address)
        .option("topic", topic)
        .option("batchSize", "500")
        .option("delivery", delivery)
        .save()
    )


@pytest.mark.usefixtures("small_arrow_batches")
def test_batch_write_with_a_failed_task_attempt_writes_once(
    spark: SparkSession, broker: BrokerProcess
) -> None:
    # 1 KiB rows: Spark buffers its pipes to Python workers, and small rows
    # would sit in those buffers instead of reaching the writer before the failure.
    values = [(b"v%05d" % i).ljust(1024, b".") for i in range(ROWS)]
    frame = spark.createDataFrame([(v,) for v in values], "value binary")
    with Admin(broker.address) as admin:
        admin.create_topic("alo", queues=2)
        admin.create_topic("eo", queues=2)

    write(failing_first_attempt(frame, broker.address, "alo"), broker, "alo", "at_least_once")
    duplicated = topic_values(broker.address, "alo")
    assert sorted(set(duplicated)) == values
    assert len(duplicated) > ROWS, "the injected failure came before any row was written"

    write(failing_first_attempt(frame, broker.address, "eo"), broker, "eo", "exactly_once")
    assert sorted(topic_values(broker.address, "eo")) == values
    with Admin(broker.address) as admin:
        assert list(admin.list_transactions().transactions) == []  # failed attempt aborted


def copy_stream(
    spark: SparkSession, broker: BrokerProcess, source: str, target: str, ck: Path, **opts: str
) -> None:
    """Copy ``source`` to ``target`` with an AvailableNow streaming query."""
    stream = reader(spark, broker, stream=True, topic=source, startingOffsets="earliest",
                    maxOffsetsPerTrigger=1_000).load()  # fmt: skip
    writer = (
        stream.select("key", "value")
        .writeStream.format("equeue")
        .option("broker", broker.address)
        .option("topic", target)
        .option("checkpointLocation", str(ck))
    )
    for key, value in opts.items():
        writer = writer.option(key, value)
    query = writer.trigger(availableNow=True).start()
    assert query.awaitTermination(180), "copy query did not finish in time"
    assert query.exception() is None


def forget_last_commit(ck: Path) -> int:
    """Make Spark replay its last micro-batch, as after a driver crash between
    the sink's commit and Spark's commit log: drop the last commit-log entry."""
    commits = sorted((ck / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    last = commits[-1]
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    return int(last.name)


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_streaming_batch_replayed_after_a_crash_is_written_once(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path, delivery: str
) -> None:
    source, target = f"src-{delivery}", f"dst-{delivery}"
    keys = [b"k%d" % (i % 50) for i in range(3_000)]
    produce(broker.address, source, [b"m%d" % i for i in range(3_000)], keys=keys)  # type: ignore[arg-type]
    ck = tmp_path / "ck"
    copy_stream(spark, broker, source, target, ck, delivery=delivery)
    assert sorted(topic_values(broker.address, target, 4)) == sorted(
        topic_values(broker.address, source, 4)
    )
    replayed = forget_last_commit(ck)
    assert replayed >= 2  # several micro-batches ran
    copy_stream(spark, broker, source, target, ck, delivery=delivery)
    copied = collections.Counter(topic_values(broker.address, target, 4))
    if delivery == "at_least_once":  # the replay wrote the last batch again
        assert sum(copied.values()) > 3_000
        return
    assert copied == collections.Counter(topic_values(broker.address, source, 4))
    with Admin(broker.address) as admin:
        listing = admin.list_transactions()
    assert list(listing.transactions) == []
    [sink] = listing.sinks
    assert sink.sink.startswith("query-") and sink.batch_id == replayed


def test_transactional_id_reused_with_a_new_checkpoint_is_refused(
    spark: SparkSession, broker: BrokerProcess, tmp_path: Path
) -> None:
    produce(broker.address, "tid-src", [b"x%d" % i for i in range(2_500)])
    copy_stream(spark, broker, "tid-src", "tid-dst", tmp_path / "ck1", transactionalId="copier")
    with pytest.raises(SparkError, match="committed batch 2 already; batch 0 is older"):
        copy_stream(spark, broker, "tid-src", "tid-dst", tmp_path / "ck2", transactionalId="copier")
    assert len(topic_values(broker.address, "tid-dst", 4)) == 2_500


def test_bad_delivery_options_are_named(spark: SparkSession, broker: BrokerProcess) -> None:
    frame = spark.createDataFrame([(b"v",)], "value binary")
    for option, value, message in [
        ("delivery", "maybe_once", "delivery='maybe_once'"),
        ("transactionalId", "a:b", "transactionalId='a:b'"),
    ]:
        writer: Any = frame.write.format("equeue").mode("append")
        writer = writer.option("broker", broker.address).option("topic", "t").option(option, value)
        with pytest.raises(SparkError, match=message):
            writer.save()
