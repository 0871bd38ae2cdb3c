"""The producer record: the control record written atomically with an idempotent batch.

An idempotent append (``Store.append`` with an ``Idempotence``) writes one
control record (txn_records.py's framing: CONTROL flag, topic "", queue 0,
offset 0) immediately before the batch's records, in the same atomic piece of
the log: the control record carries no BATCH_END, the batch's last record does,
so recovery keeps both or neither. Its tag is ``producer`` and its value, all
integers little-endian::

    version      u8    1
    producer_id  u64
    epoch        u32
    sequence     u64   the batch's sequence number for its queue
    queue_id     u16
    first_offset i64   the queue offset of the batch's first record; -1 for a
                       transaction's staged batch (offsets come at commit)
    count        u32   records in the batch
    topic              UTF-8, the rest of the value

The batch's records follow the control record at once: the first one lies at
the control record's position plus its frame size, which is the position the
producer table keeps (truncating the log there drops the batch from it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from equeue_broker.storage.config import MessageLimits
from equeue_broker.storage.errors import CorruptionError
from equeue_broker.storage.log.record import MessageBatch, PreparedBatch, prepare_batch

PRODUCER_TAG = "producer"
_VERSION = 1
_FIXED = struct.Struct("<BQIQHqI")
_LIMITS = MessageLimits(max_batch_bytes=1 << 20, max_message_bytes=1 << 20)


@dataclass(frozen=True, slots=True)
class ProducerBatch:
    """What one producer record says."""

    producer_id: int
    epoch: int
    sequence: int
    topic: str
    queue_id: int
    first_offset: int
    count: int


def encode_value(batch: ProducerBatch) -> bytes:
    fixed = _FIXED.pack(
        _VERSION, batch.producer_id, batch.epoch, batch.sequence, batch.queue_id,
        batch.first_offset, batch.count,
    )  # fmt: skip
    return fixed + batch.topic.encode()


def decode_value(value: bytes | memoryview) -> ProducerBatch:
    """The record's batch; ``CorruptionError`` if ``value`` is not one (its
    checksum passed, so this means a bug or a newer broker)."""
    if len(value) < _FIXED.size:
        raise CorruptionError(f"producer record of {len(value)} bytes is too short")
    version, pid, epoch, seq, queue_id, first, count = _FIXED.unpack_from(value)
    if version != _VERSION:
        raise CorruptionError(f"producer record of unknown version {version}")
    try:
        topic = bytes(value[_FIXED.size :]).decode()
    except UnicodeDecodeError as exc:
        raise CorruptionError(f"producer record with a bad topic: {exc}") from None
    return ProducerBatch(pid, epoch, seq, topic, queue_id, first, count)


def prepare_record(batch: ProducerBatch) -> PreparedBatch:
    """The producer record as a one-record batch for the log writer."""
    return prepare_batch(MessageBatch([encode_value(batch)], tags=[PRODUCER_TAG]), b"", _LIMITS)
