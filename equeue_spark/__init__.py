"""equeue client and Spark connector (client modules never import pyspark)."""

from equeue_proto import __version__

__all__ = ["__version__"]
