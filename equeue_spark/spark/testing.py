"""A local SparkSession for tests, benchmarks and examples (``equeue_spark.spark.testing``).

Spark runs the Python side of a data source in worker processes; they must run
an interpreter that has equeue installed, or ``format("equeue")`` is not
found. ``local_session`` points ``PYSPARK_PYTHON`` at this interpreter, binds
everything to 127.0.0.1 and keeps the session small enough for a laptop or a
2-core CI machine.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def local_session(
    app: str = "equeue-tests", master: str = "local[2,2]", **conf: str
) -> SparkSession:
    """A real local SparkSession whose Python workers run this interpreter.

    ``master`` defaults to two cores with a failed task retried once, as on a
    cluster; ``conf`` adds Spark settings, e.g. ``{"spark.driver.memory": "4g"}``.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    builder = (
        builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "30s")
    )
    return _start(builder)


GATEWAY_ATTEMPTS = 3


def _start(builder: SparkSession.Builder) -> SparkSession:
    """``getOrCreate``, tried again when the JVM exits before it reports its
    gateway port (JAVA_GATEWAY_EXITED): seen on CI machines busy with another
    suite, where a JVM launch can die at start-up; a later launch works."""
    from pyspark.errors import PySparkRuntimeError

    for attempt in range(1, GATEWAY_ATTEMPTS + 1):
        try:
            return builder.getOrCreate()
        except PySparkRuntimeError as exc:
            if exc.getCondition() != "JAVA_GATEWAY_EXITED" or attempt == GATEWAY_ATTEMPTS:
                raise
            log.warning(
                "the Spark JVM exited while starting (attempt %d); starting it again", attempt
            )
    raise AssertionError("unreachable")
