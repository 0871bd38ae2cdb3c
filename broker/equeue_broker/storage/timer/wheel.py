"""The timer index on disk: a wheel of 1-second slots over an append-only timer log.

Derived state (like the queue indexes): rebuilt from the message log after
the checkpoint, never trusted beyond it. Memory does not grow with the number
of pending delayed records: the wheel and the entries are files, read with
``pread``; what stays in memory is the slots changed since the last
checkpoint (``_dirty``) and a few numbers per timer log segment.

Files, in ``<data_dir>/timer/`` (all integers little-endian)::

    wheel           SLOTS u64: slot s (= due_ms // 1000 % SLOTS) holds the
                    number + 1 of the newest entry of its chain, 0 for none.
                    A sparse file; SLOTS covers 367 days, so entries of one
                    slot normally share one second (others are skipped).
                    Written only at checkpoints, after the timer log is
                    fsynced: a head on disk never names a lost entry.
    <n:09d>.tlog    timer log segment n: entries n * SEGMENT_ENTRIES on,
                    ENTRY_SIZE (32) bytes each:
                      due_ms   u64
                      target   u64   log position of the delayed record;
                                     bit 63 set: a cancel of it
                      prev     u64   number + 1 of the previous (older) entry
                                     of the same slot, 0 for none
                      topic_id u32   crc32c of the topic name (stats only)
                      crc      u32   crc32c of the 28 bytes before it

An entry is either an *add* (a delayed record to deliver at ``due_ms``) or a
*cancel*. A cancel kills the adds of its target that are older (lower
numbers); an add written after a cancel (a replica that cut the cancel off
adds its record again) is alive. Several adds of one target are one record
(recovery adds what it finds after the checkpoint again).

At open, a segment missing or shorter than the checkpoint's count says
means a damaged index: it is rebuilt from the whole log (recovery.py). The
entries from the checkpoint's count on are kept while their checksums hold
(a process killed after the checkpoint left them; they repeat what the scan
adds again); the first bad one ends the log. At a checkpoint, the oldest
segments whose entries are all due before the timer watermark go (the
checkpoint names the oldest entry kept, "first");
a chain that reaches a deleted segment ends there.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from equeue_proto.accel import CODEC

SLOTS = 367 * 86400
ENTRY = struct.Struct("<QQQII")
ENTRY_SIZE = ENTRY.size
SEGMENT_ENTRIES = 1 << 20
CANCEL_BIT = 1 << 63
_FIELDS = struct.Struct("<QQQI")
_CRC = struct.Struct("<I")
_timer_entries_c: Callable[..., bytearray] | None = CODEC.timer_entries if CODEC else None
_READ_SLOTS = 1 << 16
"""Wheel slots read in one ``pread`` while looking for the next busy slot."""


@dataclass(frozen=True, slots=True)
class Entry:
    number: int
    due_ms: int
    target: int
    cancel: bool
    topic_id: int


def slot_of(due_ms: int) -> int:
    return (due_ms // 1000) % SLOTS


def topic_id(topic: str) -> int:
    return crc32c(topic.encode())


class Wheel:
    """The wheel file and timer log segments of one store (engine lock held,
    except ``write_heads`` and ``sync``, which checkpoints call outside it)."""

    def __init__(
        self, directory: Path, count: int | None, max_due: dict[int, int] | None = None,
        first: int = 0, segment_entries: int = SEGMENT_ENTRIES,
    ) -> None:  # fmt: skip
        """Open (or create) the index in ``directory``; ``count``: the number of
        entries the checkpoint says are durable (None: start empty), ``max_due``
        its latest due time per segment, ``first`` its oldest entry kept."""
        self.directory = directory
        self.segment_entries = segment_entries
        if count is None and directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._wheel_fd = os.open(directory / "wheel", os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._wheel_fd).st_size < SLOTS * 8:
            os.ftruncate(self._wheel_fd, SLOTS * 8)
        # A shared map of the file: page cache (RssFile), not the process's
        # anonymous memory. Heads are written into it at checkpoints only.
        self._map = mmap.mmap(self._wheel_fd, SLOTS * 8)
        self._heads = memoryview(self._map).cast("Q")
        self._segments: dict[int, int] = {}
        """Open segment fds by number."""
        self.max_due: dict[int, int] = dict(max_due or {}) if count is not None else {}
        """Latest due time of each segment's entries."""
        numbers = sorted(int(p.stem) for p in directory.glob("*.tlog"))
        self.first = first if count is not None else 0
        """Number of the oldest entry kept (chains end below it)."""
        for number in [n for n in numbers if n < self.first // self.segment_entries]:
            self._segment_path(number).unlink()  # the checkpoint let it go
            numbers.remove(number)
        self.count = max(count or 0, self.first)
        self._dirty: dict[int, int] = {}
        self._flushing: dict[int, int] = {}
        self._synced: set[int] = set()
        self._cache: tuple[int, int, list[Entry]] | None = None
        """(second, head, entries) of the last chain read."""
        for number in numbers:
            self._segments[number] = os.open(self._segment_path(number), os.O_RDWR)
        self.intact = self._covers(self.count)
        """Every entry the checkpoint counts is in the files (else: rebuild)."""
        if self.intact:
            self._recover_tail()

    def _covers(self, count: int) -> bool:
        """The segment files hold the entries [first, count)."""
        for segment in range(self.first // self.segment_entries, -(-count // self.segment_entries)):
            fd = self._segments.get(segment)
            need = min(count - segment * self.segment_entries, self.segment_entries) * ENTRY_SIZE
            if fd is None or os.fstat(fd).st_size < need:
                return False
        return True

    def _segment_path(self, number: int) -> Path:
        return self.directory / f"{number:09d}.tlog"

    def _recover_tail(self) -> None:
        """Keep the entries past ``count`` while their checksums hold."""
        while True:
            raw = self._pread_entry(self.count)
            if raw is None or crc32c(raw[:28]) != ENTRY.unpack(raw)[4]:
                break
            self._note_due(self.count, ENTRY.unpack(raw)[0])
            self.count += 1
        segment = self.count // self.segment_entries
        fd = self._segments.get(segment)
        if fd is not None:
            os.ftruncate(fd, (self.count % self.segment_entries) * ENTRY_SIZE)
        for number in [n for n in self._segments if n > segment]:
            os.close(self._segments.pop(number))
            self._segment_path(number).unlink()

    def _note_due(self, number: int, due_ms: int) -> None:
        segment = number // self.segment_entries
        self.max_due[segment] = max(self.max_due.get(segment, 0), due_ms)

    def _fd(self, segment: int) -> int:
        fd = self._segments.get(segment)
        if fd is None:
            fd = os.open(self._segment_path(segment), os.O_RDWR | os.O_CREAT, 0o600)
            self._segments[segment] = fd
        return fd

    def read_entries(self, number: int, n: int) -> list[Entry]:
        """Up to ``n`` entries from ``number`` on, within its segment."""
        fd = self._segments.get(number // self.segment_entries)
        if fd is None:
            return []
        at = number % self.segment_entries
        n = min(n, self.segment_entries - at, self.count - number)
        raw = os.pread(fd, n * ENTRY_SIZE, at * ENTRY_SIZE) if n > 0 else b""
        out = []
        for i, (due_ms, target, _prev, topic, _crc) in enumerate(ENTRY.iter_unpack(raw)):
            cancel = bool(target & CANCEL_BIT)
            out.append(Entry(number + i, due_ms, target & ~CANCEL_BIT, cancel, topic))
        return out

    def _pread_entry(self, number: int) -> bytes | None:
        fd = self._segments.get(number // self.segment_entries)
        if fd is None:
            return None
        raw = os.pread(fd, ENTRY_SIZE, (number % self.segment_entries) * ENTRY_SIZE)
        return raw if len(raw) == ENTRY_SIZE else None

    # -- writing ---------------------------------------------------------------------

    def add(self, items: Sequence[tuple[int, int, int]], cancel: bool = False) -> None:
        """Append an entry per (due_ms, target, topic_id) (lock held)."""
        done = 0
        while done < len(items):  # a run per segment
            room = self.segment_entries - self.count % self.segment_entries
            run = items[done : done + room]
            start = self.count
            self._write(start, self._entries(run, cancel), max(d for d, _, _ in run))
            done += len(run)

    def add_topic(self, dues: Sequence[int], targets: Sequence[int], topic: int) -> None:
        """``add`` for records of one topic (an append): the C codec builds the
        entries where it is built."""
        if _timer_entries_c is None:
            self.add([(d, t, topic) for d, t in zip(dues, targets, strict=True)])
            return
        done = 0
        while done < len(dues):  # a run per segment
            room = self.segment_entries - self.count % self.segment_entries
            run_dues = dues[done : done + room]
            start = self.count
            data = _timer_entries_c(
                run_dues, targets[done : done + room], topic, False, self.first, start,
                self._dirty, self._flushing, self._map, SLOTS,
            )  # fmt: skip
            self.count += len(run_dues)
            self._write(start, data, max(run_dues))
            done += len(run_dues)

    def _entries(self, items: Sequence[tuple[int, int, int]], cancel: bool) -> bytearray:
        """The entries of ``items``, chained to their slots' heads (which move)."""
        buffer = bytearray()
        dirty, flushing, heads = self._dirty, self._flushing, self._heads
        flag = CANCEL_BIT if cancel else 0
        pack, crc, first, count = _FIELDS.pack, _CRC.pack, self.first, self.count
        for due_ms, target, topic in items:
            slot = due_ms // 1000 % SLOTS
            prev = dirty.get(slot) or flushing.get(slot) or heads[slot]
            packed = pack(due_ms, target | flag, prev if prev > first else 0, topic)
            buffer += packed
            buffer += crc(crc32c(packed))
            count += 1
            dirty[slot] = count
        self.count = count
        return buffer

    def _write(self, start: int, data: bytes | bytearray, latest: int) -> None:
        segment = start // self.segment_entries
        self.max_due[segment] = max(self.max_due.get(segment, 0), latest)
        os.pwrite(self._fd(segment), data, (start % self.segment_entries) * ENTRY_SIZE)
        self._synced.discard(segment)

    # -- reading ---------------------------------------------------------------------

    def head(self, slot: int) -> int:
        """Number + 1 of the newest entry of ``slot`` (0: none)."""
        head = self._dirty.get(slot)
        if head is None:
            head = self._flushing.get(slot)
        if head is None:
            head = self._heads[slot]
        return head if head > self.first else 0

    def busy_seconds(self, first_sec: int, last_sec: int) -> Iterator[int]:
        """The seconds in [first_sec, last_sec] whose slot has a chain."""
        sec = first_sec
        while sec <= last_sec:
            slot = sec % SLOTS
            n = min(_READ_SLOTS, last_sec - sec + 1, SLOTS - slot)
            marked = {s - slot for s in (*self._dirty, *self._flushing) if slot <= s < slot + n}
            data = self._map[slot * 8 : (slot + n) * 8]
            if data.count(0) != len(data):  # some heads on disk
                heads = memoryview(data).cast("Q")
                marked.update(i for i in range(n) if heads[i])
            for i in sorted(marked):
                if self.head(slot + i):
                    yield sec + i
            sec += n

    def chain(self, sec: int, *, keep: bool = True, limit: int | None = None) -> list[Entry]:
        """The entries of second ``sec``, newest first. The last chain read with
        ``keep`` is kept: the timer reads the current second's every tick, and a
        chain only grows at its head, so only the entries added since are read.
        ``limit``: read at most that many entries (then the list is partial)."""
        out: list[Entry] = []
        head = number_plus_one = self.head(sec % SLOTS)
        known = self._cache if self._cache is not None and self._cache[0] == sec else None
        while number_plus_one > self.first and (limit is None or len(out) < limit):
            if known is not None and number_plus_one == known[1]:
                out.extend(e for e in known[2] if e.number >= self.first)
                break
            number = number_plus_one - 1
            raw = self._pread_entry(number)
            if raw is None:
                break
            due_ms, target, prev, topic, _crc = ENTRY.unpack(raw)
            if due_ms // 1000 == sec:
                out.append(
                    Entry(number, due_ms, target & ~CANCEL_BIT, bool(target & CANCEL_BIT), topic)
                )
            number_plus_one = prev
        if keep:
            self._cache = (sec, head, out)
        return out

    # -- checkpoints -----------------------------------------------------------------

    def take_dirty(self) -> tuple[int, dict[int, int]]:
        """(entry count, heads changed) for a checkpoint (lock held). Checkpoints
        run one at a time (``Timer.persist_lock``); heads a failed one did not
        write are written with these."""
        dirty, self._dirty = self._dirty, {}
        if self._flushing:
            dirty = {**self._flushing, **dirty}
        self._flushing = dirty
        return self.count, dirty

    def write_heads(self, dirty: dict[int, int]) -> None:
        """Make the entries durable, then the heads ``dirty`` names (outside
        the lock: what ``take_dirty`` moved stays readable meanwhile)."""
        for segment, fd in list(self._segments.items()):
            if segment not in self._synced:
                os.fsync(fd)
                self._synced.add(segment)
        heads = self._heads
        for slot, head in dirty.items():
            heads[slot] = head
        if dirty:
            self._map.flush()
            os.fsync(self._wheel_fd)

    def written(self, dirty: dict[int, int]) -> None:
        """The heads of ``dirty`` (the last ``take_dirty``) are on disk (lock held)."""
        if self._flushing is dirty:
            self._flushing = {}

    def first_after(self, through_due: int) -> int:
        """The oldest entry kept once the oldest segments whose entries are all
        due before ``through_due`` go (never the one being written)."""
        first = self.first
        active = self.count // self.segment_entries
        for segment in range(self.first // self.segment_entries, active):
            if self.max_due.get(segment, 1 << 62) >= through_due:
                break
            first = (segment + 1) * self.segment_entries
        return first

    def delete_below(self, first: int) -> None:
        """Delete the segments below entry ``first`` (a saved checkpoint's)."""
        for segment in [s for s in self._segments if s < first // self.segment_entries]:
            os.close(self._segments.pop(segment))
            with contextlib.suppress(FileNotFoundError):
                self._segment_path(segment).unlink()
            self.max_due.pop(segment, None)
        self.first = max(self.first, first)

    def close(self) -> None:
        self._heads.release()
        self._map.close()
        for fd in self._segments.values():
            os.close(fd)
        self._segments.clear()
        os.close(self._wheel_fd)
