"""Chunk files: the fixed-capacity files that hold the message log and queue indexes.

On-disk format (all integers little-endian; this module is the only place that
reads or writes it)::

    chunk file := header(128) data(capacity) room(128)     (log chunk, active; room zero)
                | header(128) data(data_size) footer(128)  (log chunk, sealed)
                | header(128) data(capacity)               (index chunk)

    header := magic "EQCHUNK1"     8 bytes
              version      u16     FORMAT_VERSION
              chunk_type   u8      1 = message log, 2 = queue index
              reserved     u8      0
              chunk_number u64     equals the number in the file name
              capacity     u64     data bytes this chunk can hold
              created_ms   i64     wall-clock creation time
              unit_size    u32     index chunks: bytes per entry; log chunks: 0
              zero padding up to byte 124
              header_crc   u32     CRC32C of bytes [0, 124)

    footer := magic "EQFOOTR1"     8 bytes    (sealed log chunks only)
              data_size    u64     bytes of data actually used
              sealed_ms    i64     wall-clock time the chunk was sealed
              zero padding up to byte 124
              footer_crc   u32     CRC32C of bytes [0, 124)

An *active* log chunk is pre-sized to ``128 + capacity + 128`` bytes (a sparse
file), so that unused data reads as zeros and recovery can find the end of the
data; its last 128 bytes are the footer's room and stay zero. Sealing writes
the footer right after the data and truncates the file there, so a sealed chunk
is exactly ``128 + data_size + 128`` bytes. The two states share a size only
when the chunk is full, and then the footer's room tells them apart (zeros vs.
a valid footer). Index chunks are never sealed: always ``128 + capacity``.

Recovery finds where the written data of a chunk ends by reading only the parts
of the file that are not holes (``read_backwards``: ``SEEK_DATA``/``SEEK_HOLE``),
so its cost follows what was written, not the capacity. A file system without
hole reporting reports the whole file as data: still correct, only slower.

New chunks are created as ``<name>.tmp``, the header written and fsynced, then
renamed into place, so a crash never leaves a chunk without a header.
"""

from __future__ import annotations

import errno
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from equeue_broker.storage.errors import CorruptionError
from equeue_broker.storage.meta.atomic_file import fsync_dir

FORMAT_VERSION = 1
HEADER_SIZE = 128
FOOTER_SIZE = 128
CHUNK_TYPE_LOG = 1
CHUNK_TYPE_INDEX = 2

_HEADER = struct.Struct("<8sHBxQQqI")
_FOOTER = struct.Struct("<8sQq")
_CRC = struct.Struct("<I")
_CRC_AT = 124
_HEADER_MAGIC = b"EQCHUNK1"
_FOOTER_MAGIC = b"EQFOOTR1"


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    chunk_type: int
    chunk_number: int
    capacity: int
    created_ms: int
    unit_size: int = 0

    def encode(self) -> bytes:
        buf = bytearray(HEADER_SIZE)
        _HEADER.pack_into(
            buf,
            0,
            _HEADER_MAGIC,
            FORMAT_VERSION,
            self.chunk_type,
            self.chunk_number,
            self.capacity,
            self.created_ms,
            self.unit_size,
        )
        _CRC.pack_into(buf, _CRC_AT, crc32c(bytes(buf[:_CRC_AT])))
        return bytes(buf)

    @classmethod
    def decode(cls, data: bytes, path: str = "") -> ChunkHeader:
        if len(data) < HEADER_SIZE:
            raise CorruptionError(f"chunk header is {len(data)} bytes, expected 128", path, 0)
        magic, version, chunk_type, number, capacity, created, unit = _HEADER.unpack_from(data)
        if magic != _HEADER_MAGIC:
            raise CorruptionError(f"bad chunk header magic {magic!r}", path, 0)
        (stored_crc,) = _CRC.unpack_from(data, _CRC_AT)
        if stored_crc != crc32c(data[:_CRC_AT]):
            raise CorruptionError("chunk header checksum mismatch", path, 0)
        if version != FORMAT_VERSION:
            raise CorruptionError(f"unsupported chunk format version {version}", path, 8)
        return cls(chunk_type, number, capacity, created, unit)


@dataclass(frozen=True, slots=True)
class ChunkFooter:
    data_size: int
    sealed_ms: int

    def encode(self) -> bytes:
        buf = bytearray(FOOTER_SIZE)
        _FOOTER.pack_into(buf, 0, _FOOTER_MAGIC, self.data_size, self.sealed_ms)
        _CRC.pack_into(buf, _CRC_AT, crc32c(bytes(buf[:_CRC_AT])))
        return bytes(buf)

    @classmethod
    def decode(cls, data: bytes, path: str = "", position: int = 0) -> ChunkFooter:
        if len(data) < FOOTER_SIZE:
            raise CorruptionError("chunk footer truncated", path, position)
        magic, data_size, sealed_ms = _FOOTER.unpack_from(data)
        if magic != _FOOTER_MAGIC:
            raise CorruptionError(f"bad chunk footer magic {magic!r}", path, position)
        (stored_crc,) = _CRC.unpack_from(data, _CRC_AT)
        if stored_crc != crc32c(data[:_CRC_AT]):
            raise CorruptionError("chunk footer checksum mismatch", path, position)
        return cls(data_size, sealed_ms)


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """``os.pwrite`` all of ``data`` at ``offset`` (pwrite may write less than
    asked); the storage's one loop for writes in place (log, index, stage files)."""
    with memoryview(data) as view:
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], offset + done)


