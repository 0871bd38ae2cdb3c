"""The data path's wire work that the broker does itself instead of protobuf.

- ``decode_columns``: a produce request's columns into a storage batch (the
  blobs split in C, ``_codec.split_blob``, no Python loop per message).
- ``pull_reply_framer``: a pull reply is mostly one large ``bytes`` field, the
  records as stored. Built as a ``pb.PullReply`` it would be copied three times
  on the way out (into the message, into the serialized string, into gRPC's
  buffer). Instead the store joins a prefix, the records and a suffix in the
  one copy it makes out of its memory maps (``store.reads.read_records(frame=...)``).
- ``produce_reply``: the reply to a batch appended to one queue, its three
  per-message columns packed in C (``_codec.varints``) instead of protobuf
  building a Python int per message.

Servicers return these bytes; ``handlers.rebuild`` lets pre-encoded replies
through gRPC's serializer untouched. They are exactly what protobuf's
``SerializeToString()`` gives (the proto3 encoding: fields in number order,
zero values omitted, repeated numbers packed); tests hold the two equal, so
the ``.proto`` stays the contract. Field numbers come from the generated code;
keys, varints and fields are written by the contract's ``equeue_proto.wire``.
"""

from __future__ import annotations

import functools
import itertools
import struct
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence

from equeue_broker.server.errors import BadRequest
from equeue_broker.storage import Framer, MessageBatch, ReadStatus, RecordsResult
from equeue_broker.storage.index.queue_index import ENTRY_SIZE
from equeue_proto import wire
from equeue_proto.accel import CODEC
from equeue_proto.protocol import BROKER_TIME
from equeue_proto.record import decode_headers
from equeue_proto.v1 import broker_pb2 as pb

_ENTRY_WORDS = ENTRY_SIZE // 8
"""Index entries in 64-bit words; an entry's first word is its position + 1."""


def _varints_py(values: bytes | bytearray, count: int, stride: int, add: int, step: int) -> bytes:
    """Reference for ``_codec.varints``: packed varints of values[i * stride] + add + i * step."""
    words = memoryview(values).cast("q")
    return b"".join(wire.varint(words[i * stride] + add + i * step) for i in range(count))


def _split_py(blob: bytes, lengths: Sequence[int]) -> list[bytes] | list[memoryview]:
    """Reference for ``_codec.split_blob`` (memoryview slices; it raises the same errors)."""
    if min(lengths, default=0) < 0:
        i = next(i for i, n in enumerate(lengths) if n < 0)
        raise ValueError(f"length {i} is {lengths[i]}")
    if sum(lengths) != len(blob):
        raise ValueError(f"lengths sum to {sum(lengths)} but the blob has {len(blob)} bytes")
    view = memoryview(blob)
    ends = list(itertools.accumulate(lengths))
    return [view[end - n : end] for end, n in zip(ends, lengths, strict=True)]


_varints: Callable[[bytes | bytearray, int, int, int, int], bytes]
_split_blob: Callable[[bytes, Sequence[int]], list[bytes] | list[memoryview]]
if CODEC is not None:
    _varints, _split_blob = CODEC.varints, CODEC.split_blob
else:
    _varints, _split_blob = _varints_py, _split_py


# Field keys (number and wire type), from the generated code's field numbers.
_PULL = pb.PullReply
_STATUS = wire.key(_PULL.STATUS_FIELD_NUMBER, wire.VARINT)
_RECORDS = wire.key(_PULL.RECORDS_FIELD_NUMBER, wire.LENGTH)
_COUNT = wire.key(_PULL.COUNT_FIELD_NUMBER, wire.VARINT)
_NEXT = wire.key(_PULL.NEXT_OFFSET_FIELD_NUMBER, wire.VARINT)
_EARLIEST = wire.key(_PULL.EARLIEST_OFFSET_FIELD_NUMBER, wire.VARINT)
_END = wire.key(_PULL.END_OFFSET_FIELD_NUMBER, wire.VARINT)
_BROKER_ID = wire.key(_PULL.BROKER_ID_FIELD_NUMBER, wire.LENGTH)
_PRODUCE = pb.ProduceReply
_P_BROKER_ID = wire.key(_PRODUCE.BROKER_ID_FIELD_NUMBER, wire.LENGTH)
_P_QUEUE_IDS = wire.key(_PRODUCE.QUEUE_IDS_FIELD_NUMBER, wire.LENGTH)
_P_OFFSETS = wire.key(_PRODUCE.OFFSETS_FIELD_NUMBER, wire.LENGTH)
_P_POSITIONS = wire.key(_PRODUCE.POSITIONS_FIELD_NUMBER, wire.LENGTH)


