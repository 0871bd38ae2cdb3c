"""The offsets of a pushed ``key = ...`` equality, found through the broker's key index.

A batch read whose ``where`` names keys (``key = X'..'`` or ``key IN (...)``,
at most ``MAX_KEYS``) asks each broker group of each topic
``Admin.QueryMessages`` for every key, within the pushed store-time bounds,
and plans only the offsets found (grouped into at most ``MAX_SPANS`` ranges a
queue). The broker filter still checks every record read, so the result is
exact either way: the index only narrows (a record found by one of its extra
keys, the ``keys`` header, is read and dropped by the filter). When any answer
may be incomplete (``truncated``: the limit or the broker's scan limit), the
key index is off, or the broker is too old to query, nothing is narrowed.

Pyspark-free.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.connection import Connection
from equeue_spark.client.errors import EqueueError
from equeue_spark.client.records import decode_records
from equeue_spark.client.routing import Routes
from equeue_spark.spark.offsets import QueueKey, Span, cluster_key, split_key

log = logging.getLogger("equeue.spark")

QUERY_LIMIT = 10_000
"""Messages asked per key and broker group (the broker's maximum)."""
MAX_SPANS = 256
"""Most offset ranges planned per queue from the offsets found (one task
reads them, a ``PullStream`` call each)."""


def key_offsets(
    routes: Routes,
    names: Iterable[str],
    keys: Iterable[bytes],
    store_ms: tuple[int | None, int | None],
    seed: str = "",
) -> dict[QueueKey, tuple[Span, ...]] | None:
    """Per queue of the ``names`` (``BROKER/TOPIC`` or a bare topic), the
    offset ranges holding every message with one of ``keys`` stored within
    ``store_ms``; None when an answer may be incomplete or a broker cannot
    answer (then nothing is narrowed). A queue missing from the result holds
    none of them."""
    lo, hi = store_ms
    found: dict[QueueKey, set[int]] = {}
    for name in sorted(set(names)):
        broker, topic = split_key(name)
        for key in sorted(set(keys)):
            request = pb.QueryMessagesRequest(
                topic=topic, key=key, by_key=True, start_ms=max(lo or 0, 0),
                end_ms=max(hi or 0, 0), limit=QUERY_LIMIT,
            )  # fmt: skip
            try:
                reply = routes.read_on(topic, broker, functools.partial(_query, request), seed)
            except EqueueError as exc:  # key index off, an older broker, ...
                log.info("%s: no key-index plan (%s); the broker filter alone", name, exc)
                return None
            if reply.truncated:
                log.info("%s: key %r has more than the key index answers; the filter alone",
                         name, key)  # fmt: skip
                return None
            for m in reply.messages:
                (message,) = decode_records(m.record, m.message_id.rpartition("-")[0])
                found.setdefault((cluster_key(broker, topic), message.queue_id), set()).add(
                    message.offset
                )
    return {queue: coarsen(offsets, MAX_SPANS) for queue, offsets in found.items()}


def _query(
    request: pb.QueryMessagesRequest, conn: Connection, _last: bool
) -> pb.QueryMessagesReply:
    reply: pb.QueryMessagesReply = conn.call(conn.admin.QueryMessages, request)
    return reply


def coarsen(offsets: Iterable[int], max_spans: int) -> tuple[Span, ...]:
    """Ranges covering ``offsets``: runs of adjacent offsets, joined across
    the smallest gaps until at most ``max_spans`` remain (the ranges then
    hold other offsets too, which the broker filter drops)."""
    ordered = sorted(set(offsets))
    if not ordered:
        return ()
    gaps = sorted(
        (ordered[i + 1] - ordered[i], i)
        for i in range(len(ordered) - 1)
        if ordered[i + 1] > ordered[i] + 1
    )
    cuts = sorted(i for _, i in gaps[len(gaps) - (max_spans - 1) :]) if max_spans > 1 else []
    spans: list[Span] = []
    start = ordered[0]
    for i in cuts:
        spans.append((start, ordered[i] + 1))
        start = ordered[i + 1]
    spans.append((start, ordered[-1] + 1))
    return tuple(spans)
