"""The queue index: one chain of fixed-width index chunks per (topic, queue).

On-disk format (little-endian; this module is the only place that knows it)::

    index/<topic>/<queue_id>/<chunk_number:09d>.idx   (chunk.py header, type 2)

    entry (ENTRY_SIZE = 32 bytes), queue offset N of chunk k lives at
    byte HEADER_SIZE + (N - k * entries_per_chunk) * ENTRY_SIZE:
        position_plus_one  u64   global log position of the record + 1
        record_size        u32   bytes of the framed record in the log
        tag_hash           u32   CRC32C of the tag's UTF-8 bytes, 0 if untagged
        store_timestamp_ms i64   broker time the record was stored
        crc                u32   CRC32C of the 24 bytes above      } the checksum
        format             u32   ENTRY_FORMAT_CHECKED (1)          } trailer

An all-zero entry means "empty": the +1 on the position keeps a record at log
position 0 distinguishable from an unwritten slot. Entries written before the
trailer existed (0.2 and older) have 8 reserved zero bytes there: an all-zero
trailer is accepted as such an unchecked entry; any other trailer must be
``crc | 1`` with a matching CRC, or the entry is *damaged* (``entry_damaged``)
and is rebuilt from the log (index_repair.py) rather than trusted. Entries carry the record size
so a read can size its reply without touching the log, the tag hash so a tag
filter can skip records without reading them, and the store time so a reader can
seek by timestamp with a binary search over the index alone.

The index is derived data: everything in it can be rebuilt from the message log
(see ``store.py`` recovery), so index writes are not fsynced per append.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from crc32c import crc32c

from equeue_broker.storage.errors import CorruptionError
from equeue_broker.storage.index.index_files import IndexFiles
from equeue_broker.storage.log.chunk import (
    CHUNK_TYPE_INDEX,
    HEADER_SIZE,
    ChunkHeader,
    chunk_file_name,
    create_chunk_file,
    pwrite_all,
    read_backwards,
    read_header,
)
from equeue_proto.accel import CODEC, check_layout
from equeue_proto.record import FLAG_CONTROL, FLAG_TXN, FRAME_OVERHEAD, Buffer, read_meta

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

ENTRY = struct.Struct("<QIIq8x")
"""The four data fields (the trailer skipped); write entries with ``pack_entry``."""
ENTRY_SIZE = ENTRY.size
_AT_SIZE = struct.calcsize("<Q")
_AT_TAG_HASH = struct.calcsize("<QI")
_AT_STORE_MS = struct.calcsize("<QII")
_AT_CRC = struct.calcsize("<QIIq")
_AT_FORMAT = _AT_CRC + 4
_TRAILER = struct.Struct("<II")
ENTRY_FORMAT_CHECKED = 1
"""The trailer's format word when the entry carries a CRC."""
_POSITION = struct.Struct("<Q")
"""An entry's first field, ``position_plus_one``."""
_SIZE_WORD = _AT_SIZE // 4
"""Index of ``record_size`` among an entry's 32-bit words (after the u64 position)."""
INDEX_SUFFIX = ".idx"

IndexEntry = tuple[int, int, int, int]
"""(position_plus_one, record_size, tag_hash, store_timestamp_ms) as stored."""

Run = tuple[int, int, int]
"""(start, end, first entry): log bytes of records lying back to back in one chunk."""

RUNS_DONE, RUNS_LIMIT, RUNS_EMPTY, RUNS_DAMAGED = 0, 1, 2, 3
"""Why ``index_runs`` stopped: every entry taken, a limit reached, an empty
entry, an entry that fails its checksum."""


def pack_entry_into(  # noqa: PLR0917 (the entry's fields, in order)
    buf: WriteableBuffer, at: int, position_plus_one: int, size: int, tag_hash: int, store_ms: int
) -> None:
    """Write one entry with its checksum trailer at ``buf[at:]``."""
    ENTRY.pack_into(buf, at, position_plus_one, size, tag_hash, store_ms)
    crc = crc32c(memoryview(buf)[at : at + _AT_CRC])
    _TRAILER.pack_into(buf, at + _AT_CRC, crc, ENTRY_FORMAT_CHECKED)


def pack_entry(position_plus_one: int, size: int, tag_hash: int, store_ms: int) -> bytes:
    """One entry with its checksum trailer."""
    out = bytearray(ENTRY_SIZE)
    pack_entry_into(out, 0, position_plus_one, size, tag_hash, store_ms)
    return bytes(out)


