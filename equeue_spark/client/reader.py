"""Bulk reads of an offset range with the server-streaming ``PullStream`` RPC.

One call streams a queue range in batches, instead of a round trip per batch:
what a catch-up read (or a Spark task reading its partition) wants.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import grpc

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.connection import ClientConfig, Connection
from equeue_spark.client.errors import from_rpc_error
from equeue_spark.client.filters import check_filter, require_filters
from equeue_spark.client.records import Message, decode_records
from equeue_spark.client.wire import PullReply


def stream_replies(
    conn: Connection,
    topic: str,
    queue_id: int,
    start: int,
    end: int = 0,
    *,
    batch_messages: int = 1000,
    batch_bytes: int = 1 << 20,
    tags: Sequence[str] = (),
    filter: str = "",
) -> Iterator[PullReply]:
    """The raw replies of a PullStream over ``[start, end)`` (``end`` 0: the
    queue's end when the call starts). The deadline covers the whole stream.
    Each reply's ``records`` is a view of the received message (wire.py).

    With ``filter`` (an expression, docs/client.md "Filters") only records
    that pass are sent; a reply may then carry none and still move
    ``next_offset`` on (the broker inspects at most ``max_filter_scan``
    records a reply). ``InvalidRequest`` for a bad expression, or for a broker
    too old to apply one (``UnsupportedFilter``), before anything is read."""
    if filter:
        check_filter(filter)
        require_filters(conn, topic)
    request = pb.PullStreamRequest(
        topic=topic,
        queue_id=queue_id,
        offset=start,
        end_offset=end,
        batch_messages=batch_messages,
        batch_bytes=batch_bytes,
        tags=tags,
        filter=filter,
    )
    try:
        yield from conn.pull_stream(request, timeout=conn.config.timeout_s)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from exc


def read_range(
    topic: str,
    queue_id: int,
    start: int,
    end: int = 0,
    *,
    broker: str = "",
    config: ClientConfig | None = None,
    batch_messages: int = 1000,
) -> Iterator[list[Message]]:
    """Decoded batches of ``[start, end)`` of one queue, in offset order::

    for batch in read_range("orders", 0, 0, broker="127.0.0.1:5000"):
        for message in batch:
            ...
    """
    with Connection(config or ClientConfig(broker=broker)) as conn:
        for reply in stream_replies(
            conn, topic, queue_id, start, end, batch_messages=batch_messages
        ):
            if reply.count:
                yield decode_records(reply.records, reply.broker_id)
