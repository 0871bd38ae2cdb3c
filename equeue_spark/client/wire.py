"""PullReply decoded without copying its records.

A pull reply is mostly its ``records`` field. Decoded by protobuf, that field
is copied out of the received message into a new ``bytes``; decoded here, it
is a ``memoryview`` of the received message, and the decoders
(``records.decode_records``, ``columns.decode_columns``) read it in place.
``Connection.pull``/``Connection.pull_stream`` use this decoder; the reply is
still the ``PullReply`` of the ``.proto`` on the wire (any gRPC client can read
it with the generated code), and a test checks this decoder against protobuf's.

Unknown fields are skipped, as protobuf does, so a newer broker's replies
still decode. Bytes that do not parse raise ``DataLossError``; inside a call,
gRPC reports that as an INTERNAL failure ("Exception deserializing response").
"""

from __future__ import annotations

from typing import NamedTuple

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.errors import DataLossError

_STATUS = pb.PullReply.STATUS_FIELD_NUMBER
_RECORDS = pb.PullReply.RECORDS_FIELD_NUMBER
_COUNT = pb.PullReply.COUNT_FIELD_NUMBER
_NEXT = pb.PullReply.NEXT_OFFSET_FIELD_NUMBER
_EARLIEST = pb.PullReply.EARLIEST_OFFSET_FIELD_NUMBER
_END = pb.PullReply.END_OFFSET_FIELD_NUMBER
_BROKER_ID = pb.PullReply.BROKER_ID_FIELD_NUMBER
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_INT64_SIGN = 1 << 63
_UINT64 = 1 << 64


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


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    end = len(data)
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            break
    raise DataLossError(f"PullReply: malformed varint before byte {pos}")


def parse_pull_reply(data: bytes) -> PullReply:
    """Decode a serialized ``PullReply`` (what gRPC hands a response deserializer)."""
    status = count = next_offset = earliest = end = 0
    records = memoryview(b"")
    broker_id = ""
    pos, size = 0, len(data)
    while pos < size:
        key, pos = _varint(data, pos)
        field, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            value, pos = _varint(data, pos)
            if field == _STATUS:
                status = value - _UINT64 if value >= _INT64_SIGN else value
            elif field == _COUNT:
                count = value & 0xFFFFFFFF
            elif field in (_NEXT, _EARLIEST, _END):
                signed = value - _UINT64 if value >= _INT64_SIGN else value
                if field == _NEXT:
                    next_offset = signed
                elif field == _EARLIEST:
                    earliest = signed
                else:
                    end = signed
        elif wire_type == _LENGTH:
            length, pos = _varint(data, pos)
            if pos + length > size:
                raise DataLossError(f"PullReply: field {field} runs past the end ({size} bytes)")
            if field == _RECORDS:
                records = memoryview(data)[pos : pos + length]
            elif field == _BROKER_ID:
                broker_id = str(data[pos : pos + length], "utf-8")
            pos += length
        elif wire_type == _FIXED64:
            pos += 8
        elif wire_type == _FIXED32:
            pos += 4
        else:
            raise DataLossError(f"PullReply: field {field} has unsupported wire type {wire_type}")
    if pos != size:
        raise DataLossError(f"PullReply: truncated field at the end ({size} bytes)")
    return PullReply(status, records, count, next_offset, earliest, end, broker_id)