def entry_damaged(entries: ReadableBuffer, at: int = 0) -> bool:
    """True if the entry at ``entries[at:]`` fails its checksum or has an unknown
    trailer (an all-zero trailer, of an older or an empty entry, is accepted)."""
    crc: int
    format_: int
    crc, format_ = _TRAILER.unpack_from(entries, at + _AT_CRC)
    if format_ == ENTRY_FORMAT_CHECKED:
        return crc != crc32c(memoryview(entries)[at : at + _AT_CRC])
    return format_ != 0 or crc != 0


def entry_unchecked(entries: ReadableBuffer, at: int = 0) -> bool:
    """True if the entry at ``entries[at:]`` has no checksum (written before
    entries carried one): its fields can only be checked against the log."""
    format_: int = _TRAILER.unpack_from(entries, at + _AT_CRC)[1]
    return format_ != ENTRY_FORMAT_CHECKED


def index_runs_py(  # noqa: PLR0917 (positional, like the C function it mirrors)
    entries: ReadableBuffer,
    capacity: int,
    max_messages: int,
    max_bytes: int,
    count: int,
    total: int,
) -> tuple[list[Run], int, int, int, int]:
    """Plan an unfiltered pull over raw entries: (runs, taken, count, total, stop).

    Entries are taken in order until ``count`` reaches ``max_messages`` or the
    next record would push ``total`` past ``max_bytes`` (a read's first record
    is always taken). Records back to back in one log chunk (of ``capacity``
    bytes) form one run, copied with one slice. The reference for
    ``_codec.index_runs``, which the store uses when built.
    """
    runs: list[Run] = []
    run_start = run_end = -1
    run_first = taken = 0
    stop = RUNS_DONE
    for taken, (position_plus_one, size, _tag, _ts) in enumerate(ENTRY.iter_unpack(entries)):
        if count < max_messages and entry_damaged(entries, taken * ENTRY_SIZE):
            stop = RUNS_DAMAGED
            break
        if count >= max_messages or (position_plus_one and count and total + size > max_bytes):
            stop = RUNS_LIMIT
            break
        if position_plus_one == 0:
            stop = RUNS_EMPTY
            break
        position = position_plus_one - 1
        if position != run_end or position % capacity == 0:
            if run_end > run_start:
                runs.append((run_start, run_end, run_first))
            run_start = run_end = position
            run_first = taken
        run_end += size
        count += 1
        total += size
    else:
        taken = memoryview(entries).nbytes // ENTRY_SIZE
    if run_end > run_start:
        runs.append((run_start, run_end, run_first))
    return runs, taken, count, total, stop


Segment = tuple[int, int, bytes, int, int, bytes]
"""(at, count, topic, queue_id, first offset, entries): a run of ``count``
plain records of one queue at consecutive offsets from buffer offset ``at``,
with their packed entries; ``count`` 0 for a transaction's record."""


def index_segments_py(buf: Buffer, start: int, end: int, position: int) -> list[Segment]:
    """The index entries of the (checked) frames of ``buf[start:end]``, whose
    first lies at log ``position``, grouped in runs (``Segment``): the same
    entries as ``index_repair.entry_for`` record by record. The reference for
    ``_codec.index_segments``, which a replica uses to index a reply in one call."""
    out: list[Segment] = []
    run: list[int] = []  # at, queue_id, first offset, count
    topic = b""
    entries = bytearray()
    pos = start
    while pos < end:
        meta = read_meta(buf, pos) if end - pos >= FRAME_OVERHEAD else None
        if meta is None or meta.frame_size < FRAME_OVERHEAD or pos + meta.frame_size > end:
            raise ValueError(f"record at byte {pos} overruns the buffer")
        special = meta.flags & (FLAG_TXN | FLAG_CONTROL)
        if run and (
            special
            or (meta.topic, meta.queue_id, meta.queue_offset) != (topic, run[1], run[2] + run[3])
        ):
            out.append((run[0], run[3], topic, run[1], run[2], bytes(entries)))
            run, entries = [], bytearray()
        if special:
            out.append((pos, 0, b"", 0, 0, b""))
        else:
            if not run:
                run, topic = [pos, meta.queue_id, meta.queue_offset, 0], meta.topic
            tag_hash = crc32c(meta.tag) if meta.tag else 0
            entries += pack_entry(
                position + pos - start + 1, meta.frame_size, tag_hash, meta.store_timestamp_ms
            )
            run[3] += 1
        pos += meta.frame_size
    if run:
        out.append((run[0], run[3], topic, run[1], run[2], bytes(entries)))
    return out


