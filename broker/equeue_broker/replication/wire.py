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

Fields are found with the contract's one wire reader (``equeue_proto.wire``).
A reply that does not parse raises ``ReplyDecodeError``; inside a call, gRPC
reports it as an INTERNAL failure, and the follower reconnects.
"""

from __future__ import annotations

from equeue_proto import wire
from equeue_proto.v1 import broker_pb2 as pb

_DATA = pb.ReplicateReply.DATA_FIELD_NUMBER
_DATA_KEY = wire.key(_DATA, wire.LENGTH)


class ReplyDecodeError(ValueError):
    """Bytes that are not a ``ReplicateReply``."""


def encode_reply(head: pb.ReplicateReply, data: bytes | memoryview) -> bytes:
    """``head`` (whose own ``data`` must be empty) with ``data`` as its data field."""
    if not data:
        return head.SerializeToString()
    return b"".join((head.SerializeToString(), _DATA_KEY, wire.varint(len(data)), data))


def decode_reply(raw: bytes) -> tuple[pb.ReplicateReply, memoryview]:
    """(the reply without its data, its data as a view of ``raw``)."""
    data = memoryview(b"")
    rest: list[bytes] = []
    kept = 0
    try:
        for field in wire.fields(raw, "ReplicateReply"):
            if field.number == _DATA and field.wire_type == wire.LENGTH:
                data = memoryview(raw)[field.payload : field.end]  # the last one wins
                rest.append(raw[kept : field.start])
                kept = field.end
    except wire.WireError as exc:
        raise ReplyDecodeError(str(exc)) from None
    rest.append(raw[kept:])
    try:
        head = pb.ReplicateReply.FromString(b"".join(rest))
    except Exception as exc:  # protobuf's DecodeError
        raise ReplyDecodeError(f"ReplicateReply: {exc}") from None
    return head, data
