"""Messages as the client sees them, decoded from the broker's record format."""

from __future__ import annotations

from dataclasses import dataclass

from broker.storage.record import check_frame, decode_record
from equeue_proto.protocol import format_message_id
from equeue_spark.client.errors import DataLossError


@dataclass(frozen=True, slots=True)
class Message:
    topic: str
    queue_id: int
    offset: int
    key: bytes | None
    value: bytes
    tag: str
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int
    """Producer timestamp (the broker's store time when the producer gave none)."""
    store_timestamp_ms: int
    message_id: str


def decode_records(records: bytes, broker_id: str) -> list[Message]:
    """Every record of a pull reply, checksums verified (``DataLossError`` if not)."""
    out = []
    pos = 0
    end = len(records)
    while pos < end:
        size = check_frame(records, pos, end)
        if isinstance(size, str):
            raise DataLossError(f"received a damaged record at byte {pos}: {size}")
        m = decode_record(records, pos)
        message_id = format_message_id(broker_id, m.position)
        fields = (m.topic, m.queue_id, m.queue_offset, m.key, m.value, m.tag, m.headers)
        out.append(Message(*fields, m.producer_timestamp_ms, m.store_timestamp_ms, message_id))
        pos += size
    return out
