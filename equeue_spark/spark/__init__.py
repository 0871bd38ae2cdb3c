"""The Spark connector: ``format("equeue")`` for batch and streaming reads and writes.

Importing this package imports pyspark (an optional dependency: the ``spark``
extra, ``pip install '.[spark]'`` in a clone); the client package never does. Spark finds the source
without registration through the top-level module ``pyspark_equeue``; to
register it by hand::

    from equeue_spark.spark import EqueueDataSource
    spark.dataSource.register(EqueueDataSource)
"""

from equeue_spark.spark.source import EqueueDataSource

__all__ = ["EqueueDataSource"]
