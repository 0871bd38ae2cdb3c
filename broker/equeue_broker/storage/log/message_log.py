"""The message log: one global append-only log split into fixed-capacity chunks.

Files live in ``<data_dir>/log/`` named ``<chunk_number:09d>.chunk`` (format in
``chunk.py``; record framing in ``record.py``). A record's global position is
``chunk_number * capacity + local_offset``, where ``local_offset`` counts from
the end of the chunk header. Records never span chunks: when an append does not
fit, the active chunk is sealed (footer, truncate, fsync) and the next created.

Appends are encoded into a reused buffer and written with one ``pwrite``, so a
full disk surfaces as an ``OSError`` (ENOSPC). Reads slice read-only memory
maps, so recent data is served from the OS page cache; only the active chunk
and the ``max_mapped`` most recently read sealed chunks stay mapped.

Not thread-safe, except ``sync_target``/``fsync``: the store serialises the rest.
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from equeue_broker.storage.damage import QuarantinedChunk
from equeue_broker.storage.errors import ChunkQuarantined, CorruptionError
from equeue_broker.storage.index.queue_index import Segment, index_segments
from equeue_broker.storage.log.chunk import (
    CHUNK_TYPE_LOG,
    FOOTER_SIZE,
    HEADER_SIZE,
    ChunkHeader,
    active_size,
    chunk_file_name,
    create_chunk_file,
    pwrite_all,
    read_backwards,
    read_header,
    read_sealed_footer,
    seal_chunk_file,
)
from equeue_broker.storage.meta.atomic_file import fsync_dir
from equeue_proto.accel import CODEC
from equeue_proto.record import (
    BODY_TO_FRAME,
    FLAG_BATCH_END,
    FLAG_TXN,
    FRAME_OVERHEAD,
    HEADER,
    Buffer,
    RecordError,
    RecordMeta,
    StoredMessage,
    check_frame,
    check_frames_py,
    decode_record,
    read_meta,
)

log = logging.getLogger(__name__)

check_frames = CODEC.check_frames if CODEC else check_frames_py

LOG_SUFFIX = ".chunk"
SYNC_PREFILL_BYTES = 4 << 20
"""Sync mode: zeros kept written ahead of the log's data end (``MessageLog.prefill``):
refilled once less than half is left, so a 110 KB append per sync round pays
one journal commit (allocation) per ~20 rounds instead of one per round."""


@dataclass
class LogChunk:
    number: int
    path: Path
    fd: int
    capacity: int
    data_size: int
    """Bytes of data written (active chunk) or sealed (sealed chunk)."""
    sealed_ms: int | None = None
    mapped: mmap.mmap | None = field(default=None, repr=False)
    damage: str | None = None
    """Why the chunk is quarantined (a sealed chunk whose header or footer failed
    its checks): its data is never read, and reads of its records fail."""
    written_end: int = HEADER_SIZE
    """Active chunk: file offset past the last byte written since recovery zeroed
    the tail (at least ``HEADER_SIZE + data_size``); the data after it is zero.
    Bounds what ``MessageLog._cut`` must zero without scanning the chunk."""
    verified_end: int = HEADER_SIZE
    """Sealed chunk: file offset (a record boundary) below which every record
    was verified by a read since the chunk was opened (``first_damaged``)."""
    filled_end: int = HEADER_SIZE
    """Active chunk: file offset below which the data area is written blocks
    (records, or zeros ``MessageLog.prefill`` wrote ahead of them)."""

    @property
    def sealed(self) -> bool:
        return self.sealed_ms is not None

    def buffer(self) -> mmap.mmap:
        """A read-only map of the whole file (reads of the active chunk see every
        ``pwrite`` at once: the map and the writes share the page cache)."""
        if self.mapped is None:
            self.mapped = mmap.mmap(self.fd, 0, prot=mmap.PROT_READ)
        return self.mapped

    def unmap(self) -> None:
        if self.mapped is not None:
            self.mapped.close()
            self.mapped = None

    def close(self) -> None:
        self.unmap()
        os.close(self.fd)


@dataclass(frozen=True)
class TailRecovery:
    """What recovery found at the end of the last chunk."""

    scanned_records: int
    truncated_bytes: int
    reason: str
    """Why scanning stopped (e.g. "zero length (end of written data)")."""
    scanned_bytes: int = 0
    """Bytes read: the records up to the first invalid frame, then the written
    (non-hole) parts of the chunk after the last complete append."""


def _valid_frames(buf: Buffer, start: int, end: int) -> tuple[int, int, int, str]:
    """(records, end of the last of them, end of the last closing an append,
    why the next is not one) for the intact frames of ``buf`` from ``start``.
    The checks run in C where built (``check_frames``); the frames found are
    then walked by their lengths alone, for their count and flags."""
    if CODEC is None:
        pos = good_end = start
        count = 0
        while True:
            verdict = check_frame(buf, pos, end)
            if isinstance(verdict, str):
                return count, pos, good_end, verdict
            count += 1
            if buf[pos + 5] & FLAG_BATCH_END:
                good_end = pos + verdict
            pos += verdict
    bad = check_frames(buf, start, end)
    stop = end if bad < 0 else bad
    why = check_frame(buf, stop, end)
    pos = good_end = start
    count = 0
    while pos < stop:
        size = int.from_bytes(buf[pos : pos + 4], "little") + BODY_TO_FRAME
        count += 1
        if buf[pos + 5] & FLAG_BATCH_END:
            good_end = pos + size
        pos += size
    return count, pos, good_end, why if isinstance(why, str) else "end of the chunk"


class MessageLog:
    def __init__(self, directory: Path, capacity: int, max_mapped: int) -> None:
        self.directory = directory
        self.capacity = capacity
        self.max_mapped = max_mapped
        self.chunks: list[LogChunk] = []
        self._scratch = bytearray(0)
        self.active: LogChunk
        """The last chunk: the one appends go to (set by ``open``)."""
        self._recent: collections.OrderedDict[int, LogChunk] = collections.OrderedDict()
        self.tail: TailRecovery | None = None
        self._trusted = 0
        self.quarantined: list[QuarantinedChunk] = []
        self.prefill_bytes = 0
        """Zeros ``prefill`` keeps written ahead of the data end (0: off)."""
        self._zeros = b""

    # -- opening and recovery ----------------------------------------------------

    def open(self, trusted: int = 0) -> None:
        """Open existing chunks, validating sealed ones and repairing the tail.

        Sealed chunks are checked by header, footer and size only (cost per
        chunk, not per message); the last chunk is scanned record by record and
        cut after the last complete append (see ``record.py``). ``trusted``:
        a log position below which every record was fsynced whole (recovery's
        checkpoint): when it lies in the last chunk right after a complete
        append, the scan starts there rather than at the chunk's start.
        """
        self._trusted = trusted
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        for tmp in self.directory.glob("*.tmp"):
            log.warning("removing leftover temp chunk %s", tmp)
            tmp.unlink()
        try:
            self._open_chunks(sorted(self.directory.glob("*" + LOG_SUFFIX)))
        except BaseException:
            self.close()
            raise

    def _open_chunks(self, paths: list[Path]) -> None:
        checked_capacity = False
        for i, path in enumerate(paths):
            last = i == len(paths) - 1
            try:
                chunk = self._open_chunk(path, last)
            except CorruptionError as exc:
                if not last:
                    chunk = self._open_damaged(path, exc)
                elif self._rebuild_active_header(path):
                    chunk = self._open_chunk(path, last)  # its tail scan decides
                else:
                    # Records past the checkpoint may be in it, and nothing
                    # could index them: refuse rather than reuse their offsets.
                    raise
            if chunk.damage is None and not checked_capacity and chunk.capacity != self.capacity:
                log.warning(
                    "log was created with chunk capacity %d; ignoring the configured %d",
                    chunk.capacity,
                    self.capacity,
                )
                self.capacity = chunk.capacity
            checked_capacity = checked_capacity or chunk.damage is None
            self.chunks.append(chunk)  # first, so that a failed open closes it too
            if len(self.chunks) > 1 and chunk.number != self.chunks[-2].number + 1:
                raise CorruptionError(
                    f"log chunk {self.chunks[-2].number + 1} is missing", str(path)
                )
            if not chunk.sealed and not last:
                raise CorruptionError("a log chunk before the last one is not sealed", str(path))
        self._quarantine([c for c in self.chunks if c.damage is not None])
        if self.chunks and not self.chunks[-1].sealed:
            self.active = self.chunks[-1]
            self.tail = self._recover_tail(self.active)
        if not self.chunks or self.chunks[-1].sealed:
            self._new_chunk(self.chunks[-1].number + 1 if self.chunks else 0)

    def _open_chunk(self, path: Path, last: bool) -> LogChunk:
        fd = os.open(path, os.O_RDWR)
        try:
            header = read_header(fd, str(path))
            if header.chunk_type != CHUNK_TYPE_LOG:
                raise CorruptionError(
                    f"chunk type {header.chunk_type} is not a log chunk", str(path)
                )
            if str(path.name) != chunk_file_name(header.chunk_number, LOG_SUFFIX):
                raise CorruptionError(
                    f"header says chunk {header.chunk_number}, file name disagrees", str(path)
                )
            try:
                footer = read_sealed_footer(fd, str(path), header)
            except CorruptionError as exc:
                if not last:
                    raise
                # The last chunk may have been cut short by a crash (while being
                # sealed, or by an older release's tail repair): it is the active
                # chunk, and the tail scan keeps whatever complete appends it holds.
                log.warning("last log chunk has no valid footer (%s); scanning it", exc)
                os.ftruncate(fd, HEADER_SIZE + header.capacity)  # drop a torn footer
                os.ftruncate(fd, active_size(header))  # and restore the zeroed room
                footer = None
        except BaseException:
            os.close(fd)
            raise
        if footer is None:
            return LogChunk(header.chunk_number, path, fd, header.capacity, 0)
        return LogChunk(
            header.chunk_number, path, fd, header.capacity, footer.data_size, footer.sealed_ms
        )

    def _rebuild_active_header(self, path: Path) -> bool:
        """Rewrite the damaged header of the last chunk from what else says it
        (its number from the file name, its capacity from the other chunks and
        the file's size) when it is still an unsealed chunk of this log: its
        records are intact and the tail scan checks each of them. True if
        rebuilt; otherwise (the header is fine and something else failed, or
        the chunk is not shaped like an active one) the open fails as before.
        The damaged header is kept beside the chunk for an operator."""
        try:
            number = int(path.name.removesuffix(LOG_SUFFIX))
        except ValueError:
            return False
        with path.open("rb") as file:
            raw = file.read(HEADER_SIZE)
        try:
            ChunkHeader.decode(raw, str(path))
            return False  # the header is intact: the damage is elsewhere
        except CorruptionError as exc:
            why = str(exc)
        header = ChunkHeader(
            CHUNK_TYPE_LOG, number, self.capacity, int(path.stat().st_mtime * 1000)
        )
        if path.stat().st_size != active_size(header):
            return False
        kept = path.with_name(path.name + ".header.damaged")
        kept.write_bytes(raw)
        fd = os.open(path, os.O_RDWR)
        try:
            os.pwrite(fd, header.encode(), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        log.error(
            "ACTIVE LOG CHUNK HEADER DAMAGED: %s (%s); rebuilt from the file name and the "
            "log's chunk capacity, its records are checked by the tail scan; the damaged "
            "header is kept as %s", path, why, kept,
        )  # fmt: skip
        return True

    def _open_damaged(self, path: Path, exc: CorruptionError) -> LogChunk:
        """A placeholder for a sealed chunk that failed its checks: one flipped
        byte must not make the intact records of every other chunk unreachable.
        Its number comes from the file name, its size from the file's."""
        try:
            number = int(path.name.removesuffix(LOG_SUFFIX))
        except ValueError:
            raise exc from None
        fd = os.open(path, os.O_RDONLY)  # never written: retention may delete it
        stat = os.fstat(fd)
        data_size = max(0, stat.st_size - HEADER_SIZE - FOOTER_SIZE)
        chunk = LogChunk(number, path, fd, 0, data_size, int(stat.st_mtime * 1000))
        chunk.damage = str(exc)
        return chunk

    def _quarantine(self, chunks: list[LogChunk]) -> None:
        for chunk in chunks:
            chunk.capacity = self.capacity  # unknown from its header; the log's is the rule
            chunk.data_size = min(chunk.data_size, self.capacity)
            start = self.start_of(chunk)
            entry = QuarantinedChunk(
                chunk.path, chunk.number, start, start + chunk.data_size, chunk.damage or ""
            )
            self.quarantined.append(entry)
            log.error(
                "QUARANTINED log chunk %s: %s. Its records (log positions [%d, %d)) answer "
                "DATA_LOSS; every other chunk is served. `equeue-broker verify` on the "
                "stopped broker lists the damage (docs/operations.md)",
                chunk.path, chunk.damage, entry.start_position, entry.end_position,
            )  # fmt: skip

    def _trusted_start(self, chunk: LogChunk, buf: Buffer, end: int) -> int:
        """Where the tail scan of ``chunk`` may start: the byte of the trusted
        position when the frame ending there is intact, names its own position
        and closes an append (its length suffix finds its start); else the
        chunk's first record."""
        at = HEADER_SIZE + self._trusted - self.start_of(chunk)
        if not HEADER_SIZE + FRAME_OVERHEAD <= at <= end:
            return HEADER_SIZE
        frame = int.from_bytes(buf[at - 4 : at], "little") + BODY_TO_FRAME
        start = at - frame
        if start < HEADER_SIZE or check_frame(buf, start, at) != frame:
            return HEADER_SIZE
        meta = read_meta(buf, start)
        if meta.position != self.start_of(chunk) + start - HEADER_SIZE:
            return HEADER_SIZE
        return at if meta.flags & FLAG_BATCH_END else HEADER_SIZE

    def _recover_tail(self, chunk: LogChunk) -> TailRecovery:
        buf = chunk.buffer()
        end = HEADER_SIZE + chunk.capacity
        scan_start = self._trusted_start(chunk, buf, end)
        scanned, pos, good_end, verdict = _valid_frames(buf, scan_start, end)
        reason = verdict if pos == good_end else "incomplete append after the last batch end"
        # Anything non-zero after good_end (a torn append, garbage, pages of an
        # append that reached the disk while earlier ones did not) must be zeroed,
        # or a later append ending where stale records begin would resurrect them.
        # The chunk is sparse: only its written parts are read, from the end back.
        written = 0
        scanned_bytes = pos - scan_start
        for offset, data in read_backwards(chunk.fd, good_end, end):
            scanned_bytes += len(data)
            nonzero = len(data.rstrip(b"\x00"))
            if nonzero:
                written = offset + nonzero - good_end
                break
        chunk.written_end = good_end + written
        if written:
            log.warning(
                "log %s: discarding %d bytes after byte %d (%s)",
                chunk.path,
                written,
                good_end,
                reason,
            )
            self._cut(chunk, good_end - HEADER_SIZE)
        chunk.data_size = good_end - HEADER_SIZE
        return TailRecovery(scanned, written, reason, scanned_bytes)

    def _cut(self, chunk: LogChunk, data_size: int) -> None:
        """Zero everything in the active chunk after ``data_size`` bytes of data.

        Only ``[start, written_end)`` can be non-zero, so only that is written:
        the cost of undoing a failed append is its size, not the chunk's. Zeros
        are written in place rather than shrinking and re-growing the file, so a
        crash in the middle never leaves a chunk of the wrong size.
        """
        start = HEADER_SIZE + data_size
        self._zero(chunk, start, max(chunk.written_end - start, 0))
        os.fsync(chunk.fd)
        chunk.data_size = data_size
        chunk.written_end = start

    @staticmethod
    def _zero(chunk: LogChunk, start: int, size: int) -> None:
        zeros = bytes(min(size, 1 << 20))
        offset = start
        while offset < start + size:
            offset += os.pwrite(chunk.fd, zeros[: start + size - offset], offset)

    def truncate(self, position: int) -> None:
        """Cut the log at ``position``, which must lie in the active chunk."""
        chunk = self.active
        assert self.start_of(chunk) <= position <= self.write_position
        self._cut(chunk, position - self.start_of(chunk))

    def truncate_into_sealed(self, position: int) -> None:
        """Cut the log at ``position`` in a sealed chunk (a replica's divergent
        tail): later chunks are deleted, newest first (a crash in between leaves
        a shorter, contiguous log), and the chunk holding ``position`` becomes
        the active one again (footer dropped, room restored, tail zeroed)."""
        target = self.chunk_at(position)
        assert target.damage is None and position <= self.start_of(target) + target.data_size
        for chunk in reversed(self.chunks[self.chunks.index(target) + 1 :]):
            self.chunks.remove(chunk)
            self._recent.pop(chunk.number, None)
            chunk.close()
            chunk.path.unlink()
        fsync_dir(self.directory)
        if target.sealed:
            target.unmap()
            self._recent.pop(target.number, None)
            os.ftruncate(target.fd, HEADER_SIZE + target.data_size)  # the footer goes
            os.ftruncate(target.fd, HEADER_SIZE + target.capacity + FOOTER_SIZE)  # zeroed room
            target.sealed_ms = None
            target.written_end = HEADER_SIZE + target.data_size
            target.filled_end = HEADER_SIZE + target.data_size  # sealing cut the zeros off
        self.active = target
        self._cut(target, position - self.start_of(target))

    # -- positions -----------------------------------------------------------------

    def start_of(self, chunk: LogChunk) -> int:
        return chunk.number * self.capacity

    @property
    def start_position(self) -> int:
        """Position of the first byte still in the log."""
        return self.start_of(self.chunks[0])

    @property
    def write_position(self) -> int:
        """Position the next record will be written at (in the active chunk)."""
        return self.start_of(self.active) + self.active.data_size

    def room(self) -> int:
        """Bytes the active chunk can still take (0 if a failed roll left it sealed)."""
        return 0 if self.active.sealed else self.capacity - self.active.data_size

    # -- writes --------------------------------------------------------------------

    def append(self, size: int, encode: Callable[[memoryview, int], int]) -> int:
        """Append ``size`` bytes of records at the write position; return that position.

        ``encode(view, position)`` writes the records into a reused scratch
        buffer and returns the bytes written; one ``pwrite`` then hands them to
        the OS, the same kernel path as any sequential file write. (Encoding
        straight into a memory map of the chunk measured slower and far less
        steady here: page faults contend with the flusher's fsync.) If
        ``encode`` raises, nothing reaches the file.
        """
        assert size <= self.room(), "caller must roll the chunk first"
        position = self.write_position
        scratch = self._scratch if size <= len(self._scratch) else bytearray(size)
        if size > len(self._scratch) and size <= _SCRATCH_LIMIT:
            self._scratch = scratch
        with memoryview(scratch) as whole, whole[:size] as view:
            written = encode(view, position)
            assert written == size, (written, size)
            self._write(view)
        return position

    def append_bytes(self, data: bytes | memoryview) -> int:
        """Append ``data``, whole records already encoded (a master's bytes on
        its replica), as they are: no copy into the scratch buffer. Return
        the position they start at."""
        assert len(data) <= self.room(), "caller must roll the chunk first"
        position = self.write_position
        self._write(data)
        return position

    def _write(self, data: bytes | memoryview) -> None:
        chunk = self.active
        offset = HEADER_SIZE + chunk.data_size
        # What a failed append may leave after the data end, for _cut to
        # zero (zeroing bytes never written is harmless).
        chunk.written_end = max(chunk.written_end, offset + len(data))
        pwrite_all(chunk.fd, data, offset)
        chunk.data_size += len(data)

    def prefill(self) -> bool:
        """Write zeros ahead of the data end in the active chunk, ``prefill_bytes``
        at a time, once less than half of that is left; True if it wrote any.

        The chunk is sparse: an append into a hole allocates blocks, and then its
        fdatasync must commit the file system's journal (shared by every process
        on the disk; on ext4 ~0.3-4 ms here, the bulk of a sync append's fsync).
        Records written over blocks that already hold (synced) zeros need only
        their data pages flushed. The zeros change nothing a reader or recovery
        sees: the data ends at the first zero frame either way (``_valid_frames``),
        and the tail scan reads them as it reads any written part after the end.
        Sync mode only: the caller holds the store's lock (no append runs
        meanwhile), then syncs the file (the store's committer thread, between
        rounds)."""
        chunk = self.active
        step = self.prefill_bytes
        if not step or chunk.sealed:
            return False
        end = HEADER_SIZE + chunk.data_size
        start = max(chunk.filled_end, end)
        stop = min(end + step, HEADER_SIZE + chunk.capacity)
        if start - end >= step // 2 or stop <= start:
            return False
        if len(self._zeros) != step:
            self._zeros = bytes(step)
        pwrite_all(chunk.fd, memoryview(self._zeros)[: stop - start], start)
        chunk.filled_end = stop
        return True

    def roll(self) -> None:
        """Seal the active chunk and start the next one."""
        chunk = self.active
        if not chunk.sealed:  # else an earlier roll sealed it but failed to create the next
            chunk.unmap()  # the file shrinks below the mapped length
            footer = seal_chunk_file(chunk.fd, chunk.data_size)
            chunk.sealed_ms = footer.sealed_ms
        self._new_chunk(chunk.number + 1)

    def restart_at(self, number: int) -> None:
        """Start an empty log over at chunk ``number`` (an empty replica whose
        master's retention removed the chunks before it)."""
        active = self.active
        assert len(self.chunks) == 1 and active.data_size == 0, "the log is not empty"
        self.chunks.clear()
        active.close()
        active.path.unlink()
        self._new_chunk(number)

    def _new_chunk(self, number: int) -> None:
        path = self.directory / chunk_file_name(number, LOG_SUFFIX)
        header = ChunkHeader(CHUNK_TYPE_LOG, number, self.capacity, int(time.time() * 1000))
        create_chunk_file(path, header)
        self.active = LogChunk(number, path, os.open(path, os.O_RDWR), self.capacity, 0)
        self.chunks.append(self.active)

    def sync_target(self) -> tuple[int, int]:
        """(write position, fd of the active chunk): what an fsync now would cover."""
        return self.write_position, self.active.fd

    # -- reads ---------------------------------------------------------------------

    def chunk_at(self, position: int) -> LogChunk:
        index = position // self.capacity - self.chunks[0].number
        if not 0 <= index < len(self.chunks):
            raise CorruptionError(
                f"log position {position} is not in any chunk", str(self.directory)
            )
        return self.chunks[index]

    def read(self, position: int, size: int) -> StoredMessage:
        """Decode the record of ``size`` bytes at ``position`` (sizes come from the index)."""
        chunk, local = self._data_view(position, size)
        try:
            return decode_record(chunk.buffer(), local)
        except RecordError as exc:
            raise CorruptionError(f"invalid record: {exc.reason}", str(chunk.path), local) from None

    def _data_view(self, position: int, size: int) -> tuple[LogChunk, int]:
        """The chunk holding ``[position, position + size)`` and the local file offset."""
        chunk = self.chunk_at(position)
        local = HEADER_SIZE + position - self.start_of(chunk)
        if chunk.damage is not None:
            raise ChunkQuarantined(
                f"log position {position} is in quarantined chunk {chunk.path.name} "
                f"({chunk.damage})",
                str(chunk.path),
                local,
            )
        if local + size > HEADER_SIZE + chunk.data_size:
            raise CorruptionError(
                f"bytes [{position}, {position + size}) run past the data end",
                str(chunk.path),
                local,
            )
        if chunk is not self.active:
            self._touch(chunk)
        return chunk, local

    def copy(self, start: int, end: int) -> memoryview:
        """The stored bytes of ``[start, end)``, which must lie in one chunk (a view
        to copy from at once: it is only valid until the log changes)."""
        chunk, local = self._data_view(start, end - start)
        return memoryview(chunk.buffer())[local : local + end - start]

    def first_damaged(self, start: int, end: int) -> int | None:
        """Position of the first invalid record of ``[start, end)`` (records back
        to back in one chunk), or None. Only sealed chunks are checked: the tail
        scan at open checked the active one, and it has been written since by
        this process alone.

        Verify on first read: each chunk keeps a watermark below which reads
        have verified every record, and a read verifies from the watermark to
        its end, so a byte is checked once per process (readers of other
        queues, and re-reads, pay nothing). A read further than
        ``_VERIFY_AHEAD`` past the watermark verifies its own bytes only,
        which bounds the cost of any one read.
        """
        chunk, local = self._data_view(start, end - start)
        stop = local + end - start
        if not chunk.sealed or stop <= chunk.verified_end:
            return None
        buf = chunk.buffer()
        if local < chunk.verified_end or local - chunk.verified_end > _VERIFY_AHEAD:
            begin = local if local > chunk.verified_end else chunk.verified_end
        else:
            begin = chunk.verified_end
        bad = check_frames(buf, begin, stop)
        if bad < 0:
            if begin <= chunk.verified_end:
                chunk.verified_end = stop
            return None
        if begin <= chunk.verified_end:
            chunk.verified_end = bad  # stays below the damage
        if bad < local:  # another queue's record: this read's own may be intact
            bad = check_frames(buf, local, stop)
        return None if bad < 0 else start + bad - local

    def chunk_path(self, position: int) -> str:
        """The file of the chunk holding ``position`` (for error messages)."""
        return str(self.chunk_at(position).path)

    def record_is(self, position: int, topic: bytes, queue_id: int, offset: int) -> bool:
        """True if the record at ``position`` is (topic, queue, offset): the check
        of an index entry a read makes before it copies from where it points.
        The header only (a record names its own position, so a wrong position
        cannot pass by chance); checksums are the copy's business."""
        if not self.start_position <= position < self.write_position:
            return False
        try:
            chunk, local = self._data_view(position, HEADER.size)
        except ChunkQuarantined as exc:
            # The record may be intact, but its chunk is not served: DATA_LOSS,
            # naming the record the caller asked for.
            chunk = self.chunk_at(position)
            raise ChunkQuarantined(
                f"{topic.decode(errors='replace')}/{queue_id} offset {offset} is in "
                f"quarantined log chunk {chunk.path.name} ({chunk.damage}); its records "
                "cannot be served",
                exc.path,
                exc.position,
            ) from None
        except CorruptionError:
            return False
        meta = read_meta(chunk.buffer(), local)
        # A transaction's record holds its serial, not its offset (the commit
        # gave it one): its header names its queue and its own position.
        stored = offset if meta.flags & FLAG_TXN else meta.queue_offset
        return (meta.topic, meta.queue_id, stored, meta.position) == (
            topic, queue_id, offset, position,
        )  # fmt: skip

    def meta_at(self, position: int) -> RecordMeta:
        """The fixed fields of the record at ``position`` (checksum not verified)."""
        chunk, local = self._data_view(position, HEADER.size)
        return read_meta(chunk.buffer(), local)

    def tag_at(self, position: int) -> bytes:
        """The tag of the record at ``position``."""
        return self.meta_at(position).tag

    def _touch(self, chunk: LogChunk) -> None:
        """Count ``chunk`` among the mapped sealed chunks, unmapping the least recently used."""
        if chunk.number in self._recent:
            self._recent.move_to_end(chunk.number)
            return
        self._recent[chunk.number] = chunk
        while len(self._recent) > self.max_mapped:
            _, old = self._recent.popitem(last=False)
            old.unmap()

    def iter_records(self, start: int) -> Iterator[tuple[int, RecordMeta]]:
        """(position, meta) of every record at or after ``start``, checksums verified.

        A bad record in a sealed chunk raises ``CorruptionError``.
        """
        for chunk_start, buf, begin, end in self._checked_ranges(start):
            pos = begin
            while pos < end:
                meta = read_meta(buf, pos)
                yield chunk_start + pos - HEADER_SIZE, meta
                pos += meta.frame_size

    def iter_segments(self, start: int) -> Iterator[tuple[int, RecordMeta | None, Segment]]:
        """``iter_records`` in runs: (position, None, segment) for a run of plain
        records of one queue with their index entries (``index_segments``: one
        C call per chunk where it is built), (position, meta, empty segment) for
        a transaction's record. Checked and raising as ``iter_records``."""
        for chunk_start, buf, pos, end in self._checked_ranges(start):
            base = chunk_start + pos - HEADER_SIZE
            for segment in index_segments(buf, pos, end, base):
                at = segment[0]
                position = chunk_start + at - HEADER_SIZE
                yield position, None if segment[1] else read_meta(buf, at), segment

    def _checked_ranges(self, start: int) -> Iterator[tuple[int, mmap.mmap, int, int]]:
        """(chunk start, chunk buffer, from, to): the checked frames of each chunk
        at or after log ``start``; a bad frame raises ``CorruptionError`` after
        the range before it."""
        for chunk in self.chunks:
            chunk_start = self.start_of(chunk)
            if chunk_start + chunk.data_size <= start:
                continue
            if chunk.damage is not None:  # no framing to trust: the index cannot be rebuilt
                raise CorruptionError(
                    f"records from log position {start} must be re-indexed, but chunk "
                    f"{chunk.path.name} is quarantined ({chunk.damage})",
                    str(chunk.path),
                )
            buf = chunk.buffer()
            end = HEADER_SIZE + chunk.data_size
            pos = HEADER_SIZE + max(0, start - chunk_start)
            # Every frame checked in one call (the C codec's loop where it is
            # built); the records before the first bad one are still yielded.
            bad = check_frames(buf, pos, end)
            yield chunk_start, buf, pos, end if bad < 0 else bad
            if bad >= 0:
                verdict = check_frame(buf, bad, end)
                raise CorruptionError(f"invalid record: {verdict}", str(chunk.path), bad)
            if chunk.sealed and chunk.number not in self._recent:
                chunk.unmap()

    # -- retention -----------------------------------------------------------------

    def delete_oldest(self) -> LogChunk:
        """Delete the oldest chunk (which must be sealed and not the active one)."""
        chunk = self.chunks[0]
        assert chunk.sealed and len(self.chunks) > 1
        self.chunks.pop(0)
        self._recent.pop(chunk.number, None)
        chunk.close()
        chunk.path.unlink()
        if chunk.damage is not None:  # gone with its damage: no longer reported
            self.quarantined = [q for q in self.quarantined if q.number != chunk.number]
        return chunk

    def close(self) -> None:
        for chunk in self.chunks:
            chunk.close()
        self.chunks.clear()
        self._recent.clear()


_VERIFY_AHEAD = 4 << 20
"""Most bytes of other records a read verifies to advance a chunk's watermark."""

_SCRATCH_LIMIT = 16 << 20
"""Largest append encoding buffer kept for reuse; larger appends get a temporary one."""
