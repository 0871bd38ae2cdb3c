"""A ``ReplicateReply`` on the wire without copying its log bytes twice more.

A reply is mostly its ``data`` field (up to ``replication.MAX_REPLY_BYTES`` of
the master's log). Built as a ``pb.ReplicateReply`` and serialized, those bytes
are copied into the message and again into the serialized string; read by
protobuf, copied out of the received message and again on every access of
``reply.data``. Here:

- ``encode_reply`` (master): every other field serialized by protobuf, then
  the ``data`` field's key, length and bytes joined behind it in one copy.
  A protobuf message's fields may come in any order, so this is a valid
  ``ReplicateReply`` for any gRPC client (the ``.proto`` stays the contract);
  it equals ``SerializeToString()`` whenever ``data`` is empty, and a test
  checks that protobuf decodes every encoding to the same message.
- ``decode_reply`` (replica): the fields but ``data`` parsed by protobuf from
  the rest of the message (small: numbers, the metadata document), ``data``
  returned as a ``memoryview`` of the received message.

A reply that does not parse raises ``ReplyDecodeError``; inside a call, gRPC
reports it as an INTERNAL failure, and the follower reconnects.
"""

from __future__ import annotations

from equeue_broker.server.wire import varint
from equeue_proto.v1 import broker_pb2 as pb

_DATA = pb.ReplicateReply.DATA_FIELD_NUMBER
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_DATA_KEY = bytes([_DATA << 3 | _LENGTH])  # one byte: the field number is below 16


class ReplyDecodeError(ValueError):
    """Bytes that are not a ``ReplicateReply``."""


def encode_reply(head: pb.ReplicateReply, data: bytes | memoryview) -> bytes:
    """``head`` (whose own ``data`` must be empty) with ``data`` as its data field."""
    if not data:
        return head.SerializeToString()
    return b"".join((head.SerializeToString(), _DATA_KEY, varint(len(data)), data))


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    end = len(raw)
    while pos < end and shift < 70:
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise ReplyDecodeError(f"ReplicateReply: malformed varint before byte {pos}")


def decode_reply(raw: bytes) -> tuple[pb.ReplicateReply, memoryview]:
    """(the reply without its data, its data as a view of ``raw``)."""
    data = memoryview(b"")
    rest: list[bytes] = []
    pos = kept = 0
    size = len(raw)
    while pos < size:
        at = pos
        key, pos = _varint(raw, pos)
        wire_type = key & 7
        if wire_type == _VARINT:
            pos = _varint(raw, pos)[1]
        elif wire_type == _LENGTH:
            length, pos = _varint(raw, pos)
            if pos + length > size:
                raise ReplyDecodeError(f"ReplicateReply: field {key >> 3} runs past the end")
            if key >> 3 == _DATA:  # the last one wins, as in protobuf
                data = memoryview(raw)[pos : pos + length]
                rest.append(raw[kept:at])
                kept = pos + length
            pos += length
        elif wire_type == _FIXED64:
            pos += 8
        elif wire_type == _FIXED32:
            pos += 4
        else:
            raise ReplyDecodeError(f"ReplicateReply: field {key >> 3} has wire type {wire_type}")
    if pos != size:
        raise ReplyDecodeError("ReplicateReply: truncated field at the end")
    rest.append(raw[kept:])
    try:
        head = pb.ReplicateReply.FromString(b"".join(rest))
    except Exception as exc:  # protobuf's DecodeError
        raise ReplyDecodeError(f"ReplicateReply: {exc}") from None
    return head, data
