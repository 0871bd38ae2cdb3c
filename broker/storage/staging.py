"""Stage files: the messages of one open transaction, waiting for commit or abort.

Each open transaction has one append-only file ``<data_dir>/txn/<name>.stage``,
``name`` being the first 32 hex digits of the SHA-256 of the transaction id
(ids may hold characters a file name should not). This module is the only
place that reads or writes the format (integers little-endian)::

    file    := header entry*
    header  := magic b"EQTX" | version u8 (1) | reserved u8 u8 u8
               | created_ms i64 | id_length u16 | id (ASCII)
    entry   := body_length u32 | crc u32 (CRC32C of body) | body
    body    := topic_length u16 | queue_id u32 | count u32 | flags u8
               | total_bytes u64                the frames' size in the log
               | topic (UTF-8)
               | value_lengths u32[count]
               | key_lengths   i32[count]       if flags & HAS_KEYS (-1 = no key)
               | tag_lengths   u8[count]        if flags & HAS_TAGS
               | header_lengths u32[count]      if flags & HAS_HEADERS
               | timestamps_ms i64[count]       if flags & HAS_TIMESTAMPS
               | values | keys | tags | headers (each column's bytes, concatenated)

An entry holds one validated batch for one queue, with tags and headers already
in their record encoding (``PreparedBatch``), so a commit appends it to the log
without checking it again. Reading stops at the first entry that is short or
fails its checksum (a write torn by a crash); ``StageFile.open`` cuts it off.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from broker.storage.errors import CorruptionError
from broker.storage.record import MessageBatch, PreparedBatch

MAGIC = b"EQTX"
VERSION = 1
SUFFIX = ".stage"
HEADER = struct.Struct("<4sB3xqH")
ENTRY = struct.Struct("<II")
BODY = struct.Struct("<HIIBQ")
HAS_KEYS, HAS_TAGS, HAS_HEADERS, HAS_TIMESTAMPS = 1, 2, 4, 8
MAX_ENTRY_BYTES = 1 << 31
"""An entry is one produce batch; the batch limits keep it far below this."""

assert sys.byteorder == "little", "array('I') columns are written as little-endian"


def file_name(txn_id: str) -> str:
    return hashlib.sha256(txn_id.encode()).hexdigest()[:32] + SUFFIX


@dataclass(frozen=True)
class StagedBatch:
    """One entry: a prepared batch and the queue it is for."""

    topic: str
    queue_id: int
    prepared: PreparedBatch


def encode_entry(topic: str, queue_id: int, prepared: PreparedBatch) -> bytes:
    """The bytes of one entry (length and checksum included)."""
    batch = prepared.batch
    count = len(batch.values)
    flags = 0
    topic_bytes = topic.encode()
    parts: list[bytes | array[int]] = [b"", topic_bytes, array("I", map(len, batch.values))]
    blobs: list[bytes] = [b"".join(batch.values)]
    if batch.keys is not None:
        flags |= HAS_KEYS
        parts.append(array("i", (-1 if k is None else len(k) for k in batch.keys)))
        blobs.append(b"".join(k for k in batch.keys if k is not None))
    if prepared.tags is not None:
        flags |= HAS_TAGS
        parts.append(array("B", map(len, prepared.tags)))
        blobs.append(b"".join(prepared.tags))
    if prepared.headers is not None:
        flags |= HAS_HEADERS
        parts.append(array("I", map(len, prepared.headers)))
        blobs.append(b"".join(prepared.headers))
    if batch.timestamps_ms is not None:
        flags |= HAS_TIMESTAMPS
        parts.append(array("q", batch.timestamps_ms))
    parts[0] = BODY.pack(len(topic_bytes), queue_id, count, flags, prepared.total_bytes)
    body = b"".join([*parts, *blobs])
    return ENTRY.pack(len(body), crc32c(body)) + body


def decode_body(body: memoryview) -> StagedBatch:
    """The batch of an entry's body (checksum already verified)."""
    topic_length, queue_id, count, flags, total = BODY.unpack_from(body)
    pos = BODY.size
    topic = bytes(body[pos : pos + topic_length]).decode()
    pos += topic_length

    def column(code: str, width: int) -> array[int]:
        nonlocal pos
        out = array(code)
        out.frombytes(body[pos : pos + count * width])
        pos += count * width
        return out

    value_lengths = column("I", 4)
    key_lengths = column("i", 4) if flags & HAS_KEYS else None
    tag_lengths = column("B", 1) if flags & HAS_TAGS else None
    header_lengths = column("I", 4) if flags & HAS_HEADERS else None
    stamps = column("q", 8).tolist() if flags & HAS_TIMESTAMPS else None

    def split(lengths: Sequence[int]) -> list[memoryview]:
        nonlocal pos
        ends = list(itertools.accumulate(lengths, initial=pos))
        pos = ends[-1]
        return [body[a:b] for a, b in itertools.pairwise(ends)]

    values = split(value_lengths)
    keys: list[memoryview | None] | None = None
    if key_lengths is not None:
        present = iter(split([n for n in key_lengths if n >= 0]))
        keys = [None if n < 0 else next(present) for n in key_lengths]
    tags = [bytes(t) for t in split(tag_lengths)] if tag_lengths is not None else None
    headers = [bytes(h) for h in split(header_lengths)] if header_lengths is not None else None
    if pos != len(body):
        raise ValueError(f"entry body has {len(body) - pos} bytes after its columns")
    batch = MessageBatch(values, keys, timestamps_ms=stamps)  # type: ignore[arg-type]
    return StagedBatch(topic, queue_id, PreparedBatch(batch, tags, headers, total))


