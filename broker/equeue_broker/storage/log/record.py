"""Encoding message records into the log (the storage side of the record format).

The format itself (grammar, constants, frame checks, decoding) is part of the
wire contract and lives in ``equeue_proto.record``; this module validates
batches against the broker's limits, encodes them (in C when built, see
``equeue_proto.accel``) with their index entries, and gives a transaction's
records their committed offsets in read replies (``patch_committed``).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from crc32c import crc32c

from equeue_broker.storage.config import MessageLimits
from equeue_broker.storage.errors import InvalidArgument, LimitExceeded
from equeue_broker.storage.index.queue_index import ENTRY, ENTRY_SIZE, pack_entry_into
from equeue_proto.accel import CODEC
from equeue_proto.record import (
    AT_BODY,
    AT_FLAGS,
    AT_QUEUE_OFFSET,
    AT_STORE_MS,
    BODY_TO_FRAME,
    FIXED_BODY_SIZE,
    FLAG_BATCH_END,
    FLAG_CONTROL,
    FLAG_DELAYED,
    FLAG_HAS_KEY,
    FLAG_TXN,
    FRAME_OVERHEAD,
    HEADER,
    RECORD_VERSION,
    TRAILER,
    Buffer,
    Headers,
    body_length,
    encode_headers,
)

_encode_c: Callable[..., int] | None = CODEC.encode_records if CODEC else None
_patch_c: Callable[..., bytearray | None] | None = CODEC.patch_committed if CODEC else None
_restamp_c: Callable[..., None] | None = CODEC.restamp_entries if CODEC else None
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U16 = struct.Struct("<H")
_I64 = struct.Struct("<q")
_ENTRY_AT_STORE_MS = struct.calcsize("<QII")
"""Byte offset of an index entry's store time (queue_index.py)."""


@dataclass(frozen=True, slots=True)
class MessageBatch:
    """Messages to append to one queue, column by column.

    Columns other than ``values`` are optional; when given they must have one
    item per value. Column form lets the encoder walk plain sequences without
    creating a Python object per message.
    """

    values: Sequence[bytes]
    keys: Sequence[bytes | None] | None = None
    tags: Sequence[str] | None = None
    """Per-message tag; "" means untagged."""
    headers: Sequence[Headers] | None = None
    timestamps_ms: Sequence[int] | None = None
    """Producer timestamps; default: the broker's store time (also for an
    item < 0, e.g. ``BROKER_TIME``: a message that came without one)."""

    def __len__(self) -> int:
        return len(self.values)


# -- batch preparation ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """A validated batch with the optional columns normalised for the encoder."""

    batch: MessageBatch
    tags: Sequence[bytes] | None
    headers: Sequence[bytes] | None
    total_bytes: int
    """Sum of the frame sizes of every record."""


def prepare_batch(batch: MessageBatch, topic: bytes, limits: MessageLimits) -> PreparedBatch:
    """Validate ``batch`` against ``limits``; raise before anything is written.

    Sizes and types are measured in one pass, in C when the accelerator is
    built; tags and headers (optional columns) are encoded to bytes here.
    """
    count = len(batch.values)
    if count == 0:
        raise InvalidArgument("a batch must hold at least one message")
    if count > limits.max_batch_messages:
        raise LimitExceeded(
            f"batch of {count} messages exceeds max_batch_messages={limits.max_batch_messages}"
        )
    for name in ("keys", "tags", "headers", "timestamps_ms"):
        column = getattr(batch, name)
        if column is not None and len(column) != count:
            raise InvalidArgument(f"batch column {name} has {len(column)} items, values {count}")
    tags = _prepare_tags(batch.tags, limits) if batch.tags is not None else None
    headers = _prepare_headers(batch.headers, limits) if batch.headers is not None else None
    fixed = FRAME_OVERHEAD + len(topic)
    try:
        total, max_frame, max_key, _ = _measure(batch.values, batch.keys, tags, headers, fixed)
    except TypeError as exc:
        raise InvalidArgument(f"bad message batch: {exc}") from None
    if max_key > limits.max_key_bytes:
        raise LimitExceeded(
            f"a key of {max_key} bytes exceeds max_key_bytes={limits.max_key_bytes}"
        )
    payload = total - count * fixed
    if payload > limits.max_batch_bytes:
        raise LimitExceeded(
            f"batch of {payload} bytes exceeds max_batch_bytes={limits.max_batch_bytes}"
        )
    if max_frame > limits.max_message_bytes:
        index = next(i for i, size in enumerate(frame_sizes(batch, tags, headers, fixed))
                     if size == max_frame)  # fmt: skip
        raise LimitExceeded(
            f"message {index} encodes to {max_frame} bytes; "
            f"max_message_bytes={limits.max_message_bytes}"
        )
    return PreparedBatch(batch, tags, headers, total)


