"""Spark's hook for finding the ``equeue`` data source without registration.

At session start pyspark imports every top-level module named ``pyspark_<x>``
and registers its ``DefaultSource``; this module is that hook (it has to be
top-level, which is why it lives outside the ``equeue_spark`` package).

That import runs in a Spark Python worker, under ``PYSPARK_PYTHON`` (``python3``
from the PATH when unset), not in the driver's interpreter. When that
interpreter sees this module but cannot import the connector (a clone's root
on its path, the dependencies in another virtualenv), ``DefaultSource`` is a
stand-in that fails the query with one line naming the interpreter and
``PYSPARK_PYTHON``, instead of Spark's ``DATA_SOURCE_NOT_FOUND``.
"""

from __future__ import annotations

try:
    from equeue_spark.spark.source import EqueueDataSource as DefaultSource
except ImportError as _missing:
    import os as _os
    import sys as _sys

    from pyspark.sql.datasource import DataSource as _DataSource

    _configured = _os.environ.get("PYSPARK_PYTHON", "")
    _WHY = (
        f"equeue: Spark's Python workers run {_sys.executable} "
        + (f"(PYSPARK_PYTHON={_configured})" if _configured else "(PYSPARK_PYTHON is not set)")
        + f", which cannot import the connector ({_missing}): set PYSPARK_PYTHON to the "
        "python that equeue-mq[spark] is installed in, before the SparkSession starts"
    )

    class DefaultSource(_DataSource):  # type: ignore[no-redef]
        """Stands in for the connector in an interpreter that cannot import it."""

        @classmethod
        def name(cls) -> str:
            return "equeue"

        def __init__(self, options: dict[str, str]) -> None:
            raise ImportError(_WHY)


__all__ = ["DefaultSource"]