def chunk_file_name(chunk_number: int, suffix: str) -> str:
    """``000000042.chunk``: zero-padded so that names sort in chunk order."""
    return f"{chunk_number:09d}{suffix}"


def active_size(header: ChunkHeader) -> int:
    """File size of an unsealed chunk: header, data capacity and, for log chunks,
    the footer's room, which stays zero until sealing."""
    footer_room = FOOTER_SIZE if header.chunk_type == CHUNK_TYPE_LOG else 0
    return HEADER_SIZE + header.capacity + footer_room


def create_chunk_file(path: Path, header: ChunkHeader) -> None:
    """Create a chunk with ``header`` and zeroed data, crash-safely (temp + fsync + rename)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.pwrite(fd, header.encode(), 0)
        # Sparse: blocks are allocated as data is written; unwritten data reads as zeros.
        os.ftruncate(fd, active_size(header))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_header(fd: int, path: str) -> ChunkHeader:
    return ChunkHeader.decode(os.pread(fd, HEADER_SIZE, 0), path)


def seal_chunk_file(fd: int, data_size: int, sealed_ms: int | None = None) -> ChunkFooter:
    """Write the footer after ``data_size`` bytes of data, cut the file there, fsync."""
    footer = ChunkFooter(data_size, int(time.time() * 1000) if sealed_ms is None else sealed_ms)
    os.pwrite(fd, footer.encode(), HEADER_SIZE + data_size)
    os.ftruncate(fd, HEADER_SIZE + data_size + FOOTER_SIZE)
    os.fsync(fd)
    return footer


def read_sealed_footer(fd: int, path: str, header: ChunkHeader) -> ChunkFooter | None:
    """Return the footer of a sealed log chunk, or ``None`` if it is not sealed.

    An unsealed chunk is ``active_size`` bytes and its last 128 bytes (the
    footer's room, never written by records) are zero. A sealed chunk is
    ``header + data_size + footer`` bytes, which equals ``active_size`` only when
    the chunk is full, and then its last 128 bytes are a valid footer. Anything
    else is corrupt.
    """
    size = os.fstat(fd).st_size
    if size < HEADER_SIZE + FOOTER_SIZE:
        raise CorruptionError(f"chunk file is {size} bytes, too short for header and footer", path)
    tail = os.pread(fd, FOOTER_SIZE, size - FOOTER_SIZE)
    if size == active_size(header) and tail == bytes(FOOTER_SIZE):
        return None
    footer = ChunkFooter.decode(tail, path, size - FOOTER_SIZE)
    if HEADER_SIZE + footer.data_size + FOOTER_SIZE != size:
        raise CorruptionError(
            f"footer says {footer.data_size} data bytes but the file is {size} bytes", path, size
        )
    if footer.data_size > header.capacity:
        raise CorruptionError(
            f"footer data size {footer.data_size} exceeds capacity {header.capacity}", path, size
        )
    return footer


def data_extents(fd: int, start: int, end: int) -> list[tuple[int, int]]:
    """The parts ``[lo, hi)`` of ``[start, end)`` that are not holes, in order.

    Holes read as zeros. Uses ``SEEK_DATA``/``SEEK_HOLE``, which also count data
    still in the page cache; where they are unavailable the whole range is data.
    """
    seek_data = getattr(os, "SEEK_DATA", None)
    seek_hole = getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        return [(start, end)] if start < end else []
    extents: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        try:
            lo = os.lseek(fd, pos, seek_data)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data at or after pos
                break
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):  # not supported here
                extents.append((pos, end))
                break
            raise
        if lo >= end:
            break
        hi = min(os.lseek(fd, lo, seek_hole), end)
        extents.append((lo, hi))
        pos = hi
    return extents


_FIRST_WINDOW = 4096
_MAX_WINDOW = 1 << 20


def read_backwards(fd: int, start: int, end: int, unit: int = 1) -> Iterator[tuple[int, bytes]]:
    """``(file offset, bytes)`` windows covering the non-hole parts of ``[start, end)``,
    the last bytes first; holes are skipped unread (they are zeros).

    Window bounds fall on multiples of ``unit`` counted from ``start``. Windows
    start at 4 KiB and double up to 1 MiB, so a caller that stops at the first
    non-zero window it meets usually reads a few KiB.
    """
    window = _FIRST_WINDOW
    for data_start, data_end in reversed(data_extents(fd, start, end)):
        lo = start + (data_start - start) // unit * unit
        hi = min(end, start + -(-(data_end - start) // unit) * unit)
        while hi > lo:
            size = min(window, hi - lo) // unit * unit or min(unit, hi - lo)
            hi -= size
            yield hi, os.pread(fd, size, hi)
            window = min(window * 2, _MAX_WINDOW)
