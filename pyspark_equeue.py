"""Spark's hook for finding the ``equeue`` data source without registration.

At session start pyspark imports every top-level module named ``pyspark_<x>``
and registers its ``DefaultSource``; this one-line module is that hook (it has
to be top-level, which is why it lives outside the ``equeue_spark`` package).
"""

from equeue_spark.spark.source import EqueueDataSource as DefaultSource

__all__ = ["DefaultSource"]
