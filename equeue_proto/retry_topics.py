"""A consumer group's retry and dead-letter topics: their names and the headers
the broker puts on the copies it writes there (broker.proto, "Retry and dead
letters"). Both sides read them from here: the broker writes them
(``equeue_broker.server.retry``), the client reads them
(``equeue_spark.client.records``, ``consumer``).
"""

from __future__ import annotations

RESERVED = "%"
"""Topic and group names starting with it are the broker's own."""
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
RESENT_PREFIX = "%RESENT%"
"""Which dead letters were resent (one record per resend; the broker's)."""

ORIGIN_TOPIC = "equeue.origin.topic"
ORIGIN_QUEUE = "equeue.origin.queue"
ORIGIN_OFFSET = "equeue.origin.offset"
ORIGIN_ID = "equeue.origin.id"
DELIVERIES = "equeue.deliveries"
ERROR = "equeue.error"
DLQ_REASON = "equeue.dlq.reason"
OWN_HEADERS = frozenset(
    (ORIGIN_TOPIC, ORIGIN_QUEUE, ORIGIN_OFFSET, ORIGIN_ID, DELIVERIES, ERROR, DLQ_REASON)
)
"""Headers the broker writes on copies; a consumer's own are kept as they are."""


def retry_topic(group: str) -> str:
    """The topic a group's given-back messages wait in (read by its consumers)."""
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    """The group's dead-letter topic (read by nobody automatically)."""
    return DLQ_PREFIX + group


def resent_topic(group: str) -> str:
    return RESENT_PREFIX + group
