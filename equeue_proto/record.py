"""The record format: one message as the broker stores it and as pull replies carry it.

A pull reply carries records exactly as they lie in the broker's message log,
so this format is part of the wire contract: the broker's storage encodes it
(``equeue_broker.storage.log.record``), the client decodes it
(``equeue_spark.client.records`` and ``columns``). This module is the one place
that specifies it; the C accelerator (``_codec.c``) implements the same layout
and exports its constants, which ``accel.py`` checks against these at import.

Grammar (all integers little-endian)::

    frame := body_length u32 | body | crc u32 | body_length u32

    body  := version       u8    RECORD_VERSION
             flags         u8    bit 0 HAS_KEY (a zero-length key is not "no key"),
                                 bit 1 BATCH_END (last record of an atomic append),
                                 bit 2 TXN (staged by a transaction, see below),
                                 bit 3 CONTROL (a transaction's commit or abort
                                 record: never served to clients),
                                 bit 4 DELAYED (with TXN: a delayed record,
                                 see below)
             queue_id      u16
             queue_offset  u64
             position      u64   global log position of this frame's first byte
             producer_ms   i64   producer timestamp
             store_ms      i64   broker timestamp at append
             topic_length  u16
             tag_length    u8
             reserved      u8    0
             key_length    u32
             headers_length u32  bytes of the headers section
             value_length  u32
             topic | tag | key | headers | value      (the bytes, in this order)

    headers := count u16, then count times: key_length u16 | key (UTF-8) |
                                            value_length u32 | value

``crc`` is the CRC32C of ``body``. The length suffix repeats the prefix so a
torn or overwritten record is detected from either end. A frame is
``body_length + FRAME_OVERHEAD - FIXED_BODY_SIZE`` (= body + 12) bytes.

The broker writes an append's records with BATCH_END on the last one only;
its recovery discards trailing records after the last BATCH_END, so an append
is all-or-nothing across a crash.

Transactions (broker/equeue_broker/storage/txn/transactions.py): a staged record is written to
the log once, when it is staged, with TXN set; in the log its ``queue_offset``
holds its transaction's serial (offsets are only known at commit) and its
``store_ms`` the staging time. A pull reply carries every TXN record with its
committed ``queue_offset`` and the commit's ``store_ms`` (from its index
entry), and a ``crc`` adjusted for those two changes, never recomputed
(CRC-32C is affine: ``crc(M xor D) = crc(M) xor crc(D) xor crc(0...)`` for
equal lengths), so a record damaged in the log still fails a client's check.
Clients need not know the TXN bit. CONTROL records (topic "") never leave the
broker; their value is specified in broker/equeue_broker/storage/txn/txn_records.py.

Delayed records (broker/equeue_broker/storage/timer/): written once, flagged
TXN | DELAYED, with their due time (ms since the epoch) as ``queue_offset`` in
the log; a "deliver" control record later gives them offsets, exactly as a
commit does for staged records, so a pull reply restamps them like any TXN
record (offset and store time from the index entry) and clients need not know
the DELAYED bit either.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from crc32c import crc32c

RECORD_VERSION = 1
FLAG_HAS_KEY = 1
FLAG_BATCH_END = 2
FLAG_TXN = 4
FLAG_CONTROL = 8
FLAG_DELAYED = 16

_PREFIX = "<I"
"""body_length."""
_FIELDS = (
    ("version", "B"), ("flags", "B"), ("queue_id", "H"), ("queue_offset", "Q"),
    ("position", "Q"), ("producer_ms", "q"), ("store_ms", "q"), ("topic_len", "H"),
    ("tag_len", "B"), ("reserved", "x"), ("key_len", "I"), ("headers_len", "I"),
    ("value_len", "I"),
)  # fmt: skip
"""The fixed body fields in order, with their struct codes (the grammar above)."""

HEADER = struct.Struct(_PREFIX + "".join(code for _, code in _FIELDS))
"""Length prefix plus the fixed part of the body (``reserved`` is skipped)."""
TRAILER = struct.Struct("<II")
"""crc u32 | body_length u32."""


def _field_offsets() -> dict[str, int]:
    """Each fixed field's byte offset from the frame's first byte, from the struct codes."""
    offsets = {}
    fmt = _PREFIX
    for name, code in _FIELDS:
        offsets[name] = struct.calcsize(fmt)
        fmt += code
    return offsets


_AT = _field_offsets()
AT_BODY = struct.calcsize(_PREFIX)
"""The checksummed body starts after the length prefix."""
AT_FLAGS = _AT["flags"]
AT_QUEUE_OFFSET = _AT["queue_offset"]
AT_POSITION = _AT["position"]
AT_STORE_MS = _AT["store_ms"]
AT_TOPIC_LEN = _AT["topic_len"]
AT_TAG_LEN = _AT["tag_len"]

FIXED_BODY_SIZE = HEADER.size - AT_BODY
MIN_BODY_SIZE = FIXED_BODY_SIZE
FRAME_OVERHEAD = HEADER.size + TRAILER.size
"""Bytes a frame adds to its variable-length fields."""
BODY_TO_FRAME = AT_BODY + TRAILER.size
"""A frame's size is its body length plus this (prefix and trailer)."""

