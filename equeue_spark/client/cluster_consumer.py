"""``ClusterConsumer``: the name ``Consumer`` had over a cluster's brokers.

One ``Consumer`` class reads one broker and a cluster alike (consumer.py;
one broker is a cluster of one, routing.py); this name stays for imports.
"""

from equeue_spark.client.consumer import Consumer

ClusterConsumer = Consumer
"""``Consumer`` (kept for imports: ``Consumer(namesrv=...)`` is the same class)."""

__all__ = ["ClusterConsumer"]
