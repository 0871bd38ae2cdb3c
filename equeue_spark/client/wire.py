"""PullReply decoded without copying its records.

A pull reply is mostly its ``records`` field. Decoded by protobuf, that field
is copied out of the received message into a new ``bytes``; decoded here, it
is a ``memoryview`` of the received message, and the decoders
(``records.decode_records``, ``columns.decode_columns``) read it in place.
``Connection.pull``/``Connection.pull_stream`` use this decoder; the reply is
still the ``PullReply`` of the ``.proto`` on the wire (any gRPC client can read
it with the generated code), and a test checks this decoder against protobuf's.

Fields are read with the contract's one wire reader (``equeue_proto.wire``);
unknown fields are skipped, as protobuf does, so a newer broker's replies
still decode. Bytes that do not parse raise ``DataLossError``; inside a call,
gRPC reports that as an INTERNAL failure ("Exception deserializing response").
"""

from __future__ import annotations

from typing import NamedTuple

from equeue_proto import wire
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.errors import DataLossError

_STATUS = pb.PullReply.STATUS_FIELD_NUMBER
_RECORDS = pb.PullReply.RECORDS_FIELD_NUMBER
_COUNT = pb.PullReply.COUNT_FIELD_NUMBER
_NEXT = pb.PullReply.NEXT_OFFSET_FIELD_NUMBER
_EARLIEST = pb.PullReply.EARLIEST_OFFSET_FIELD_NUMBER
_END = pb.PullReply.END_OFFSET_FIELD_NUMBER
_BROKER_ID = pb.PullReply.BROKER_ID_FIELD_NUMBER
_SIGNED = {_STATUS, _NEXT, _EARLIEST, _END}
"""Fields read as int64 (status is an enum, signed in proto3)."""


class PullReply(NamedTuple):
    """The fields of ``pb.PullReply``, under the same names."""

    status: int
    """A ``pb.PullStatus`` number."""
    records: memoryview
    """The records (record.py's format), a view of the received message."""
    count: int  # type: ignore[assignment]  # shadows tuple.count(), as the proto field does
    next_offset: int
    earliest_offset: int
    end_offset: int
    broker_id: str


_VARINT_KEYS = {number << 3 | wire.VARINT: number for number in (_STATUS, _COUNT, *_SIGNED)}
_RECORDS_KEY = _RECORDS << 3 | wire.LENGTH
_BROKER_ID_KEY = _BROKER_ID << 3 | wire.LENGTH


def parse_pull_reply(data: bytes) -> PullReply:
    """Decode a serialized ``PullReply`` (what gRPC hands a response deserializer)."""
    known = _parse_known(data)
    return known if known is not None else _parse_fields(data)


def _parse_known(data: bytes) -> PullReply | None:
    """The fast path: a reply of only the known fields, each with its own wire
    type (what brokers send), read without a ``Field`` per field; None for
    anything else (an unknown field, bytes that do not parse), which
    ``_parse_fields`` then reads or refuses. Every field number here is
    below 16, so each key is one byte."""
    numbers = dict.fromkeys((_STATUS, _COUNT, _NEXT, _EARLIEST, _END), 0)
    records = memoryview(b"")
    broker_id = ""
    pos, size = 0, len(data)
    try:
        while pos < size:
            key = data[pos]
            value = data[pos + 1]
            pos += 2
            if value >= 0x80:
                value, pos = wire.read_varint(data, pos - 1, "PullReply")
            number = _VARINT_KEYS.get(key)
            if number is not None:
                numbers[number] = wire.int64(value) if number in _SIGNED else value & 0xFFFFFFFF
                continue
            end = pos + value
            if end > size or key not in (_RECORDS_KEY, _BROKER_ID_KEY):
                return None
            if key == _RECORDS_KEY:
                records = memoryview(data)[pos:end]
            else:
                broker_id = str(data[pos:end], "utf-8")
            pos = end
    except (IndexError, ValueError):  # WireError, bad UTF-8: the full reader says why
        return None
    return PullReply(
        numbers[_STATUS], records, numbers[_COUNT], numbers[_NEXT], numbers[_EARLIEST],
        numbers[_END], broker_id,
    )  # fmt: skip


def _parse_fields(data: bytes) -> PullReply:
    """Any ``PullReply``, field by field (unknown ones skipped)."""
    numbers = dict.fromkeys((_STATUS, _COUNT, _NEXT, _EARLIEST, _END), 0)
    records = memoryview(b"")
    broker_id = ""
    try:
        for field in wire.fields(data, "PullReply"):
            if field.wire_type == wire.VARINT and field.number in numbers:
                value = field.value
                if field.number in _SIGNED:
                    numbers[field.number] = wire.int64(value)
                else:  # count: uint32
                    numbers[field.number] = value & 0xFFFFFFFF
            elif field.wire_type == wire.LENGTH and field.number == _RECORDS:
                records = memoryview(data)[field.payload : field.end]
            elif field.wire_type == wire.LENGTH and field.number == _BROKER_ID:
                broker_id = str(data[field.payload : field.end], "utf-8")
    except wire.WireError as exc:
        raise DataLossError(str(exc)) from None
    return PullReply(
        numbers[_STATUS], records, numbers[_COUNT], numbers[_NEXT], numbers[_EARLIEST],
        numbers[_END], broker_id,
    )  # fmt: skip
