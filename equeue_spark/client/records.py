"""Messages as the client sees them, decoded from the broker's record format.

Pull replies carry records exactly as the broker stores them (``equeue_proto.record``);
every record's checksum is verified here, so corruption anywhere between the
broker's disk and this process is caught. The C accelerator decodes a reply in
one call; without it (or with ``EQUEUE_PURE_PYTHON`` set) the pure-Python
decoder of ``equeue_proto.record`` is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from equeue_proto.accel import CODEC
from equeue_proto.protocol import format_message_id
from equeue_proto.record import Buffer, check_frame, decode_record
from equeue_proto.retry_topics import (
    DELIVERIES,
    ERROR,
    ORIGIN_ID,
    ORIGIN_OFFSET,
    ORIGIN_QUEUE,
    ORIGIN_TOPIC,
)
from equeue_spark.client.errors import DataLossError


class Origin(NamedTuple):
    """Where a retried or dead-lettered message was first read."""

    topic: str
    queue_id: int
    offset: int
    message_id: str


def _int(value: bytes | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


class Message(NamedTuple):
    """One message. A named tuple: the C decoder builds these directly."""

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
    position: int
    """Global log position on its broker."""
    broker_id: str

    @property
    def message_id(self) -> str:
        """``<broker_id>-<position>``: fetch it again with ``Admin.get_message``."""
        return format_message_id(self.broker_id, self.position)

    def header(self, name: str) -> bytes | None:
        """The value of header ``name`` (the last one, if repeated); None if absent."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found

    @property
    def retry(self) -> bool:
        """A message given back (``Consumer.nack``) and delivered again, or
        one read from a dead-letter topic: ``origin`` says where it was first."""
        return self.header(ORIGIN_TOPIC) is not None

    @property
    def origin(self) -> Origin | None:
        """Where a retried or dead-lettered message came from (its headers); None otherwise."""
        topic = self.header(ORIGIN_TOPIC)
        if topic is None:
            return None
        queue, offset = self.header(ORIGIN_QUEUE), self.header(ORIGIN_OFFSET)
        message_id = self.header(ORIGIN_ID) or b""
        return Origin(
            topic.decode("utf-8", "replace"), _int(queue, 0), _int(offset, -1),
            message_id.decode("utf-8", "replace"),
        )  # fmt: skip

    @property
    def deliveries(self) -> int:
        """Deliveries of this message: 1 for a first delivery; a retried one
        a consumer hands you counts this delivery too; one read from a
        dead-letter topic, every delivery it had."""
        return _int(self.header(DELIVERIES), 1)

    @property
    def error(self) -> str | None:
        """The error text the last ``nack`` gave (retried or dead-lettered messages)."""
        text = self.header(ERROR)
        return None if text is None else text.decode("utf-8", "replace")


_decode_c: Callable[[Buffer, type[Message], str], list[Message]] | None = (
    CODEC.decode_frames if CODEC else None
)


def decode_records(records: Buffer, broker_id: str) -> list[Message]:
    """Every record of a pull reply, checksums verified (``DataLossError`` if not)."""
    if _decode_c is None:
        return _decode_py(records, broker_id)
    try:
        return _decode_c(records, Message, broker_id)
    except ValueError as exc:
        raise DataLossError(f"received a damaged record: {exc}") from None


def decode_intact(records: Buffer, broker_id: str) -> tuple[list[Message], str | None]:
    """The records of a reply up to the first damaged one, and why that one
    is damaged (None if none is): what a consumer can still deliver."""
    out: list[Message] = []
    pos, end = 0, len(records)
    while pos < end:
        size = check_frame(records, pos, end)
        if isinstance(size, str):
            return out, f"received a damaged record at byte {pos}: {size}"
        out += _decode_py(memoryview(records)[pos : pos + size], broker_id)
        pos += size
    return out, None


def _decode_py(records: Buffer, broker_id: str) -> list[Message]:
    out = []
    pos = 0
    end = len(records)
    while pos < end:
        size = check_frame(records, pos, end)
        if isinstance(size, str):
            raise DataLossError(f"received a damaged record at byte {pos}: {size}")
        m = decode_record(records, pos)
        fields = (m.topic, m.queue_id, m.queue_offset, m.key, m.value, m.tag, m.headers)
        out.append(
            Message(*fields, m.producer_timestamp_ms, m.store_timestamp_ms, m.position, broker_id)
        )
        pos += size
    return out