def _measure_py(
    values: Sequence[bytes],
    keys: Sequence[bytes | None] | None,
    tags: Sequence[bytes] | None,
    headers: Sequence[bytes] | None,
    fixed: int,
) -> tuple[int, int, int, int]:
    """(total frame bytes, largest frame, largest key, largest value); TypeError
    for items that are not bytes-like. Mirrors ``_codec.measure_batch``."""
    for i, value in enumerate(values):
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"value {i} must be bytes-like, got {type(value).__name__}")
    for i, key in enumerate(keys or ()):
        if not isinstance(key, bytes | bytearray | memoryview | None):
            raise TypeError(f"key {i} must be bytes-like, got {type(key).__name__}")
    batch = MessageBatch(values, keys)
    sizes = list(frame_sizes(batch, tags, headers, fixed))
    max_key = max((len(k) for k in keys or () if k is not None), default=0)
    return sum(sizes), max(sizes), max_key, max(map(len, values))


_measure: Callable[
    [Sequence[bytes], Sequence[bytes | None] | None, Sequence[bytes] | None,
     Sequence[bytes] | None, int],
    tuple[int, int, int, int],
] = CODEC.measure_batch if CODEC else _measure_py  # fmt: skip


def _prepare_tags(tags: Sequence[str], limits: MessageLimits) -> list[bytes]:
    out = []
    for tag in tags:
        if not isinstance(tag, str):
            raise InvalidArgument(f"tags must be strings, got {type(tag).__name__}")
        raw = tag.encode()
        if len(raw) > limits.max_tag_bytes:
            raise LimitExceeded(
                f"tag {tag[:40]!r} is {len(raw)} bytes; max_tag_bytes={limits.max_tag_bytes}"
            )
        out.append(raw)
    return out


def _prepare_headers(headers: Sequence[Headers], limits: MessageLimits) -> list[bytes]:
    out = []
    for message_headers in headers:
        if len(message_headers) > limits.max_headers:
            raise LimitExceeded(
                f"{len(message_headers)} headers on one message; max_headers={limits.max_headers}"
            )
        for key, value in message_headers:
            if not isinstance(key, str) or not isinstance(value, bytes | bytearray):
                raise InvalidArgument(f"header {key!r}: keys must be str and values bytes")
            if len(key.encode()) > limits.max_header_key_bytes:
                raise LimitExceeded(
                    f"header key {key[:40]!r} exceeds max_header_key_bytes="
                    f"{limits.max_header_key_bytes}"
                )
        out.append(encode_headers(message_headers) if message_headers else b"")
    return out


def frame_sizes(
    batch: MessageBatch, tags: Sequence[bytes] | None, headers: Sequence[bytes] | None, fixed: int
) -> Iterator[int]:
    """Frame size of every message (a Python loop: used only off the hot path)."""
    keys = batch.keys if batch.keys is not None else itertools.repeat(None)
    tag_it = tags if tags is not None else itertools.repeat(b"")
    header_it = headers if headers is not None else itertools.repeat(b"")
    for value, key, tag, header in zip(batch.values, keys, tag_it, header_it, strict=False):
        yield fixed + len(value) + (len(key) if key is not None else 0) + len(tag) + len(header)


# -- encoding ------------------------------------------------------------------


