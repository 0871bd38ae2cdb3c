"""Spark writes with bad or missing column values, against a real broker and SparkSession."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from pyspark.errors import PySparkException
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.sql import SparkSession

from equeue_broker.testing import BrokerProcess

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
