"""equeue client and Spark connector (client modules never import pyspark)."""

__version__ = "0.1.0"