def encode_records(
    out: bytearray | memoryview,
    *,
    position: int,
    topic: bytes,
    queue_id: int,
    first_offset: int,
    store_ms: int,
    prepared: PreparedBatch,
    start: int,
    stop: int,
    index_out: bytearray | memoryview,
    flags: int = 0,
    offsets: Sequence[int] | None = None,
) -> int:
    """Encode messages ``[start, stop)`` into ``out`` (from byte 0) and their index
    entries into ``index_out``; return the number of bytes written to ``out``.

    ``position`` is the global log position of ``out[0]``. The last record gets
    the BATCH_END flag. ``flags`` are set on every record; with TXN (a
    transaction's staged records) every one gets ``first_offset`` (the
    transaction's serial) as its queue offset; ``offsets`` (delayed records:
    their due times), message ``i`` gets ``offsets[i]``.
    Uses the C accelerator when it is built (see ``equeue_proto.accel``), else
    the pure-Python reference encoder; both produce the same bytes.
    """
    if _encode_c is None:
        return encode_records_py(
            out, position=position, topic=topic, queue_id=queue_id,
            first_offset=first_offset, store_ms=store_ms, prepared=prepared,
            start=start, stop=stop, index_out=index_out, flags=flags, offsets=offsets,
        )  # fmt: skip
    batch = prepared.batch
    return _encode_c(
        out, position, topic, queue_id, first_offset, store_ms, batch.values, batch.keys,
        prepared.tags, prepared.headers, batch.timestamps_ms, start, stop, index_out,
        flags, 0 if flags & FLAG_TXN else 1, offsets,
    )  # fmt: skip


def encode_records_py(
    out: bytearray | memoryview,
    *,
    position: int,
    topic: bytes,
    queue_id: int,
    first_offset: int,
    store_ms: int,
    prepared: PreparedBatch,
    start: int,
    stop: int,
    index_out: bytearray | memoryview,
    flags: int = 0,
    offsets: Sequence[int] | None = None,
) -> int:
    """Encode messages ``[start, stop)`` into ``out`` (from byte 0) and their index
    entries into ``index_out``; return the number of bytes written to ``out``.

    The pure-Python reference encoder: it allocates nothing per message that
    outlives the loop, but costs about 1.5 us per message.
    """
    view = memoryview(out)
    topic_len = len(topic)
    fixed_body = FIXED_BODY_SIZE + topic_len
    pos = last = entry_pos = count = 0
    step, extra = (0 if flags & FLAG_TXN else 1), flags & (FLAG_TXN | FLAG_CONTROL | FLAG_DELAYED)
    for value, key, tag, headers, producer_ms in _columns(prepared, store_ms, start, stop):
        key_len = 0 if key is None else len(key)
        body = fixed_body + len(tag) + key_len + len(headers) + len(value)
        HEADER.pack_into(
            out, pos, body, RECORD_VERSION, extra | (0 if key is None else FLAG_HAS_KEY),
            queue_id, first_offset + count * step if offsets is None else offsets[start + count],
            position + pos, producer_ms, store_ms,
            topic_len, len(tag), key_len,
            len(headers), len(value),
        )  # fmt: skip
        end = _copy_fields(out, pos + HEADER.size, topic, tag, key, headers, value)
        TRAILER.pack_into(out, end, crc32c(view[pos + AT_BODY : end]), body)
        pack_entry_into(
            index_out, entry_pos, position + pos + 1, body + BODY_TO_FRAME,
            crc32c(tag) if tag else 0, store_ms,
        )  # fmt: skip
        last, pos = pos, end + TRAILER.size
        entry_pos += ENTRY_SIZE
        count += 1
    assert count == stop - start, "batch columns shorter than values"
    _set_batch_end(out, view, last)
    view.release()
    return pos


def _columns(
    prepared: PreparedBatch, store_ms: int, start: int, stop: int
) -> Iterator[tuple[bytes, bytes | None, bytes, bytes, int]]:
    """(value, key, tag, encoded headers, producer time) of messages ``[start,
    stop)``, with the defaults of the columns the batch leaves out."""
    batch = prepared.batch
    keys = batch.keys if batch.keys is not None else itertools.repeat(None)
    tags = prepared.tags if prepared.tags is not None else itertools.repeat(b"")
    headers = prepared.headers if prepared.headers is not None else itertools.repeat(b"")
    given = batch.timestamps_ms
    stamps = itertools.repeat(store_ms) if given is None else _or_store_time(given, store_ms)
    # Not strict: a short column ends the zip early, which the caller's count check reports.
    return zip(
        itertools.islice(batch.values, start, stop),
        itertools.islice(keys, start, stop),
        itertools.islice(tags, start, stop),
        itertools.islice(headers, start, stop),
        itertools.islice(stamps, start, stop),
        strict=False,
    )


