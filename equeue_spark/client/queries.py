"""Queries by key and by store time (``Admin.query_messages``): the request.

The broker finds a topic's messages by key through its key index, or by
store-time range alone (broker.proto, "Keys and queries"); this module turns
the caller's arguments into the request, checked before anything is sent.
"""

from __future__ import annotations

from datetime import UTC, datetime

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.records import Message

DEFAULT_QUERY_LIMIT = 32
MAX_QUERY_LIMIT = 10_000
"""Most messages one query returns (the broker's limit too)."""


class QueryResult(list[Message]):
    """The messages a query found (a list: newest first), and ``truncated``:
    True when more may match than returned (the limit, the reply's byte
    limit, or the broker's scan or time budget was reached, in any broker
    group asked): narrow the time range or raise the limit."""

    truncated: bool

    def __init__(self, messages: list[Message] | None = None, truncated: bool = False) -> None:
        super().__init__(messages or [])
        self.truncated = truncated


def time_ms(value: datetime | int | None, name: str) -> int:
    """``value`` as ms since the epoch (0 for None: unbounded); a naive
    datetime is UTC (as for delivery times)."""
    if value is None:
        return 0
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return int(value.timestamp() * 1000)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r}: give a datetime or ms since 1970 (>= 0)")
    return value


def query_request(
    topic: str,
    key: bytes | str | None,
    start: datetime | int | None,
    end: datetime | int | None,
    limit: int,
) -> pb.QueryMessagesRequest:
    """The request of a query; ValueError for bad arguments."""
    if not topic:
        raise ValueError("give the topic to query")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_QUERY_LIMIT:
        raise ValueError(f"limit={limit!r}: give 1 to {MAX_QUERY_LIMIT}")
    start_ms, end_ms = time_ms(start, "start"), time_ms(end, "end")
    if end_ms and start_ms >= end_ms:
        raise ValueError(f"start {start_ms} ms is not before end {end_ms} ms: an empty range")
    raw = key.encode() if isinstance(key, str) else key
    return pb.QueryMessagesRequest(
        topic=topic, key=raw or b"", by_key=raw is not None, start_ms=start_ms, end_ms=end_ms,
        limit=limit,
    )  # fmt: skip
