"""Protobuf's wire format, the part the data path reads and writes by hand.

The ``.proto`` is the contract; protobuf's generated code encodes and decodes
every message. Three places skip it where it would copy a large ``bytes``
field: the broker's pull and produce replies (``equeue_broker.server.wire``),
the replication reply (``equeue_broker.replication.wire``) and
the client's pull-reply decoder (``equeue_spark.client.wire``). They share this
one reader and writer, so a varint, a field key and an unknown field are
handled the same way everywhere.

The encoding (https://protobuf.dev/programming-guides/encoding/)::

    message := field*                  fields in any order; the last one wins
    field   := key payload
    key     := varint(number << 3 | wire_type)
    payload := varint                  wire type 0 (VARINT)
             | 8 bytes                 wire type 1 (FIXED64)
             | varint(n) n bytes       wire type 2 (LENGTH: bytes, strings, packed)
             | 4 bytes                 wire type 5 (FIXED32)
    varint  := base 128, low group first, high bit = more; at most 10 bytes.
               int64 values below zero take ten (two's complement in 64 bits).

Wire types 3 and 4 (groups) are not used by proto3 and are refused.
Bytes that do not parse raise ``WireError`` naming the message and the byte;
each side maps it to its own error (the client's ``DataLossError``, the
replica's ``ReplyDecodeError``). tests/contract/test_wire.py holds every
encoder and decoder to protobuf's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
"""The wire types proto3 uses."""

_UINT64 = (1 << 64) - 1
_INT64_SIGN = 1 << 63
_MAX_VARINT_BITS = 70
"""Ten groups of seven bits: anything longer is not a varint."""


class WireError(ValueError):
    """Bytes that are not the protobuf message they were read as."""


class Field(NamedTuple):
    """One field of a message as it lies in the bytes."""

    number: int
    wire_type: int
    value: int
    """A VARINT's value; a LENGTH field's length; 0 for the fixed types."""
    start: int
    """Where the field's key begins."""
    payload: int
    """Where its payload (a LENGTH field's bytes) begins."""
    end: int
    """Where the field ends."""


def varint(value: int) -> bytes:
    """Protobuf base-128 varint; negative int64 values take ten bytes (two's complement)."""
    value &= _UINT64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(number: int, wire_type: int) -> bytes:
    """A field's key."""
    return varint(number << 3 | wire_type)


def int_field(field_key: bytes, value: int) -> bytes:
    """A VARINT field; proto3 leaves zero out."""
    return field_key + varint(value) if value else b""


def bytes_field(field_key: bytes, value: bytes) -> bytes:
    """A LENGTH field; proto3 leaves an empty one out."""
    return field_key + varint(len(value)) + value if value else b""


def int64(value: int) -> int:
    """A decoded varint read as int64 (or a proto3 enum, which is signed)."""
    return value - (1 << 64) if value >= _INT64_SIGN else value


def read_varint(data: bytes | memoryview, pos: int, message: str) -> tuple[int, int]:
    """(the varint at ``pos``, the position after it)."""
    value = shift = 0
    end = len(data)
    while pos < end and shift < _MAX_VARINT_BITS:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise WireError(f"{message}: malformed varint before byte {pos}")


def fields(data: bytes | memoryview, message: str) -> Iterator[Field]:
    """Every field of a serialized message, in the order they lie; ``message``
    names it in errors. Stops with ``WireError`` at the first byte that does
    not parse (a LENGTH field past the end, a group, a varint too long)."""
    pos, size = 0, len(data)
    while pos < size:
        start = pos
        field_key, pos = read_varint(data, pos, message)
        number, wire_type = field_key >> 3, field_key & 7
        value = 0
        if wire_type == VARINT:
            value, pos = read_varint(data, pos, message)
            payload = start
        elif wire_type == LENGTH:
            value, payload = read_varint(data, pos, message)
            pos = payload + value
            if pos > size:
                raise WireError(f"{message}: field {number} runs past the end ({size} bytes)")
        elif wire_type in (FIXED64, FIXED32):
            payload = pos
            pos += 8 if wire_type == FIXED64 else 4
        else:
            raise WireError(f"{message}: field {number} has unsupported wire type {wire_type}")
        if pos > size:
            raise WireError(f"{message}: truncated field at the end ({size} bytes)")
        yield Field(number, wire_type, value, start, payload, pos)