def encode_header(txn_id: str, created_ms: int) -> bytes:
    raw = txn_id.encode()
    return HEADER.pack(MAGIC, VERSION, created_ms, len(raw)) + raw


class StageFile:
    """An open transaction's file: appended to while staging, read at commit."""

    def __init__(self, path: Path, txn_id: str, created_ms: int, fd: int, size: int) -> None:
        self.path = path
        self.txn_id = txn_id
        self.created_ms = created_ms
        self._fd = fd
        self.size = size

    @classmethod
    def create(cls, directory: Path, txn_id: str, created_ms: int) -> StageFile:
        path = directory / file_name(txn_id)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        header = encode_header(txn_id, created_ms)
        try:
            _write_all(fd, header)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return cls(path, txn_id, created_ms, fd, len(header))

    @classmethod
    def open(cls, path: Path) -> tuple[StageFile, list[tuple[str, int, int]]]:
        """Open an existing file after a restart, cutting off a torn last entry.

        Returns the file and, per entry, (topic, queue_id, message count).
        """
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            txn_id, created_ms, start = _parse_header(os.pread(fd, HEADER.size + 65_535, 0), path)
            stage = cls(path, txn_id, created_ms, fd, size)
            counts = []
            end = start
            for entry_end, batch in stage._entries(start, strict=False):
                end = entry_end
                counts.append((batch.topic, batch.queue_id, len(batch.prepared.batch)))
            if end < size:
                os.ftruncate(fd, end)
                stage.size = end
        except BaseException:
            os.close(fd)
            raise
        return stage, counts

    def append(self, entries: Sequence[bytes]) -> None:
        """Append whole entries; on failure the file is cut back to its old size."""
        data = b"".join(entries)
        try:
            _write_all(self._fd, data, self.size)
        except OSError:
            try:
                os.ftruncate(self._fd, self.size)
            finally:
                raise
        self.size += len(data)

    def batches(self) -> Iterator[StagedBatch]:
        """Every staged batch, in staging order, read one entry at a time."""
        start = HEADER.size + len(self.txn_id)
        for _, batch in self._entries(start, strict=True):
            yield batch

    def _entries(self, pos: int, strict: bool) -> Iterator[tuple[int, StagedBatch]]:
        """(end of entry, batch) from ``pos``. A short or damaged entry raises
        ``CorruptionError`` when ``strict``, else ends the iteration."""
        while pos < self.size:
            head = os.pread(self._fd, ENTRY.size, pos)
            length, crc = ENTRY.unpack(head) if len(head) == ENTRY.size else (0, 0)
            body = memoryview(os.pread(self._fd, min(length, MAX_ENTRY_BYTES), pos + ENTRY.size))
            try:
                if len(head) != ENTRY.size or len(body) != length or crc32c(body) != crc:
                    raise ValueError("short entry or bad checksum")
                batch = decode_body(body)
            except (ValueError, UnicodeDecodeError, struct.error) as exc:
                if strict:
                    raise CorruptionError(
                        f"bad stage file entry: {exc}", str(self.path), pos
                    ) from None
                return
            pos += ENTRY.size + length
            yield pos, batch

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def _parse_header(data: bytes, path: Path) -> tuple[str, int, int]:
    """(id, created_ms, end of header) of a stage file that begins with ``data``."""
    if len(data) < HEADER.size:
        raise CorruptionError("stage file shorter than its header", str(path), 0)
    magic, version, created_ms, id_length = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise CorruptionError(f"not a version {VERSION} stage file", str(path), 0)
    end = HEADER.size + id_length
    try:
        txn_id = data[HEADER.size : end].decode("ascii")
    except UnicodeDecodeError:
        raise CorruptionError("stage file id is not ASCII", str(path), HEADER.size) from None
    if len(txn_id) != id_length:
        raise CorruptionError("stage file header is cut short", str(path), HEADER.size)
    return txn_id, created_ms, end


def _write_all(fd: int, data: bytes, offset: int = 0) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
