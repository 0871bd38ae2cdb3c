"""Spark SQL settings for one test on the session-wide SparkSession."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

NO_DATA_PROGRESS = "spark.sql.streaming.noDataProgressEventInterval"


@contextlib.contextmanager
def spark_conf(spark: Any, key: str, value: str) -> Iterator[None]:
    """Set ``key`` to ``value`` on ``spark``'s session for the block, then restore it.

    A streaming query copies the session's settings when it starts, so a query
    started inside the block keeps them after it.
    """
    old = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if old is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, old)


def progress_every_trigger(spark: Any) -> contextlib.AbstractContextManager[None]:
    """Queries started in the block report a progress event for every trigger,
    also one that ran no batch (Spark's default: one such event per 10 s), so a
    test can see triggers pass without a batch without waiting 10 s for each."""
    return spark_conf(spark, NO_DATA_PROGRESS, "0ms")
