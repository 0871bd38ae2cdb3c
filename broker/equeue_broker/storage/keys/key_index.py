"""The key index on disk: per time window, hash slots over checksummed entries.

Derived state, like the queue and timer indexes: every record's keys (its key
and the keys of its ``keys`` header, frames.py) are indexed where the record
is written (plain, staged and delayed records alike; a query decides
visibility), from the bytes in hand: ``LogWriter`` after each write, a
replica's ``append_at`` from the copied bytes, recovery from its scan. So a
replica derives the same index from the same bytes, and a lost or damaged
index is rebuilt from the log. RocketMQ's IndexFile is the model (hash slots
and chained entries per file); the hash is 64 bits wide (fewer chain hits to
verify), times are in ms and each entry is checksummed.

Files, in ``<data_dir>/keys/`` (all integers little-endian)::

    <n:09d>.kidx   window n (n increasing); sparse, written with pwrite
      header  64 B   magic "EQKEYIX1" | version u32 (1) | slots u32 | capacity u32
                     | sealed u32 | first_position u64 | end_position u64
                     | begin_ms i64 | end_ms i64 | entries u32 | crc32c u32 of
                     bytes 0..59
      slots   slots x u32: number + 1 of the newest entry whose hash falls in
                     the slot, 0 for none
      entries capacity x 32 B, entry i at 64 + slots * 4 + i * 32:
                     key_hash u64   hash64(topic, key) (below)
                     position u64   log position of the record
                     delta_ms u32   store_ms - begin_ms
                     prev     u32   number + 1 of the previous (older) entry
                                    of the same slot, 0 for none
                     topic_id u32   crc32c(topic) (a cheap pre-check)
                     crc      u32   crc32c of the 28 bytes before it

    hash64(topic, key) = crc32c(topic 0x00 key) << 32 | murmur2(topic 0x00 key)
                         (murmur2: 32 bits, seed 0x9747b28c, as Kafka's)
    slot = key_hash % slots

A window is sealed (header rewritten with ``sealed`` 1, its counts and ranges)
and the next one started when it is full, or when its store time span reaches
``window_ms``: a time query skips windows by range, retention drops whole
windows whose records the log no longer holds (``drop_below``). Entries lie in
log position order within a window and across windows.

Durability follows the timer wheel's rule: entries are pwritten with each
write under the engine lock; the slot array of the active window is a shared
map of its file, fsynced (with the entries) at checkpoints only, where
``checkpoint.json`` records ``"keys"``: every window's numbers and the active
window's entry count as of the checkpoint's log position (every entry of a
record below it, none after). At open (``restore``) entries past that count
are dropped and slots naming them are relinked from the entries kept, then the
recovery scan adds the records after the checkpoint again. A window file
missing, a header failing its checksum or disagreeing with the checkpoint: the
whole index is rebuilt from the log start (logged ``KEY INDEX REBUILT``); an
entry failing its checksum at query time does the same.

Memory: the active window's slot map (``slot_count`` x 4 B of page cache) and
a few numbers per window. Disk: bounded by the log's retention.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crc32c import crc32c

from equeue_broker.storage.config import KeyIndexConfig
from equeue_broker.storage.errors import ChunkQuarantined
from equeue_broker.storage.keys.keyhash import any_above, hash64_joined, key_entries, key_relink
from equeue_broker.storage.log.chunk import data_extents
from equeue_broker.storage.log.message_log import MessageLog

log = logging.getLogger(__name__)

MAGIC = b"EQKEYIX1"
VERSION = 1
HEADER = struct.Struct("<8sIIIIQQqqII")
HEADER_SIZE = HEADER.size
ENTRY = struct.Struct("<QQIIII")
ENTRY_SIZE = ENTRY.size
SUFFIX = ".kidx"
SLOTS_EVERY_S = 10.0
"""How often a checkpoint writes the active window's slot pages (random keys
dirty them all: 16 MiB at the default size); recovery relinks what came after
from the entries (C, one pass over them)."""
PAGE_SLOTS = 1024
"""Slots per 4 KiB page (the dirty map's unit)."""
_READ_ENTRIES = 1 << 16
"""Entries read in one pread while relinking or rebuilding."""
_ENTRY_FIELDS = struct.Struct("<QQIII")


@dataclass(frozen=True, slots=True)
class Persist:
    """What a checkpoint writes of the key index (``KeyIndex.persist``)."""

    fds: list[int]
    """Window files written since the last checkpoint (dup'ed: a window
    dropped meanwhile is still fsynced harmlessly)."""
    slots_fd: int
    pages: list[tuple[int, bytes]]
    """(file offset, bytes) of the active window's changed slot pages."""
    window: Window | None
    generation: int = 0
    """``window.slot_generation`` when the pages were copied: if it changed
    (the window was sealed, or reloaded), the pages are stale: not written."""


class KeyIndexDamaged(Exception):
    """A window file or entry fails its checks: the index must be rebuilt."""


@dataclass(slots=True)
class WindowHeader:
    """The fields of a window file's header."""

    slots: int
    capacity: int
    sealed: bool
    first_position: int
    end_position: int
    begin_ms: int
    end_ms: int
    entries: int


def encode_header(h: WindowHeader) -> bytes:
    raw = HEADER.pack(
        MAGIC, VERSION, h.slots, h.capacity, int(h.sealed), h.first_position,
        h.end_position, h.begin_ms, h.end_ms, h.entries, 0,
    )  # fmt: skip
    return raw[:60] + struct.pack("<I", crc32c(raw[:60]))


def decode_header(raw: bytes) -> WindowHeader:
    """The header of ``raw`` (64 bytes); ``KeyIndexDamaged`` if it fails a check."""
    if len(raw) != HEADER_SIZE:
        raise KeyIndexDamaged(f"header of {len(raw)} bytes")
    magic, version, slots, capacity, sealed, first, end, begin, end_ms, entries, crc = (
        HEADER.unpack(raw)
    )
    if crc != crc32c(raw[:60]):
        raise KeyIndexDamaged("header checksum mismatch")
    if magic != MAGIC or version != VERSION or sealed > 1 or entries > capacity:
        raise KeyIndexDamaged(f"bad header (magic {magic!r}, version {version})")
    return WindowHeader(slots, capacity, bool(sealed), first, end, begin, end_ms, entries)


def encode_entry(key_hash: int, position: int, delta_ms: int, prev: int, topic: int) -> bytes:
    raw = _ENTRY_FIELDS.pack(key_hash, position, delta_ms, prev, topic)
    return raw + crc32c(raw).to_bytes(4, "little")


def decode_entry(raw: bytes | memoryview) -> tuple[int, int, int, int, int]:
    """(key_hash, position, delta_ms, prev, topic_id); ``KeyIndexDamaged`` on a bad crc."""
    key_hash, position, delta, prev, topic, crc = ENTRY.unpack(raw)
    if crc != crc32c(bytes(raw[:28])):
        raise KeyIndexDamaged(f"entry checksum mismatch (position {position})")
    return key_hash, position, delta, prev, topic


def hash64(topic: bytes, key: bytes) -> int:
    """hash64(topic, key) of the format (C when built: keyhash.py)."""
    return hash64_joined(b"%s\x00%s" % (topic, key))


def topic_id(topic: bytes) -> int:
    return crc32c(topic)


class Window:
    """One window file: its fd, numbers, and (while active) its slot map."""

    def __init__(self, directory: Path, number: int, slots: int, capacity: int) -> None:
        self.number = number
        self.path = directory / f"{number:09d}{SUFFIX}"
        self.slot_count = slots
        self.capacity = capacity
        self.header = WindowHeader(slots, capacity, False, 0, 0, 0, 0, 0)
        self.count = 0
        self.fd = -1
        self._memory: bytearray | None = None
        self.slots: memoryview | None = None
        """The active window's slot array (anonymous memory: huge pages, no page
        faults on the write path), written to the file at checkpoints."""
        self.dirty = bytearray(-(-slots // PAGE_SLOTS))
        """One byte per 4 KiB page of slots: changed since last written."""
        self.slots_count = 0
        """The entry count the slot array in the file is (at least) as of."""
        self.slot_generation = 0
        """Bumped whenever the whole slot array is written (sealing) or reloaded
        from the file: a checkpoint's pages copied before are stale then."""
        self.slot_lock = threading.Lock()
        """Orders a checkpoint's page writes (``KeyIndex.persist``, outside the
        engine lock) against sealing's full write: never old pages over new."""

    @property
    def entries_at(self) -> int:
        return HEADER_SIZE + self.slot_count * 4

    def create(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(self.fd, self.entries_at + self.capacity * ENTRY_SIZE)
        self.write_header()
        self._memory = bytearray(self.slot_count * 4)
        self.slots = memoryview(self._memory).cast("I")

    def open(self) -> WindowHeader:
        """Open an existing file and check its header (``KeyIndexDamaged``)."""
        try:
            self.fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            raise KeyIndexDamaged(f"{self.path.name} is missing") from None
        header = decode_header(os.pread(self.fd, HEADER_SIZE, 0))
        if header.slots != self.slot_count or header.capacity != self.capacity:
            raise KeyIndexDamaged(f"{self.path.name}: slots/capacity differ from the settings")
        if os.fstat(self.fd).st_size < self.entries_at + self.capacity * ENTRY_SIZE:
            raise KeyIndexDamaged(f"{self.path.name} is short")
        return header

    def load_slots(self) -> None:
        """Read the slot array from the file (the window becomes the active one)."""
        memory = bytearray(self.slot_count * 4)
        with self.slot_lock:
            self.slot_generation += 1  # pages a checkpoint copied before are stale
        view = memoryview(memory)  # read in place: no 16 MiB copy per start
        for start, end in data_extents(self.fd, HEADER_SIZE, HEADER_SIZE + len(memory)):
            done = start
            while done < end:
                upto = min(end, done + (1 << 24)) - HEADER_SIZE
                read = os.preadv(self.fd, [view[done - HEADER_SIZE : upto]], done)
                if not read:
                    break
                done += read
        self._memory = memory
        self.slots = memoryview(memory).cast("I")

    def names_past(self, count: int) -> bool:
        """Whether a slot head names an entry after the first ``count``."""
        assert self._memory is not None
        return any_above(self._memory, count)

    def dirty_pages(self) -> list[tuple[int, bytes]]:
        """(file offset, bytes) of the slot pages changed since the last call."""
        memory = self._memory
        if memory is None:
            return []
        pages = []
        page_bytes = PAGE_SLOTS * 4
        at = self.dirty.find(1)
        while at >= 0:
            start = at * page_bytes
            pages.append((HEADER_SIZE + start, bytes(memory[start : start + page_bytes])))
            self.dirty[at] = 0
            at = self.dirty.find(1, at + 1)
        return pages

    def write_slots(self) -> None:
        """Write the slot pages changed to the file (closing)."""
        with self.slot_lock:
            for offset, page in self.dirty_pages():
                os.pwrite(self.fd, page, offset)
        self.slots_count = self.count

    def write_all_slots(self) -> None:
        """Write the whole slot array to the file (sealing): a page a checkpoint
        copied earlier and writes later must not land over it (``slot_lock``,
        ``slot_generation``)."""
        assert self._memory is not None
        with self.slot_lock:
            self.slot_generation += 1
            done, size = 0, len(self._memory)
            view = memoryview(self._memory)
            while done < size:
                done += os.pwrite(self.fd, view[done : done + (1 << 24)], HEADER_SIZE + done)
            self.dirty[:] = bytes(len(self.dirty))
        self.slots_count = self.count

    def unmap(self) -> None:
        """Drop the slot array from memory (reads go to the file)."""
        if self.slots is not None:
            self.slots.release()
            self.slots = None
        self._memory = None

    def write_header(self) -> None:
        self.header.entries = self.count
        os.pwrite(self.fd, encode_header(self.header), 0)

    def head(self, slot: int) -> int:
        if self.slots is not None:
            return int(self.slots[slot])
        return int.from_bytes(os.pread(self.fd, 4, HEADER_SIZE + slot * 4), "little")

    def entry(self, number: int) -> tuple[int, int, int, int, int]:
        """Entry ``number`` (0-based), checked."""
        raw = os.pread(self.fd, ENTRY_SIZE, self.entries_at + number * ENTRY_SIZE)
        if len(raw) != ENTRY_SIZE:
            raise KeyIndexDamaged(f"{self.path.name}: entry {number} missing")
        return decode_entry(raw)

    def write_entries(self, first: int, data: bytes | bytearray) -> None:
        os.pwrite(self.fd, data, self.entries_at + first * ENTRY_SIZE)

    def relink(self, start: int = 0) -> None:
        """Make the slot heads those after entries [0, count), given heads as
        of entry ``start`` (0: from nothing; one C call per piece read)."""
        assert self._memory is not None and self.slots is not None
        if start == 0:
            self._memory[:] = bytes(len(self._memory))
            self.dirty[:] = b"\x01" * len(self.dirty)
        done = start
        while done < self.count:
            n = min(_READ_ENTRIES, self.count - done)
            raw = os.pread(self.fd, n * ENTRY_SIZE, self.entries_at + done * ENTRY_SIZE)
            if len(raw) != n * ENTRY_SIZE:
                raise KeyIndexDamaged(f"{self.path.name}: entries before {self.count} missing")
            key_relink(raw, done, self.slots, self.dirty)
            done += n

    def cut_entries(self, count: int) -> None:
        """Keep entries [0, count): the rest become zeros (sparse again)."""
        self.count = count
        size = self.entries_at + self.capacity * ENTRY_SIZE
        os.ftruncate(self.fd, self.entries_at + count * ENTRY_SIZE)
        os.ftruncate(self.fd, size)

    def close(self) -> None:
        self.unmap()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def describe(self) -> list[int]:
        h = self.header
        return [self.number, h.first_position, h.end_position, h.begin_ms, h.end_ms,
                self.count, int(h.sealed)]  # fmt: skip


class KeyIndex:
    """The key index of one store (engine lock held, except ``persist``)."""

    def __init__(self, directory: Path, config: KeyIndexConfig) -> None:
        self.directory = directory
        self.config = config
        self.windows: list[Window] = []
        self._unsynced: set[int] = set()
        self._slots_written = time.monotonic()
        self._next_number = 0
        """The number of the first window when none is open: after a reset,
        past every number used before, so that a checkpoint taken before it
        never names a window of the rebuilt index."""
        self.rebuilds = 0
        self.generation = 0
        """Bumped whenever windows are dropped, cut or closed: a query walking
        in chunks (lock released between them) stops if it changed, rather
        than read a window freed meanwhile (query.py)."""

    @property
    def active(self) -> Window | None:
        return self.windows[-1] if self.windows else None

    # -- open ------------------------------------------------------------------------

    def restore(self, doc: dict[str, Any] | None) -> bool:
        """Open the windows the checkpoint's ``doc`` names, as of its position;
        False (nothing open) when that is impossible: rebuild from the log."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if doc is None:
            return False
        try:
            self._restore(doc)
        except (KeyIndexDamaged, OSError, KeyError, TypeError, ValueError) as exc:
            log.warning("key index not usable (%s)", exc)
            self.close()
            return False
        return True

    def _restore(self, doc: dict[str, Any]) -> None:
        cfg = self.config
        described = [list(map(int, w)) for w in doc["windows"]]
        for i, (number, first, end, begin, end_ms, count, sealed) in enumerate(described):
            window = Window(self.directory, number, cfg.slot_count, cfg.entries_per_file)
            self.windows.append(window)
            header = window.open()
            last = i == len(described) - 1
            if sealed and not last and not header.sealed:
                raise KeyIndexDamaged(f"{window.path.name} is not sealed")
            if header.sealed and sealed and header.entries != count:
                raise KeyIndexDamaged(f"{window.path.name}: entries differ from the checkpoint")
            window.header = WindowHeader(
                cfg.slot_count, cfg.entries_per_file, bool(sealed and not last),
                first, end, begin, end_ms, count,
            )  # fmt: skip
            window.count = count
            if count:
                window.entry(count - 1)  # the last one kept must be intact
        known = {w.number for w in self.windows}
        for path in self.directory.glob(f"*{SUFFIX}"):
            if int(path.stem) not in known:  # after the checkpoint, or dropped
                path.unlink()
        active = self.active
        if active is not None:
            active.header.sealed = False
            active.load_slots()
            self._cut_active(active, active.count, min(int(doc.get("slots", 0)), active.count))

    def _cut_active(self, window: Window, count: int, slots_as_of: int = 0) -> None:
        """Make ``window`` (the active one) hold entries [0, count) exactly, its
        slot heads (as of entry ``slots_as_of`` or later) those of that count."""
        window.cut_entries(count)
        assert window.slots is not None
        with window.slot_lock:
            window.slot_generation += 1  # pages a checkpoint copied may name entries cut
        if window.names_past(count):  # heads of entries cut (or a crash's)
            slots_as_of = 0
        window.relink(slots_as_of)
        window.slots_count = slots_as_of  # the file's slots are as of it, or later
        window.write_header()
        self._unsynced.add(window.number)

    def reset(self) -> None:
        """Forget every window and delete the files (a rebuild follows)."""
        self.generation += 1
        used = [w.number for w in self.windows]
        if self.directory.exists():
            used += [int(p.stem) for p in self.directory.glob(f"*{SUFFIX}") if p.stem.isdigit()]
        self._next_number = max([self._next_number - 1, *used]) + 1
        self.close()
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    def rebuild(self, message_log: MessageLog, why: str) -> None:
        """Reset, then index every record of the log (lock held)."""
        log.warning("KEY INDEX REBUILT from the log (%s)", why)
        self.rebuilds += 1
        self.reset()
        self.index_log(message_log, message_log.start_position)

    def index_log(self, message_log: MessageLog, start: int) -> None:
        """Index the records of ``message_log`` from ``start`` (a record boundary)."""
        for chunk in list(message_log.chunks):
            chunk_start = message_log.start_of(chunk)
            end = chunk_start + chunk.data_size
            if end <= start:
                continue
            begin = max(start, chunk_start)
            try:
                data = message_log.copy(begin, end)
            except ChunkQuarantined:
                log.warning("key index: chunk %s is quarantined, not indexed", chunk.path.name)
                continue
            self.add_frames(data, begin)

    # -- writing ---------------------------------------------------------------------

    def add_frames(self, data: bytes | bytearray | memoryview, first_position: int) -> None:
        """Index the keys of the whole frames ``data``, which lie at log
        ``first_position`` (lock held): one C call per window (keyhash.py)."""
        done, size = 0, len(data)
        view = memoryview(data)
        while done < size:
            window = self.active
            if window is None:
                window = self._roll(first_position + done)
            assert window.slots is not None
            header = window.header
            entries, used, count, begin, first, end, end_ms = key_entries(
                view[done:], first_position + done, window.slots, window.dirty,
                window.count,
                window.capacity, header.begin_ms, self.config.window_ms,
                self.config.max_extra_keys,
            )  # fmt: skip
            if entries:
                window.write_entries(window.count, entries)
                if window.count == 0:
                    header.first_position = first
                header.begin_ms = begin
                header.end_position = end
                header.end_ms = max(header.end_ms, end_ms)
                window.count = count
                self._unsynced.add(window.number)
            done += used
            if done < size:  # the window is full, or its time span is reached
                if window.count == 0:
                    break  # cannot happen (an empty window takes any record): no loop
                self._roll(first_position + done)

    def _roll(self, position: int) -> Window:
        """Seal the active window and start the next."""
        active = self.active
        number = self._next_number
        if active is not None:
            active.write_all_slots()  # the slots before the header that says sealed
            active.header.sealed = True
            active.write_header()
            active.unmap()
            self._unsynced.add(active.number)
            number = max(active.number + 1, self._next_number)
        window = Window(self.directory, number, self.config.slot_count,
                        self.config.entries_per_file)  # fmt: skip
        window.create()
        window.header.first_position = position
        self.windows.append(window)
        self._unsynced.add(number)
        return window

    def truncate(self, position: int) -> None:
        """Drop every entry of a record at or after ``position`` (lock held)."""
        self.generation += 1
        while self.windows and self.windows[-1].header.first_position >= position:
            window = self.windows.pop()
            self._next_number = max(self._next_number, window.number + 1)  # never reused
            window.close()
            window.path.unlink(missing_ok=True)
            self._unsynced.discard(window.number)
        active = self.active
        if active is None:
            return
        if active.header.sealed:  # the window after it was cut: it is the active one again
            active.header.sealed = False
            active.load_slots()
            active.write_header()
            self._unsynced.add(active.number)
        if active.header.end_position <= position:
            return
        lo, hi = 0, active.count  # entries are in position order: the first at or after
        while lo < hi:
            mid = (lo + hi) // 2
            if active.entry(mid)[1] < position:
                lo = mid + 1
            else:
                hi = mid
        active.header.end_position = active.entry(lo - 1)[1] + 1 if lo else position
        self._cut_active(active, lo)

    def drop_below(self, log_start: int) -> int:
        """Delete the sealed windows whose records all lie below ``log_start``."""
        dropped = 0
        while len(self.windows) > 1 and self.windows[0].header.end_position <= log_start:
            window = self.windows.pop(0)
            self.generation += 1
            window.close()
            window.path.unlink(missing_ok=True)
            self._unsynced.discard(window.number)
            dropped += 1
        return dropped

    # -- checkpoints -----------------------------------------------------------------

    def checkpoint_state(self) -> tuple[dict[str, Any], Persist]:
        """(the checkpoint's "keys" document, what ``persist`` writes) (lock held):
        the files written since the last one; every ``SLOTS_EVERY_S``, also the
        active window's changed slot pages, as of now ("slots": the entry count
        the slot array in the file is as of, once persisted; recovery relinks
        the entries after it)."""
        fds = [os.dup(w.fd) for w in self.windows if w.number in self._unsynced]
        self._unsynced.clear()
        active = self.active
        pages: list[tuple[int, bytes]] = []
        slots_fd = -1
        generation = 0
        now = time.monotonic()
        if active is not None and now - self._slots_written >= SLOTS_EVERY_S:
            self._slots_written = now
            pages = active.dirty_pages()
            active.slots_count = active.count
            slots_fd = os.dup(active.fd)
            generation = active.slot_generation
        doc = {
            "windows": [w.describe() for w in self.windows],
            "slots": 0 if active is None else active.slots_count,
        }
        return doc, Persist(fds, slots_fd, pages, active, generation)

    @staticmethod
    def checkpoint_of(keys: KeyIndex | None) -> tuple[dict[str, Any] | None, Persist]:
        """``keys.checkpoint_state()``; nothing without a key index."""
        return (None, Persist([], -1, [], None)) if keys is None else keys.checkpoint_state()

    @staticmethod
    def persist(work: Persist) -> None:
        """Fsync the entries, then write and fsync the slot pages: a slot on
        disk never names an entry that is not (outside the lock)."""
        try:
            for fd in work.fds:
                os.fsync(fd)
            if work.slots_fd >= 0:
                KeyIndex._write_pages(work)
                os.fsync(work.slots_fd)
        except OSError:
            if work.window is not None and work.pages:  # written again next time
                work.window.dirty[:] = b"\x01" * len(work.window.dirty)
                work.window.slots_count = 0
            raise
        finally:
            for fd in [*work.fds, work.slots_fd]:
                if fd >= 0:
                    os.close(fd)

    @staticmethod
    def _write_pages(work: Persist) -> None:
        """Write the pages copied at the checkpoint, unless the window's whole
        slot array was written (sealed) or reloaded since: they would be older
        than the file's (a key query would miss entries for good)."""
        window = work.window
        assert window is not None
        with window.slot_lock:
            if window.slot_generation != work.generation:
                return
            for offset, page in work.pages:
                os.pwrite(work.slots_fd, page, offset)

    # -- reading ---------------------------------------------------------------------

    def candidates(self, topic: bytes, key: bytes, end_ms: int, max_entries: int) -> Iterator[int]:
        """Log positions whose entry matches ``topic`` and ``key``'s hash, newest
        first, in windows that begin before ``end_ms``; at most ``max_entries``
        entries walked. Resumed with the lock held; a caller that releases it
        between resumptions stops when ``generation`` changed meanwhile (a window
        walked may be gone). ``KeyIndexDamaged`` if an entry fails its check."""
        key_hash = hash64(topic, key)
        tid = topic_id(topic)
        walked = 0
        for window in reversed(list(self.windows)):  # a roll may append meanwhile
            if window.count == 0 or window.header.begin_ms >= end_ms:
                continue
            begin = window.header.begin_ms
            slot = key_hash % window.slot_count
            number = window.head(slot)
            while number:
                if number > window.count:
                    raise KeyIndexDamaged(f"{window.path.name}: slot names entry {number}")
                if walked >= max_entries:
                    raise ScanLimit
                walked += 1
                entry_hash, position, delta, prev, entry_topic = window.entry(number - 1)
                if prev >= number:
                    raise KeyIndexDamaged(f"{window.path.name}: entry {number} links forward")
                if entry_hash % window.slot_count != slot:  # a slot page over another's
                    raise KeyIndexDamaged(f"{window.path.name}: entry {number} in a wrong slot")
                if entry_hash == key_hash and entry_topic == tid and begin + delta < end_ms:
                    yield position
                number = prev

    def close(self, persist: bool = False) -> None:
        """Close every file; ``persist``: a clean close after the last checkpoint
        (nothing written since), which also writes the active window's slot
        pages, so a restart has no entries to relink."""
        self.generation += 1
        active = self.active
        if persist and active is not None:
            with contextlib.suppress(OSError):
                active.write_slots()
                os.fsync(active.fd)
        for window in self.windows:
            with contextlib.suppress(OSError):
                window.close()
        self.windows = []
        self._unsynced.clear()


class ScanLimit(Exception):
    """A query walked ``max_scan`` entries."""
