"""Helpers for the Spark connector tests: a local session, bounded waits."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T = TypeVar("T")


def local_session(app: str = "equeue-tests", **conf: str) -> SparkSession:
    """A real local SparkSession (2 cores, a failed task retried once, as on a
    cluster) whose Python workers run this interpreter
    (``conf``: extra Spark settings, e.g. ``{"spark.driver.memory": "4g"}``)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    return (
        builder.master("local[2,2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float = 60.0) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout_s``.

    For conditions with no event to wait on (rows reaching a Spark sink, a
    group's lag on the broker): the poll is the readiness signal, bounded.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.1)
