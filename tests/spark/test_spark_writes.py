"""Spark writes with bad or missing column values, against a real broker and SparkSession."""

from __future__ import annotations

import datetime
import time

import pytest

pytest.importorskip("pyspark")

from pyspark.errors import PySparkException
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import SparkSession

from equeue_broker.testing import BrokerProcess
from equeue_spark.client import Admin

pytestmark = pytest.mark.slow  # make test-fast skips it (see pyproject.toml)

SparkError = (PySparkException, CapturedException)


@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_null_value_names_the_column_and_count(
    spark: SparkSession, broker: BrokerProcess, delivery: str
) -> None:
    """The error raised while building a request reaches the user as itself,
    not as gRPC's ``Exception iterating requests! (UNKNOWN)``."""
    df = spark.createDataFrame([("a",), (None,), ("c",), (None,)], "value string").coalesce(1)
    writer = (
        df.write.format("equeue")
        .option("broker", broker.address)
        .option("topic", f"nulls_{delivery}")
        .option("delivery", delivery)
        .mode("append")
    )
    with pytest.raises(SparkError) as caught:
        writer.save()
    message = str(caught.value)
    assert "Exception iterating requests" not in message
    assert "the value column is null in 2 of 4 rows" in message


def test_null_timestamp_is_the_store_time(spark: SparkSession, broker: BrokerProcess) -> None:
    """A null ``timestamp`` means "none given": the message gets the broker's
    store time (it used to be stored as 1970-01-01)."""
    given = datetime.datetime(2021, 5, 6, 7, 8, 9, 123000, tzinfo=datetime.UTC)
    df = spark.createDataFrame(
        [("null-1", None), ("given", given), ("null-2", None)], "value string, timestamp timestamp"
    )
    before_ms = int(time.time() * 1000)
    df.write.format("equeue").option("broker", broker.address).option("topic", "stamps").mode(
        "append"
    ).save()
    after_ms = int(time.time() * 1000)
    rows = {
        r.value: r
        for r in spark.read.format("equeue").option("broker", broker.address)
        .option("topic", "stamps").load().collect()
    }  # fmt: skip
    assert rows[b"given"].timestamp == given.replace(tzinfo=None)  # the session runs in UTC
    with Admin(broker.address) as admin:
        for value in (b"null-1", b"null-2"):
            message = admin.get_message(rows[value].message_id)
            stamp = rows[value].timestamp.replace(tzinfo=datetime.UTC).timestamp() * 1000
            assert round(stamp) == message.timestamp_ms
            # Staged (exactly-once, the default): stamped when the broker staged
            # it; store time is when the write committed.
            assert before_ms <= message.timestamp_ms <= message.store_timestamp_ms <= after_ms


def test_bad_broker_option_fails_at_once_naming_it(spark: SparkSession) -> None:
    """Checked on the driver before any task or call (it used to dial port 443,
    or a wrapped port, and fail late)."""
    df = spark.createDataFrame([("v",)], "value string")
    writer = df.write.format("equeue").option("topic", "t").mode("append")
    with pytest.raises(SparkError, match=r"option broker='127.0.0.1': has no port"):
        writer.option("broker", "127.0.0.1").save()
    reader = spark.read.format("equeue").option("topic", "t")
    with pytest.raises(SparkError, match=r"option broker='a:1,b:2': is not one address"):
        reader.option("broker", "a:1,b:2").load()
