"""Spark and issue 27: a sink ``deliver_at`` column delays each row's
message; a group's dead-letter topic (``%DLQ%G``) reads like any topic.
Against a real broker and SparkSession (kept to two tests: they are slow)."""

from __future__ import annotations

import datetime
import time

import pytest

pytest.importorskip("pyspark")

from pyspark.errors import PySparkException
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import SparkSession

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin, Consumer, Message, Producer

pytestmark = pytest.mark.slow  # make test-fast skips it (see pyproject.toml)

SparkError = (PySparkException, CapturedException)
BUDGET_S = 60.0


@pytest.mark.timeout(300)
def test_deliver_at_column_delays_each_row(spark: SparkSession, broker: BrokerProcess) -> None:
    now = datetime.datetime.now(datetime.UTC)
    due = now + datetime.timedelta(seconds=3)
    rows = [("now", None), ("later", due)]
    df = spark.createDataFrame(rows, "value string, deliver_at timestamp").coalesce(1)
    writer = df.write.format("equeue").option("broker", broker.address).mode("append")
    with pytest.raises(SparkError, match="delivery=at_least_once"):
        writer.option("topic", "spark-later").save()  # exactly-once: refused before any task
    writer.option("topic", "spark-later").option("delivery", "at_least_once").save()
    written_ms = int(time.time() * 1000)
    due_ms = int(due.timestamp() * 1000)
    with Consumer(broker.address) as consumer:
        consumer.assign("spark-later", range(4))
        seen: dict[bytes, Message] = {}
        deadline = time.monotonic() + BUDGET_S
        while len(seen) < 2:
            assert time.monotonic() < deadline, f"only {sorted(seen)} came"
            for m in consumer.poll(timeout_s=0.5):
                seen[m.value] = m
    assert seen[b"later"].store_timestamp_ms >= due_ms  # not before its time
    if written_ms < due_ms - 1000:  # the write ended well before the due time (a loaded
        # machine may be past it): the null row did not wait for it
        assert seen[b"now"].store_timestamp_ms < due_ms


@pytest.mark.timeout(300)
def test_read_a_dead_letter_topic(spark: SparkSession, broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("spark-work", queues=1)
        producer.send_batch("spark-work", [b"d0", b"d1"])
    dead = 0
    with Consumer(
        broker.address, group="billing", topics=["spark-work"], max_reconsume_times=1,
        heartbeat_interval_s=0.2,
    ) as consumer:  # fmt: skip
        deadline = time.monotonic() + BUDGET_S
        while dead < 2:
            assert time.monotonic() < deadline, "the messages never reached the DLQ"
            for m in consumer.poll(timeout_s=0.5):
                (outcome,) = consumer.nack(m, delay_s=0.1, error="no")
                dead += outcome.action == "dlq"
            consumer.commit()
    df = (
        spark.read.format("equeue")
        .option("broker", broker.address)
        .option("topic", "%DLQ%billing")
        .option("includeHeaders", "true")
        .load()
    )
    rows = sorted(df.select("value", "topic", "headers").collect(), key=lambda r: r.value)
    assert [bytes(r.value) for r in rows] == [b"d0", b"d1"]
    assert {r.topic for r in rows} == {"%DLQ%billing"}
    headers = {h.key: bytes(h.value) for h in rows[0].headers}
    assert headers["equeue.origin.topic"] == b"spark-work"
    assert headers["equeue.deliveries"] == b"2"
