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


def parse_pull_reply(data: bytes) -> PullReply:
    """Decode a serialized ``PullReply`` (what gRPC hands a response deserializer)."""
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