def _or_store_time(stamps: Sequence[int], store_ms: int) -> Iterator[int]:
    """``stamps`` with each negative item (none given) replaced by ``store_ms``."""
    return (store_ms if stamp < 0 else stamp for stamp in stamps)


def _copy_fields(  # noqa: PLR0917 (the record's variable fields, in their order)
    out: bytearray | memoryview,
    pos: int,
    topic: bytes,
    tag: bytes,
    key: bytes | None,
    headers: bytes,
    value: bytes,
) -> int:
    """Copy a record's variable fields to ``out`` from ``pos``, in record
    order; return where they end (where the trailer goes)."""
    for field in (topic, tag, key, headers, value):
        if field:
            end = pos + len(field)
            out[pos:end] = field
            pos = end
    return pos


# -- committed transaction records in replies ---------------------------------


def patch_committed(src: Buffer, entries: Buffer, first_offset: int) -> bytearray | None:
    """``src``'s records as a reply carries them: each TXN record with its queue
    offset (``first_offset`` + its index) and its entry's store time, checksum
    adjusted (see ``equeue_proto.record``); None if ``src`` holds no TXN record.
    C when built, else ``patch_committed_py``."""
    if _patch_c is not None:
        return _patch_c(src, entries, first_offset)
    return patch_committed_py(src, entries, first_offset)


def patch_committed_py(src: Buffer, entries: Buffer, first_offset: int) -> bytearray | None:
    """The reference for ``_codec.patch_committed``."""
    frames = []
    pos = 0
    view = memoryview(src)
    while pos < len(view):
        frame = body_length(view, pos) + BODY_TO_FRAME
        if frame < HEADER.size + TRAILER.size or pos + frame > len(view):
            raise ValueError(f"record at byte {pos} overruns the buffer")
        frames.append(pos)
        pos += frame
    if not any(view[at + AT_FLAGS] & FLAG_TXN for at in frames):
        return None
    out = bytearray(view)
    for i, at in enumerate(frames):
        if not out[at + AT_FLAGS] & FLAG_TXN:
            continue
        body = body_length(out, at)
        store_ms = _I64.unpack_from(entries, i * ENTRY_SIZE + _ENTRY_AT_STORE_MS)[0]
        before = bytes(out[at + AT_BODY : at + AT_BODY + body])
        _U64.pack_into(out, at + AT_QUEUE_OFFSET, first_offset + i)
        _I64.pack_into(out, at + AT_STORE_MS, store_ms)
        after = out[at + AT_BODY : at + AT_BODY + body]
        # crc(after) = crc(before) ^ crc(delta) ^ crc(zeros): an adjustment,
        # so damage elsewhere in the record still shows.
        delta = bytes(a ^ b for a, b in zip(before, after, strict=True))
        (crc,) = _U32.unpack_from(out, at + AT_BODY + body)
        crc ^= crc32c(delta) ^ crc32c(bytes(body))
        _U32.pack_into(out, at + AT_BODY + body, crc)
    return out


def restamp_entries(entries: bytearray, store_ms: int) -> None:
    """Set every entry's store time to ``store_ms`` and re-seal it (a commit
    stamps its records' entries with its own time). C when built."""
    if _restamp_c is not None:
        _restamp_c(entries, store_ms)
        return
    for at in range(0, len(entries) - ENTRY_SIZE + 1, ENTRY_SIZE):
        position_plus_one, size, tag_hash, _ = ENTRY.unpack_from(entries, at)
        pack_entry_into(entries, at, position_plus_one, size, tag_hash, store_ms)


def clear_batch_end(out: bytearray | memoryview, pos: int) -> None:
    """Take the BATCH_END flag off the record at ``pos`` and re-seal it: a
    record written in one atomic piece with the records after it (a
    producer record before its batch, producers/records.py)."""
    out[pos + AT_FLAGS] &= ~FLAG_BATCH_END & 0xFF
    body = body_length(out, pos)
    with memoryview(out) as view:
        crc = crc32c(view[pos + AT_BODY : pos + AT_BODY + body])
    _U32.pack_into(out, pos + AT_BODY + body, crc)


def _set_batch_end(out: bytearray | memoryview, view: memoryview, pos: int) -> None:
    out[pos + AT_FLAGS] |= FLAG_BATCH_END
    body = body_length(out, pos)
    _U32.pack_into(out, pos + AT_BODY + body, crc32c(view[pos + AT_BODY : pos + AT_BODY + body]))