@functools.lru_cache(maxsize=4)
def _broker_id_field(key: bytes, broker_id: str) -> bytes:
    """The broker id field: the same in every reply, encoded once."""
    return wire.bytes_field(key, broker_id.encode())


def pull_reply_framer(broker_id: str, status_numbers: Mapping[ReadStatus, int]) -> Framer:
    """A ``Framer`` turning a ``RecordsResult`` into PullReply wire bytes.

    ``status_numbers`` maps the store's read status to the PullStatus enum number.
    """
    id_field = _broker_id_field(_BROKER_ID, broker_id)

    def frame(result: RecordsResult) -> tuple[bytes, bytes]:
        prefix = wire.int_field(_STATUS, status_numbers[result.status])
        if result.nbytes:
            prefix += _RECORDS + wire.varint(result.nbytes)
        suffix = b"".join((
            wire.int_field(_COUNT, result.count),
            wire.int_field(_NEXT, result.next_offset),
            wire.int_field(_EARLIEST, result.earliest),
            wire.int_field(_END, result.end),
            id_field,
        ))  # fmt: skip
        return prefix, suffix

    return frame


def produce_reply(
    broker_id: str, queue_id: int, first_offset: int, entries: bytes | bytearray
) -> bytes:
    """ProduceReply bytes for a batch appended to one queue: every message's
    queue, its offset (``first_offset`` counting up) and its log position (from
    the index ``entries`` the append wrote, one per message)."""
    count = len(entries) // ENTRY_SIZE
    one = array("q", [queue_id, first_offset]).tobytes()
    return b"".join((
        _broker_id_field(_P_BROKER_ID, broker_id),
        wire.bytes_field(_P_QUEUE_IDS, _varints(one, count, 0, 0, 0)),
        wire.bytes_field(_P_OFFSETS, _varints(one[8:], count, 0, 0, 1)),
        wire.bytes_field(_P_POSITIONS, _varints(entries, count, _ENTRY_WORDS, -1, 0)),
    ))  # fmt: skip


def decode_columns(columns: pb.MessageColumns) -> MessageBatch:
    """A storage batch from the wire's columns, checking every length.

    Values and keys become one ``bytes`` each, split from the request's blobs in C.
    """
    count = columns.count
    if count == 0:
        raise BadRequest("a produce request must carry at least one message")
    values = _split("values", columns.values, columns.value_lengths, count)
    keys: list[bytes | memoryview | None] | None = None
    if columns.key_lengths:
        lengths = list(columns.key_lengths)
        if len(lengths) != count:
            raise BadRequest(f"key_lengths has {len(lengths)} entries for {count} messages")
        if min(lengths) < -1:
            raise BadRequest(f"key_lengths holds {min(lengths)}; -1 means no key")
        present = _split("keys", columns.keys, [n for n in lengths if n >= 0], None)
        it: Iterator[bytes | memoryview] = iter(present)
        keys = [None if n < 0 else next(it) for n in lengths]
    elif columns.keys:
        raise BadRequest("keys given without key_lengths")
    tags = list(columns.tags) or None
    if tags is not None and len(tags) != count:
        raise BadRequest(f"tags has {len(tags)} entries for {count} messages")
    headers = None
    if columns.header_lengths:
        raw = _split("headers", columns.headers, columns.header_lengths, count)
        try:
            headers = [decode_headers(bytes(h)) for h in raw]
        except (ValueError, IndexError, UnicodeDecodeError, struct.error) as exc:
            raise BadRequest(f"malformed headers: {exc}") from None
    stamps = list(columns.timestamps_ms) or None
    if stamps is not None and len(stamps) != count:
        raise BadRequest(f"timestamps_ms has {len(stamps)} entries for {count} messages")
    if stamps is not None and min(stamps) < BROKER_TIME:
        raise BadRequest(
            f"timestamps_ms holds {min(stamps)}; timestamps are ms since the epoch, "
            f"or {BROKER_TIME} for the broker's time"
        )
    return MessageBatch(values, keys, tags, headers, stamps)  # type: ignore[arg-type]


def _split(
    name: str, blob: bytes, lengths: Sequence[int], count: int | None
) -> list[bytes] | list[memoryview]:
    if count is not None and len(lengths) != count:
        raise BadRequest(f"{name[:-1]}_lengths has {len(lengths)} entries for {count} messages")
    try:
        return _split_blob(blob, lengths)
    except ValueError:  # say which column, with its numbers
        field = f"{name[:-1]}_lengths"
        if min(lengths) < 0:
            raise BadRequest(f"{field} holds {min(lengths)}; lengths cannot be negative") from None
        raise BadRequest(
            f"{field} sum to {sum(lengths)} but {name} has {len(blob)} bytes"
        ) from None
