"""Helpers of the test suite (not tests): byte surgery, fault injection, bounded
waits, and the scripts some tests run as child processes. Broker processes come
from the shipped harness ``equeue_broker.testing``, Spark sessions from
``equeue_spark.spark.testing``."""