index_segments: Callable[[Buffer, int, int, int], list[Segment]] = (
    CODEC.index_segments if CODEC else index_segments_py
)


index_runs = CODEC.index_runs if CODEC else index_runs_py
if CODEC is not None:  # the C encoder writes entries too: its layout must be this one
    check_layout(
        CODEC.LAYOUT,
        {"ENTRY_SIZE": ENTRY_SIZE, "ENTRY_AT_SIZE": _AT_SIZE, "ENTRY_AT_TAG_HASH": _AT_TAG_HASH,
         "ENTRY_AT_STORE_MS": _AT_STORE_MS, "ENTRY_AT_CRC": _AT_CRC,
         "ENTRY_AT_FORMAT": _AT_FORMAT, "ENTRY_FORMAT_CHECKED": ENTRY_FORMAT_CHECKED},
    )  # fmt: skip


@dataclass
class Deferred:
    """What a lazily opened index is as of its store's open (recovery.py):
    ``end`` and ``earliest`` vouched for by the checkpoint, and ``settle``, the
    per-queue recovery put off until the index's first use, called once with
    the index, its files open."""

    end: int
    earliest: int
    settle: Callable[[QueueIndex], None]


class QueueIndex:
    """The index of one topic queue: maps queue offsets to log positions.

    Not thread-safe: the store serialises access with its lock.
    """

    def __init__(
        self,
        directory: Path | str,
        entries_per_chunk: int,
        files: IndexFiles | None = None,
        *,
        deferred: Deferred | None = None,
    ) -> None:
        """Open the index in ``directory`` (creating it if need be); with
        ``deferred``, touch no file now: ``end``, ``earliest`` and
        ``entries_per_chunk`` are the caller's (a checkpoint vouches for them),
        and ``deferred.settle`` runs before the first file of the index is
        used (``_open_files``)."""
        self._dir = str(directory)
        """The directory as a string: a restart builds one per queue, and a
        ``Path`` costs several times more (``directory`` makes one on demand)."""
        self.entries_per_chunk = entries_per_chunk
        self._files = files
        """The store's descriptor budget (index_files.py); None: no limit."""
        self._fds: dict[int, int] = {}
        self._dirty: set[int] = set()
        self.end = 0
        """Next queue offset to assign (one past the last entry)."""
        self.earliest = 0
        """Lowest offset whose record is still in the log (maintained by retention)."""
        self.suspect = False
        """Set by ``recover``: an entry it dropped may have been a record's (``_find_end``)."""
        self._deferred = deferred
        """Set while the files are not opened yet (a lazily opened index)."""
        self._numbers: list[int] | None = None
        """``chunk_numbers``, once listed."""
        if deferred is None:
            self._open_files()
        else:
            self.end, self.earliest = deferred.end, deferred.earliest

    @property
    def directory(self) -> Path:
        return Path(self._dir)

    @property
    def deferred(self) -> bool:
        """True while the index's files have not been looked at (opened lazily)."""
        return self._deferred is not None

    def _open_files(self) -> None:
        try:
            os.mkdir(self._dir, 0o700)
        except FileExistsError:
            pass  # the usual case: one syscall, where pathlib's mkdir costs a stat more
        except FileNotFoundError:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        numbers = self.chunk_numbers()
        if numbers:
            path = f"{self._dir}/{chunk_file_name(numbers[0], INDEX_SUFFIX)}"
            header = read_header(self._fd(numbers[0]), path)
            self.entries_per_chunk = header.capacity // ENTRY_SIZE
            self.earliest = numbers[0] * self.entries_per_chunk

    def open_now(self) -> None:
        """Open a lazily opened index's files and run its deferred recovery
        (``Deferred.settle``); nothing if it is open. If that fails, it runs
        again at the next use: a queue is never used half recovered."""
        deferred = self._deferred
        if deferred is None:
            return
        self._deferred = None
        try:
            self._open_files()
            deferred.settle(self)
        except BaseException:
            self.release()
            self._dirty.clear()
            self._numbers = None
            self._deferred = deferred
            self.end, self.earliest = deferred.end, deferred.earliest
            raise

    # -- files -----------------------------------------------------------------

    def _path(self, number: int) -> Path:
        return self.directory / chunk_file_name(number, INDEX_SUFFIX)

    def chunk_numbers(self) -> list[int]:
        """The numbers of the index's chunk files, in order: listed once (one
        directory read, leftovers of an interrupted creation removed), then
        kept up to date as chunks are created and deleted."""
        if self._deferred is not None:
            self.open_now()
        if self._numbers is None:
            numbers = []
            try:
                with os.scandir(self._dir) as entries:
                    for entry in entries:
                        if entry.name.endswith(".tmp"):
                            os.unlink(entry.path)  # a chunk whose creation was interrupted
                        elif entry.name.endswith(INDEX_SUFFIX):
                            numbers.append(int(entry.name[: -len(INDEX_SUFFIX)]))
            except FileNotFoundError:
                pass  # no directory (yet): no chunk
            self._numbers = sorted(numbers)
        return list(self._numbers)

    def _fd(self, number: int, create: bool = False) -> int:
        if self._deferred is not None:  # the first use of a lazily opened index
            self.open_now()
        fd = self._fds.get(number)
        if fd is not None and self._files is not None:
            self._files.used(self, number)
        if fd is None:
            # A string path and one open (no stat, no pathlib): a restart after
            # writes to many queues opens thousands of these.
            path = f"{self._dir}/{chunk_file_name(number, INDEX_SUFFIX)}"
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                if not create:
                    raise CorruptionError(f"index chunk {path} is missing", path) from None
                capacity = self.entries_per_chunk * ENTRY_SIZE
                header = ChunkHeader(
                    CHUNK_TYPE_INDEX, number, capacity, int(time.time() * 1000), ENTRY_SIZE
                )
                create_chunk_file(Path(path), header)
                self._numbers = None
                fd = os.open(path, os.O_RDWR)
            self._fds[number] = fd
            if self._files is not None:
                self._files.opened(self, number)
        return fd

    def _evict(self, number: int) -> None:
        """Close a chunk's descriptor for the budget; it stays dirty if it was
        (``take_dirty`` opens it again for the fsync)."""
        fd = self._fds.pop(number, None)
        if fd is not None:
            os.close(fd)

    def _locate(self, offset: int) -> tuple[int, int]:
        number, slot = divmod(offset, self.entries_per_chunk)
        return number, HEADER_SIZE + slot * ENTRY_SIZE

    # -- writes ------------------------------------------------------------------

    def write(self, first_offset: int, entries: bytes | bytearray | memoryview) -> None:
        """Write packed entries for offsets starting at ``first_offset``.

        All or nothing: if a write fails part-way, the entries already written
        are zeroed again (best effort) so none is left past ``end`` to be taken
        for a real one by a later recovery.
        """
        view = memoryview(entries)
        try:
            self._write_all(first_offset, view)
        except OSError:
            with contextlib.suppress(OSError):
                self._write_all(first_offset, memoryview(bytes(len(view))))
            raise
        self.end = max(self.end, first_offset + len(view) // ENTRY_SIZE)

    def _write_all(self, first_offset: int, view: memoryview) -> None:
        offset = first_offset
        while view:
            number, byte_pos = self._locate(offset)
            room = (self.entries_per_chunk - offset % self.entries_per_chunk) * ENTRY_SIZE
            piece = view[:room]
            pwrite_all(self._fd(number, create=True), piece, byte_pos)
            self._dirty.add(number)
            offset += len(piece) // ENTRY_SIZE
            view = view[room:]

    def sync(self) -> None:
        """fsync every chunk written since the last sync."""
        for fd in self.take_dirty():
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def take_dirty(self) -> list[int]:
        """Duplicates of the fds written since the last call, for fsync outside the
        store lock (a duplicate stays valid even if the chunk is closed meanwhile).
        The caller closes them."""
        fds = [os.dup(self._fd(n)) for n in sorted(self._dirty)]
        self._dirty.clear()
        return fds

    # -- reads -------------------------------------------------------------------

    def read_raw(self, offset: int, count: int) -> bytes:
        """Whole entries for ``[offset, offset + count)``, clipped to the chunk
        holding ``offset`` (and to what the file holds)."""
        number, byte_pos = self._locate(offset)
        count = min(count, self.entries_per_chunk - offset % self.entries_per_chunk)
        data = os.pread(self._fd(number), count * ENTRY_SIZE, byte_pos)
        return data[: len(data) - len(data) % ENTRY_SIZE]

    def read(self, offset: int, count: int) -> list[IndexEntry]:
        """Entries for ``[offset, offset + count)``, clipped to the chunk holding ``offset``."""
        return list(ENTRY.iter_unpack(self.read_raw(offset, count)))

    def record_sizes(self, offset: int, count: int) -> list[int]:
        """Record sizes for ``[offset, offset + count)``, clipped like ``read``:
        a strided slice of the raw entries, no per-entry unpack."""
        words = memoryview(self.read_raw(offset, count)).cast("I")
        return words[_SIZE_WORD :: ENTRY_SIZE // 4].tolist()

    def entry(self, offset: int) -> IndexEntry:
        entries = self.read(offset, 1)
        if not entries or entries[0][0] == 0:
            raise CorruptionError(
                f"index entry for offset {offset} is empty", str(self._path(offset)), offset
            )
        return entries[0]

    def first_offset_where(
        self,
        lo: int,
        field: int,
        minimum: int,
        entry: Callable[[int], IndexEntry] | None = None,
    ) -> int:
        """Smallest offset in ``[lo, end)`` whose entry ``field`` is >= ``minimum``.

        Entries are non-decreasing in position (field 0) and store time (field 3)
        along a queue, which makes a binary search valid. Returns ``end`` if none.
        ``entry`` reads one probed entry (default ``self.entry``); a caller that
        checks what it probes passes its own, raising to stop the search.
        """
        read = self.entry if entry is None else entry
        hi = self.end
        while lo < hi:
            mid = (lo + hi) // 2
            if read(mid)[field] >= minimum:
                hi = mid
            else:
                lo = mid + 1
        return lo

    # -- recovery and retention --------------------------------------------------

    def recover(self, keep_below_position: int, known_end: int | None = None) -> int:
        """Set ``end`` from the files, dropping entries at or past ``keep_below_position``.

        Entries for records before the checkpoint position were fsynced and are
        trusted; later ones are zeroed here and rebuilt from the log by the store.
        Only the tail of the last chunk is read: its written parts, from the last
        non-zero entry back to the last one kept (``_find_end``). Returns the
        number of bytes read.

        ``known_end``: the end the checkpoint saved. When the entry before it is
        intact and names a record before ``keep_below_position``, that is the
        end: only the entries after it are looked at, to be zeroed
        (``_recover_known``), not walked one by one.
        """
        numbers = self.chunk_numbers()
        self.end = self.earliest
        self.suspect = False
        if known_end is not None and numbers:
            read = self._recover_known(numbers, keep_below_position, known_end)
            if read is not None:
                return read
        scanned = 0
        for number in reversed(numbers):
            fd = self._fd(number)
            keep, slots, read, suspect = self._find_end(fd, keep_below_position)
            self.suspect = self.suspect or suspect
            scanned += read
            if keep < slots:
                os.pwrite(fd, bytes((slots - keep) * ENTRY_SIZE), HEADER_SIZE + keep * ENTRY_SIZE)
                self._dirty.add(number)
            if keep > 0:
                self.end = number * self.entries_per_chunk + keep
                break
        self.earliest = min(self.earliest, self.end)
        return scanned

    def _recover_known(self, numbers: list[int], keep_below: int, end: int) -> int | None:
        """``recover`` to ``end`` if the entry before it is intact and names a
        record below ``keep_below`` (else None: the caller walks the entries):
        the written entries after it, in its chunk and any later one, are
        zeroed. Returns the bytes read."""
        if end <= self.earliest or end > (numbers[-1] + 1) * self.entries_per_chunk:
            return None
        number, slot = divmod(end - 1, self.entries_per_chunk)
        if number not in numbers:
            return None
        fd = self._fd(number)
        raw = os.pread(fd, ENTRY_SIZE, HEADER_SIZE + slot * ENTRY_SIZE)
        read = len(raw)
        if len(raw) != ENTRY_SIZE or entry_damaged(raw):
            return None
        position = _POSITION.unpack_from(raw)[0] - 1
        if not 0 <= position < keep_below:
            return None
        for later in (n for n in numbers if n >= number):
            first = slot + 1 if later == number else 0
            read += self._zero_after(self._fd(later), later, first)
        self.end = end
        return read

    def _zero_after(self, fd: int, number: int, first: int) -> int:
        """Zero the written entries of chunk ``number`` from slot ``first`` on;
        the bytes read to find them (only the last written block is read)."""
        start = HEADER_SIZE + first * ENTRY_SIZE
        data_end = HEADER_SIZE + self.entries_per_chunk * ENTRY_SIZE
        for offset, data in read_backwards(fd, start, data_end, ENTRY_SIZE):
            nonzero = len(data.rstrip(b"\x00"))
            if nonzero:
                used = offset + nonzero - start
                zeros = bytes(min(used, 1 << 20))
                for at in range(start, start + used, len(zeros)):
                    pwrite_all(fd, zeros[: start + used - at], at)
                self._dirty.add(number)
                return len(data)
        return 0

    def _find_end(self, fd: int, keep_below_position: int) -> tuple[int, int, int, bool]:
        """(kept, used, bytes read, suspect) for one chunk: ``used`` slots run up
        to its last non-zero byte, ``kept`` slots up to the last intact entry
        (searching back from there) that names a record before
        ``keep_below_position``. ``suspect`` says an entry passed over on the way
        may have been one of those (it fails its checksum, or is an older entry
        without one): the caller then looks for its record in the log.

        The answer of a scan of the whole chunk, from reading only its written
        parts from the end back (holes are skipped unread): the entries after
        the checkpoint, plus the rest of their block, not the chunk's capacity.
        """
        used: int | None = None
        read = 0
        suspect = False
        data_end = HEADER_SIZE + self.entries_per_chunk * ENTRY_SIZE
        for offset, data in read_backwards(fd, HEADER_SIZE, data_end, ENTRY_SIZE):
            read += len(data)
            nonzero = len(data.rstrip(b"\x00"))
            if not nonzero:
                continue
            first_slot = (offset - HEADER_SIZE) // ENTRY_SIZE
            slots = (nonzero + ENTRY_SIZE - 1) // ENTRY_SIZE
            if used is None:
                used = first_slot + slots
            for slot in range(slots - 1, -1, -1):
                at = slot * ENTRY_SIZE
                if entry_damaged(data, at):
                    suspect = True
                    continue
                position = _POSITION.unpack_from(data, at)[0] - 1
                if 0 <= position < keep_below_position:
                    return first_slot + slot + 1, used, read, suspect
                unchecked = not any(data[at + _AT_CRC : at + ENTRY_SIZE])  # an older entry
                suspect = suspect or (position >= 0 and unchecked)
        return 0, used or 0, read, suspect

    def truncate(self, offset: int) -> None:
        """Zero the entries of ``[offset, end)`` and make ``offset`` the end."""
        if offset < self.end:
            self._write_all(offset, memoryview(bytes((self.end - offset) * ENTRY_SIZE)))
            self.end = offset

    def delete_chunks_below(self, log_start: int, *, find_earliest: bool = True) -> int:
        """Delete index chunks whose every entry points below ``log_start``; update
        ``earliest`` (unless not ``find_earliest``: the caller knows it).
        Returns the number of chunks deleted."""
        deleted = 0
        numbers = self.chunk_numbers()
        for number in numbers[:-1]:  # the chunk holding `end` is never deleted
            last = (number + 1) * self.entries_per_chunk - 1
            if last >= self.end or entry_damaged(self.read_raw(last, 1)):
                break  # a damaged position must not delete entries still needed
            if self.entry(last)[0] - 1 >= log_start:
                break
            self._close_chunk(number)
            self._path(number).unlink()
            self._numbers = None
            deleted += 1
        if self.end > self.earliest and find_earliest:
            lo = max(self.earliest, self.chunk_numbers()[0] * self.entries_per_chunk)
            self.earliest = self.first_offset_where(lo, 0, log_start + 1)
        return deleted

    def _close_chunk(self, number: int) -> None:
        fd = self._fds.pop(number, None)
        self._dirty.discard(number)
        if self._files is not None:
            self._files.closed(self, number)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self.sync()
        for number in list(self._fds):
            self._close_chunk(number)

    def release(self) -> None:
        """Close every file without syncing."""
        for number in list(self._fds):
            self._close_chunk(number)

    def destroy(self) -> None:
        """Close and delete every file of this index (topic deletion)."""
        self.release()
        shutil.rmtree(self.directory, ignore_errors=True)
