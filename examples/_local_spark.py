"""Shared by the Spark examples: a quiet local SparkSession.

The ``equeue`` format needs no registration: pyspark finds the connector
through the ``pyspark_equeue`` module installed with the package. What this
module adds is only for a pleasant local run: the shipped
``equeue_spark.spark.testing.local_session`` (Python workers use this
interpreter, everything binds to 127.0.0.1, two shuffle partitions), with
Spark logging only errors (no startup banner, no progress bars).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from equeue_spark.spark.testing import local_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.spark.name = org.apache.spark
logger.spark.level = error
"""
# (Spark's own loggers get their own entry: a pyspark session otherwise resets
# the console to WARN and announces it.)


@contextmanager
def local_spark(app: str) -> Iterator[SparkSession]:
    """A local[2] SparkSession for the ``with`` block; stopped at the end."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="equeue-spark-") as tmp:
        log_config = Path(tmp) / "log4j2.properties"
        log_config.write_text(_LOG4J2)
        spark = local_session(
            app,
            master="local[2]",
            **{
                "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log_config}",
                "spark.ui.showConsoleProgress": "false",
            },
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            yield spark
        finally:
            spark.stop()
