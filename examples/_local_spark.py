"""Shared by the Spark examples: a quiet local SparkSession.

The ``equeue`` format needs no registration: pyspark finds the connector
through the ``pyspark_equeue`` module installed with the package. What this
module adds is only for a pleasant local run: Python workers use this
interpreter, everything binds to 127.0.0.1, two shuffle partitions on a
laptop, and Spark logs only errors (no startup banner, no progress bars).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

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
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    with tempfile.TemporaryDirectory(prefix="equeue-spark-") as tmp:
        log_config = Path(tmp) / "log4j2.properties"
        log_config.write_text(_LOG4J2)
        spark = (
            SparkSession.builder.master("local[2]")
            .appName(app)
            .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log_config}")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.streaming.stopTimeout", "30s")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            yield spark
        finally:
            spark.stop()
