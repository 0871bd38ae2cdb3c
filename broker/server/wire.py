"""PullReply wire bytes built by the broker itself, around records read from the log.

A pull reply is mostly one large ``bytes`` field: the records as stored. Built
as a ``pb.PullReply`` it would be copied three times on the way out (into the
message, into the serialized string, into gRPC's buffer). Instead the store
joins a prefix, the records and a suffix in the one copy it makes out of its
memory maps (``Store.read_records(frame=...)``), and the servicer returns those
bytes; ``handlers.rebuild`` lets such pre-encoded replies through gRPC's
serializer untouched.

The bytes are exactly what ``pb.PullReply(...).SerializeToString()`` gives (the
proto3 encoding: fields in number order, zero values omitted); a test holds
the two equal, so the ``.proto`` stays the contract. The field numbers below
must follow ``protos/equeue_proto/v1/broker.proto``.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.storage import Framer, ReadStatus, RecordsResult

_VARINT, _LENGTH = 0, 2
_STATUS, _RECORDS, _COUNT, _NEXT, _EARLIEST, _END, _BROKER_ID = 1, 2, 3, 4, 5, 6, 7
_UINT64 = (1 << 64) - 1


def varint(value: int) -> bytes:
    """Protobuf base-128 varint; negative int64 values take ten bytes (two's complement)."""
    value &= _UINT64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def _int_field(field: int, value: int) -> bytes:
    return _key(field, _VARINT) + varint(value) if value else b""


def pull_reply_framer(broker_id: str, status_numbers: Mapping[ReadStatus, int]) -> Framer:
    """A ``Framer`` turning a ``RecordsResult`` into PullReply wire bytes.

    ``status_numbers`` maps the store's read status to the PullStatus enum number.
    """
    encoded_id = broker_id.encode()
    id_field = (
        _key(_BROKER_ID, _LENGTH) + varint(len(encoded_id)) + encoded_id if encoded_id else b""
    )
    records_key = _key(_RECORDS, _LENGTH)

    def frame(result: RecordsResult) -> tuple[bytes, bytes]:
        prefix = _int_field(_STATUS, status_numbers[result.status])
        if result.nbytes:
            prefix += records_key + varint(result.nbytes)
        suffix = b"".join((
            _int_field(_COUNT, result.count),
            _int_field(_NEXT, result.next_offset),
            _int_field(_EARLIEST, result.earliest),
            _int_field(_END, result.end),
            id_field,
        ))  # fmt: skip
        return prefix, suffix

    return frame
