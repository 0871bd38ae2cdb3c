"""Stage files: the messages of one open transaction, waiting for commit or abort.

Each open transaction has one append-only file ``<data_dir>/txn/<name>.stage``,
``name`` being the first 32 hex digits of the SHA-256 of the transaction id
(ids may hold characters a file name should not). This module is the only
place that reads or writes the format (integers little-endian)::

    file    := header entry*
    header  := magic b"EQTX" | version u8 (2) | reserved u8 u8 u8
               | created_ms i64 | id_length u16 | id (ASCII)
    entry   := body_length u32 | crc u32 (CRC32C of body) | body
    body    := topic_length u16 | queue_id u32 | count u32 | topic (UTF-8)
               | count records in the record format of record.py

An entry holds one checked batch for one queue, already encoded as the log
will hold it except for the queue offsets, log positions and store time
(placeholders: 0, 0, staging time), so a commit only copies the records and
patches those fields (``record.rebase_records``, in C). Reading stops at the
first entry that is short or fails its checksum (a write torn by a crash);
``StageFile.open`` cuts it off.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from equeue_broker.storage.chunk import pwrite_all
from equeue_broker.storage.errors import CorruptionError
from equeue_broker.storage.queue_index import ENTRY_SIZE
from equeue_broker.storage.record import EncodedBatch, PreparedBatch, encode_records

MAGIC = b"EQTX"
VERSION = 2
SUFFIX = ".stage"
HEADER = struct.Struct("<4sB3xqH")
ENTRY = struct.Struct("<II")
BODY = struct.Struct("<HII")
MAX_ENTRY_BYTES = 1 << 31
"""An entry is one produce batch; the batch limits keep it far below this."""


def file_name(txn_id: str) -> str:
    return hashlib.sha256(txn_id.encode()).hexdigest()[:32] + SUFFIX


@dataclass(frozen=True)
class StagedBatch:
    """One entry: encoded records and the queue they are for."""

    topic: str
    queue_id: int
    records: EncodedBatch


def encode_entry(topic: str, queue_id: int, prepared: PreparedBatch, staged_ms: int) -> bytearray:
    """The bytes of one entry (length and checksum included), built in one buffer."""
    raw_topic = topic.encode()
    count = len(prepared.batch)
    start = ENTRY.size + BODY.size + len(raw_topic)
    entry = bytearray(start + prepared.total_bytes)
    BODY.pack_into(entry, ENTRY.size, len(raw_topic), queue_id, count)
    entry[ENTRY.size + BODY.size : start] = raw_topic
    with memoryview(entry) as view:
        written = encode_records(
            view[start:], position=0, topic=raw_topic, queue_id=queue_id, first_offset=0,
            store_ms=staged_ms, prepared=prepared, start=0, stop=count,
            index_out=bytearray(count * ENTRY_SIZE),
        )  # fmt: skip
        assert written == prepared.total_bytes
        ENTRY.pack_into(entry, 0, len(entry) - ENTRY.size, crc32c(view[ENTRY.size :]))
    return entry


def decode_body(body: memoryview) -> StagedBatch:
    """The batch of an entry's body (checksum already verified)."""
    topic_length, queue_id, count = BODY.unpack_from(body)
    start = BODY.size + topic_length
    topic = bytes(body[BODY.size : start]).decode()
    # The frames themselves are checked when they are copied into the log
    # (rebase_records), not here: a Python walk per record would double the
    # cost of reading a commit.
    return StagedBatch(topic, queue_id, EncodedBatch(body[start:], count))


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
            pwrite_all(fd, header, 0)
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
                counts.append((batch.topic, batch.queue_id, batch.records.count))
            if end < size:
                os.ftruncate(fd, end)
                stage.size = end
        except BaseException:
            os.close(fd)
            raise
        return stage, counts

    def append(self, entries: Sequence[bytes | bytearray]) -> None:
        """Append whole entries; on failure the file is cut back to its old size."""
        total = sum(map(len, entries))
        try:
            written = os.pwritev(self._fd, entries, self.size) if entries else 0
            if written < total:  # rare: finish the short write from where it stopped
                pwrite_all(self._fd, b"".join(entries)[written:], self.size + written)
        except OSError:
            try:
                os.ftruncate(self._fd, self.size)
            finally:
                raise
        self.size += total

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
