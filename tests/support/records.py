"""Records built by the real encoder, for tests of the format and its decoders."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from equeue_broker.storage import MessageBatch, MessageLimits
from equeue_broker.storage.index.queue_index import ENTRY_SIZE
from equeue_broker.storage.log.record import PreparedBatch, encode_records, prepare_batch
from equeue_proto.record import Headers

Row = tuple[bytes, bytes | None, str, Headers, int]
"""(value, key, tag, headers, producer timestamp ms) of one message."""
LIMITS = MessageLimits()


def batch_of(rows: Sequence[Row]) -> MessageBatch:
    return MessageBatch(
        values=[r[0] for r in rows],
        keys=[r[1] for r in rows],
        tags=[r[2] for r in rows],
        headers=[r[3] for r in rows],
        timestamps_ms=[r[4] for r in rows],
    )


def encode_prepared(
    prepared: PreparedBatch,
    *,
    topic: bytes,
    queue_id: int = 0,
    position: int = 0,
    first_offset: int = 0,
    store_ms: int = 555,
    start: int = 0,
    encoder: Callable[..., int] = encode_records,
) -> tuple[bytes, bytes]:
    """(records, index entries) of messages ``[start, end)`` of a prepared batch."""
    count = len(prepared.batch) - start
    out = bytearray(prepared.total_bytes)
    entries = bytearray(count * ENTRY_SIZE)
    written = encoder(
        out, position=position, topic=topic, queue_id=queue_id, first_offset=first_offset,
        store_ms=store_ms, prepared=prepared, start=start, stop=len(prepared.batch),
        index_out=entries,
    )  # fmt: skip
    return bytes(out[:written]), bytes(entries)


def encode_rows(
    rows: Sequence[Row], *, topic: str = "topic-1", queue_id: int = 0, position: int = 0,
    first_offset: int = 0, store_ms: int = 555,
) -> tuple[bytes, bytes]:  # fmt: skip
    """(records, index entries) of ``rows`` as the broker's log holds them."""
    prepared = prepare_batch(batch_of(rows), topic.encode(), LIMITS)
    return encode_prepared(
        prepared, topic=topic.encode(), queue_id=queue_id, position=position,
        first_offset=first_offset, store_ms=store_ms,
    )  # fmt: skip
