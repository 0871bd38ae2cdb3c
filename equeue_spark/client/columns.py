"""A pull reply's records decoded into column buffers, for Arrow (and Spark).

``decode_columns`` turns the records of a pull reply (record.py's format) into
one buffer per column, laid out as Apache Arrow buffers, so a Spark task can
build a ``pyarrow.RecordBatch`` with ``pa.Array.from_buffers`` without creating
a Python object per record. Like ``records.decode_records`` it verifies every
record's checksum (``DataLossError`` naming the byte position if one fails).

This module imports neither pyspark nor pyarrow. The buffers, all
little-endian, and the Arrow arrays they make (n records, m headers in all)::

    topic         string      [None, topic_offsets, topics]
    queue_id      int32       [None, queue_ids]
    offset        int64       [None, offsets]
    timestamp     timestamp[us]  [None, timestamps_us]   producer time (store time if none)
    store time    timestamp[us]  [None, store_timestamps_us]  the broker's store time
    key           binary      [key_validity, key_offsets, keys]  null_count=key_nulls
    value         binary      [None, value_offsets, values]
    tag           string      [None, tag_offsets, tags]    "" when untagged
    message_id    string      [None, id_offsets, ids]      format_message_id()
    headers       list<struct<key: string, value: binary>>
                  list:   [None, header_list_offsets]
                  key:    [None, header_key_offsets, header_keys]     (m items)
                  value:  [None, header_value_offsets, header_values] (m items)

Offsets buffers hold n + 1 (or m + 1) int32s starting at 0. The header
buffers are all ``b""`` unless headers were asked for. The C accelerator
(``equeue_proto._codec``) does this in one call; without it, or with
``EQUEUE_PURE_PYTHON`` set, ``decode_columns_py`` makes the same bytes.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

from equeue_proto.accel import CODEC, IMPLEMENTATION
from equeue_proto.protocol import MESSAGE_ID_HEX_DIGITS, format_message_id
from equeue_proto.record import (
    FIXED_BODY_SIZE,
    FLAG_HAS_KEY,
    HEADER,
    RECORD_VERSION,
    Buffer,
    check_frame,
)
from equeue_spark.client.errors import DataLossError, LimitError


class RecordColumns(NamedTuple):
    """The columns of n records as Arrow buffers (see the module docstring)."""

    count: int  # type: ignore[assignment]  # shadows tuple.count(), deliberately
    """Number of records n."""
    topic_offsets: bytes
    topics: bytes
    queue_ids: bytes
    offsets: bytes
    """Queue offsets, int64."""
    timestamps_us: bytes
    """Producer timestamps in microseconds (Arrow ``timestamp[us]``, Spark's TimestampType)."""
    key_offsets: bytes
    keys: bytes
    key_validity: bytes | None
    """Validity bitmap (LSB first, bit set = key present); None when every record has a key."""
    key_nulls: int
    """Records without a key (their slot in ``keys`` is empty); a b"" key is not null."""
    value_offsets: bytes
    values: bytes
    tag_offsets: bytes
    tags: bytes
    id_offsets: bytes
    ids: bytes
    """Message ids, ``<broker_id>-<position as 16 hex digits>``."""
    header_list_offsets: bytes
    header_key_offsets: bytes
    header_keys: bytes
    header_value_offsets: bytes
    header_values: bytes
    store_timestamps_us: bytes
    """The broker's store times in microseconds (Kafka's LogAppendTime): what
    ``startingTimestamp``/``endingTimestamp`` and ``offset_for_timestamp`` compare."""


_decode_c: Callable[..., tuple[Any, ...]] | None = CODEC.decode_columns if CODEC else None
DECODER = IMPLEMENTATION
"""Which column decoder is in use: "c" (the _codec extension) or "python"."""

MAX_BLOB_BYTES = 2**31 - 1
"""Largest column blob: Arrow ``string``/``binary`` offsets are int32."""


def decode_columns(
    records: Buffer | Sequence[Buffer], broker_id: str, want_headers: bool
) -> RecordColumns:
    """The records of a pull reply as column buffers, checksums verified.

    ``records`` may be a list of buffers (several replies' records), decoded
    as their concatenation without joining them first.

    Raises ``DataLossError`` for a damaged record (the message names its byte
    position), and ``LimitError`` when a column would exceed 32-bit offsets or
    a producer timestamp does not fit in int64 microseconds (nothing is
    clamped). Either way no buffer is allocated before the whole reply is
    validated.
    """
    if isinstance(records, (list, tuple)):
        records = list(records) if _decode_c is not None else b"".join(records)
    if _decode_c is None:
        return decode_columns_py(cast("Buffer", records), broker_id, want_headers)
    try:
        return RecordColumns._make(_decode_c(records, broker_id, want_headers))
    except OverflowError as exc:
        raise LimitError(f"cannot decode records into columns: {exc}") from None
    except UnicodeEncodeError:  # broker_id itself (a lone surrogate): not the data's fault
        raise
    except ValueError as exc:
        raise DataLossError(f"received a damaged record: {exc}") from None


# -- pure-Python reference ---------------------------------------------------

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_MS_MAX = (2**63 - 1) // 1000
"""Largest producer timestamp (ms) whose microseconds fit in int64."""
_MALFORMED = "malformed headers section"


class _Record(NamedTuple):
    queue_id: int
    offset: int
    position: int
    timestamp_us: int
    store_us: int
    topic: bytes
    tag: bytes
    key: bytes | None
    headers: list[tuple[bytes, bytes]]
    value: bytes


def decode_columns_py(records: Buffer, broker_id: str, want_headers: bool) -> RecordColumns:
    """The pure-Python reference for ``decode_columns``: the same buffers and
    errors, at several microseconds per record (objects per record)."""
    broker = broker_id.encode()
    data = memoryview(records).cast("B")
    rows: list[_Record] = []
    pos = 0
    end = len(data)
    while pos < end:  # first pass: validate, as the C decoder's does
        size = check_frame(data, pos, end)
        if isinstance(size, str):
            raise _damaged(pos, size)
        rows.append(_scan_record(data, pos))
        pos += size
    n = len(rows)
    id_size = len(broker) + 1 + MESSAGE_ID_HEX_DIGITS
    blobs = [
        ("topics", sum(len(r.topic) for r in rows)),
        ("keys", sum(len(r.key) for r in rows if r.key is not None)),
        ("values", sum(len(r.value) for r in rows)),
        ("tags", sum(len(r.tag) for r in rows)),
        ("ids", id_size * n),
    ]
    if want_headers:
        blobs.append(("header keys", sum(len(k) for r in rows for k, _ in r.headers)))
        blobs.append(("header values", sum(len(v) for r in rows for _, v in r.headers)))
    for name, total in blobs:
        if total > MAX_BLOB_BYTES:
            raise _too_large(f"{name} total {total} bytes")
    headers = sum(len(r.headers) for r in rows)
    if want_headers and headers > MAX_BLOB_BYTES:  # the list offsets count headers
        raise _too_large(f"{headers} headers")

    queue_ids = array("i", (r.queue_id for r in rows))
    offsets = array("Q", (r.offset for r in rows))
    stamps = array("q", (r.timestamp_us for r in rows))
    store_stamps = array("q", (r.store_us for r in rows))
    validity = bytearray((n + 7) // 8)
    key_nulls = 0
    for i, r in enumerate(rows):
        if r.key is None:
            key_nulls += 1
        else:
            validity[i >> 3] |= 1 << (i & 7)
    ids = [format_message_id(broker_id, r.position).encode() for r in rows]
    if want_headers:
        header_list = [0]
        for r in rows:
            header_list.append(header_list[-1] + len(r.headers))
        pairs = [pair for r in rows for pair in r.headers]
        header_columns = (
            _le(array("i", header_list)),
            *_string_column([k for k, _ in pairs]),
            *_string_column([v for _, v in pairs]),
        )
    else:
        header_columns = (b"", b"", b"", b"", b"")
    return RecordColumns(
        n,
        *_string_column([r.topic for r in rows]),
        _le(queue_ids),
        _le(offsets),
        _le(stamps),
        *_string_column([r.key or b"" for r in rows]),
        bytes(validity) if key_nulls else None,
        key_nulls,
        *_string_column([r.value for r in rows]),
        *_string_column([r.tag for r in rows]),
        *_string_column(ids),
        *header_columns,
        _le(store_stamps),
    )


def _too_large(what: str) -> LimitError:
    return LimitError(
        f"cannot decode records into columns: records too large for 32-bit offsets: {what}"
    )


def _damaged(pos: int, why: str) -> DataLossError:
    return DataLossError(f"received a damaged record: record at byte {pos}: {why}")


def _scan_record(data: memoryview, pos: int) -> _Record:
    """The fields of the (framing-checked) record at ``pos``, validated in the
    C decoder's order: version, lengths, timestamp, topic, tag, headers."""
    (
        body, version, flags, queue_id, offset, position, producer_ms, store_ms,
        topic_len, tag_len, key_len, header_len, value_len,
    ) = HEADER.unpack_from(data, pos)  # fmt: skip
    if version != RECORD_VERSION:
        raise _damaged(pos, f"unsupported record version {version}")
    if FIXED_BODY_SIZE + topic_len + tag_len + key_len + header_len + value_len != body:
        raise _damaged(pos, "field lengths do not add up to the body length")
    if not -_MS_MAX <= producer_ms <= _MS_MAX:
        raise LimitError(
            f"cannot decode records into columns: record at byte {pos}: "
            f"producer timestamp {producer_ms} ms is out of range for microseconds"
        )
    if not -_MS_MAX <= store_ms <= _MS_MAX:
        raise LimitError(
            f"cannot decode records into columns: record at byte {pos}: "
            f"store timestamp {store_ms} ms is out of range for microseconds"
        )
    p = pos + HEADER.size
    topic = bytes(data[p : p + topic_len])
    if not _is_utf8(topic):
        raise _damaged(pos, "topic is not valid UTF-8")
    p += topic_len
    tag = bytes(data[p : p + tag_len])
    if not _is_utf8(tag):
        raise _damaged(pos, "tag is not valid UTF-8")
    p += tag_len
    key = bytes(data[p : p + key_len]) if flags & FLAG_HAS_KEY else None
    p += key_len
    headers = _scan_headers(data[p : p + header_len])
    if isinstance(headers, str):
        raise _damaged(pos, headers)
    p += header_len
    value = bytes(data[p : p + value_len])
    return _Record(
        queue_id, offset, position, producer_ms * 1000, store_ms * 1000, topic, tag, key, headers,
        value,
    )  # fmt: skip


def _scan_headers(raw: memoryview) -> list[tuple[bytes, bytes]] | str:
    """(key, value) pairs of a headers section, or why it is malformed; unlike
    record.decode_headers, every length is checked and nothing may follow."""
    size = len(raw)
    if size == 0:
        return []
    if size < 2:
        return _MALFORMED
    (count,) = _U16.unpack_from(raw)
    at = 2
    out = []
    for _ in range(count):
        if at + 2 > size:
            return _MALFORMED
        (key_len,) = _U16.unpack_from(raw, at)
        at += 2
        if at + key_len + 4 > size:
            return _MALFORMED
        key = bytes(raw[at : at + key_len])
        if not _is_utf8(key):
            return "header key is not valid UTF-8"
        at += key_len
        (value_len,) = _U32.unpack_from(raw, at)
        at += 4
        if at + value_len > size:
            return _MALFORMED
        out.append((key, bytes(raw[at : at + value_len])))
        at += value_len
    return out if at == size else _MALFORMED


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def _string_column(items: list[bytes]) -> tuple[bytes, bytes]:
    """(offsets, data) of an Arrow string/binary column."""
    ends = array("i", [0])
    at = 0
    for item in items:
        at += len(item)
        ends.append(at)
    return _le(ends), b"".join(items)


def _le(values: array[int]) -> bytes:
    if sys.byteorder != "little":
        values.byteswap()
    return values.tobytes()