LAYOUT = {
    "HEADER_SIZE": HEADER.size,
    "TRAILER_SIZE": TRAILER.size,
    "RECORD_VERSION": RECORD_VERSION,
    "FLAG_HAS_KEY": FLAG_HAS_KEY,
    "FLAG_BATCH_END": FLAG_BATCH_END,
    "FLAG_TXN": FLAG_TXN,
    "FLAG_CONTROL": FLAG_CONTROL,
    "FLAG_DELAYED": FLAG_DELAYED,
    "AT_BODY": AT_BODY,
    **{f"AT_{name.upper()}": at for name, at in _AT.items()},
}
"""The record layout as the C accelerator names it (its ``LAYOUT`` must agree)."""

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER_COUNT = struct.Struct("<H")
_HEADER_KEY_LEN = struct.Struct("<H")
_HEADER_VALUE_LEN = struct.Struct("<I")

Buffer = bytes | bytearray | memoryview | mmap.mmap
Headers = Sequence[tuple[str, bytes]]


class RecordError(ValueError):
    """A frame failed validation; ``position`` is its offset in the buffer."""

    def __init__(self, reason: str, position: int) -> None:
        super().__init__(f"invalid record at byte {position}: {reason}")
        self.reason = reason
        self.position = position


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One message as read back from the log."""

    topic: str
    queue_id: int
    queue_offset: int
    position: int
    key: bytes | None
    tag: str
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    producer_timestamp_ms: int
    store_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class RecordMeta:
    """The fixed fields of a record, read without copying its payload."""

    flags: int
    queue_id: int
    queue_offset: int
    position: int
    store_timestamp_ms: int
    topic: bytes
    tag: bytes
    frame_size: int


def encode_headers(headers: Headers) -> bytes:
    """The headers section of a record (the grammar's ``headers``)."""
    parts = [_HEADER_COUNT.pack(len(headers))]
    for key, value in headers:
        raw_key = key.encode()
        parts += (_HEADER_KEY_LEN.pack(len(raw_key)), raw_key, _HEADER_VALUE_LEN.pack(len(value)))
        parts.append(bytes(value))
    return b"".join(parts)


def decode_headers(data: bytes) -> tuple[tuple[str, bytes], ...]:
    """The headers section of a record; ``ValueError`` (or ``struct.error``,
    ``UnicodeDecodeError``) if it is cut short, too long, or not UTF-8."""
    if not data:
        return ()
    (count,) = _HEADER_COUNT.unpack_from(data)
    pos = _HEADER_COUNT.size
    out = []
    for _ in range(count):
        (key_len,) = _HEADER_KEY_LEN.unpack_from(data, pos)
        pos += _HEADER_KEY_LEN.size
        key = data[pos : pos + key_len].decode()
        pos += key_len
        (value_len,) = _HEADER_VALUE_LEN.unpack_from(data, pos)
        pos += _HEADER_VALUE_LEN.size
        if pos + value_len > len(data):
            raise ValueError(f"header {key!r} declares {value_len} bytes; {len(data) - pos} left")
        out.append((key, data[pos : pos + value_len]))
        pos += value_len
    if pos != len(data):
        raise ValueError(f"{len(data) - pos} bytes after the last header")
    return tuple(out)


def body_length(buf: Buffer, pos: int) -> int:
    """The body length of the frame at ``pos`` (its length prefix)."""
    return int(_U32.unpack_from(buf, pos)[0])


def check_frame(buf: Buffer, pos: int, end: int) -> int | str:
    """Validate the frame at ``pos`` (data ends at ``end``).

    Returns the frame size, or a string saying why the frame is invalid (the
    broker's recovery stops at the first invalid frame).
    """
    if pos + HEADER.size > end:
        return "frame header runs past the end of the data"
    body = body_length(buf, pos)
    if body == 0:
        return "zero length (end of written data)"
    if body < MIN_BODY_SIZE or pos + body + BODY_TO_FRAME > end:
        return f"bad length {body}"
    crc: int
    suffix: int
    crc, suffix = TRAILER.unpack_from(buf, pos + AT_BODY + body)
    if suffix != body:
        return f"length suffix {suffix} does not match prefix {body}"
    if crc != crc32c(memoryview(buf)[pos + AT_BODY : pos + AT_BODY + body]):
        return "checksum mismatch"
    return body + BODY_TO_FRAME


def check_frames_py(buf: Buffer, start: int, end: int, position: int = -1) -> int:
    """-1 if the frames of ``buf[start:end]`` are valid and tile it exactly,
    else the offset of the first invalid one (the reference for
    ``_codec.check_frames``). With ``position`` >= 0 (the log position of
    ``buf[start]``) a frame must also name its own position."""
    pos = start
    while pos < end:
        verdict = check_frame(buf, pos, end)
        if isinstance(verdict, str):
            return pos
        if position >= 0 and _U64.unpack_from(buf, pos + AT_POSITION)[0] != position + pos - start:
            return pos
        pos += verdict
    return -1


def read_meta(buf: Buffer, pos: int) -> RecordMeta:
    """The fixed fields of the (already validated) frame at ``pos``."""
    (body, _v, flags, queue_id, offset, position, _p, store_ms, topic_len, tag_len, *_r) = (
        HEADER.unpack_from(buf, pos)
    )
    p = pos + HEADER.size
    topic = bytes(buf[p : p + topic_len])
    tag = bytes(buf[p + topic_len : p + topic_len + tag_len])
    return RecordMeta(flags, queue_id, offset, position, store_ms, topic, tag, body + BODY_TO_FRAME)


def decode_record(buf: Buffer, pos: int) -> StoredMessage:
    """Decode and verify the frame at ``pos``; ``RecordError`` if it is invalid."""
    verdict = check_frame(buf, pos, len(buf))
    if isinstance(verdict, str):
        raise RecordError(verdict, pos)
    (
        _body, version, flags, queue_id, offset, position, producer_ms, store_ms,
        topic_len, tag_len, key_len, header_len, value_len,
    ) = HEADER.unpack_from(buf, pos)  # fmt: skip
    if version != RECORD_VERSION:
        raise RecordError(f"unsupported record version {version}", pos)
    p = pos + HEADER.size
    topic = bytes(buf[p : p + topic_len]).decode()
    p += topic_len
    tag = bytes(buf[p : p + tag_len]).decode()
    p += tag_len
    key = bytes(buf[p : p + key_len]) if flags & FLAG_HAS_KEY else None
    p += key_len
    try:
        headers = decode_headers(bytes(buf[p : p + header_len]))
    except (ValueError, struct.error) as exc:
        raise RecordError(f"bad headers: {exc}", pos) from None
    p += header_len
    value = bytes(buf[p : p + value_len])
    return StoredMessage(
        topic, queue_id, offset, position, key, tag, value, headers, producer_ms, store_ms
    )
