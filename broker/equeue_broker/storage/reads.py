"""Reads: messages and stored records of a queue, and lookups by position, time or size.

``store.reads`` (a ``Reads``) serves ``read``, ``read_records``,
``read_at_position``, ``record_at``, ``position_of``, ``visible_end``,
``offset_for_timestamp``, ``offset_for_bytes`` and ``store_time`` (``Store.read`` is the
documented embedding entry point for the first). Reads only look at the
engine state (engine.py) the write path and admin keep up to date (the log,
the queues' indexes and readable ends, the topics), which they are given,
and never at the store itself, which creates a ``Reads`` and exposes it.

Locking: every public method of ``Reads`` takes the engine lock itself, except
``visible_end`` (a lock-free snapshot for long polls). Every method whose name
starts with ``_`` must be called with the engine lock held (the entry points
among them assert it): the lock is what keeps the log's memory maps, and the
views of them a read returns, alive.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from collections.abc import Iterable
from typing import cast

from crc32c import crc32c

from equeue_broker.storage.engine import EngineState
from equeue_broker.storage.errors import (
    ChunkQuarantined,
    CorruptionError,
    DamagedRecord,
    InvalidArgument,
    NotFound,
)
from equeue_broker.storage.file_runs import FileRun, RunFiles, close_runs, piece_size
from equeue_broker.storage.index.index_repair import repair_entry
from equeue_broker.storage.index.queue_index import (
    ENTRY,
    ENTRY_SIZE,
    RUNS_DAMAGED,
    RUNS_EMPTY,
    RUNS_LIMIT,
    IndexEntry,
    entry_damaged,
    entry_unchecked,
    index_runs,
)
from equeue_broker.storage.index.queue_state import QueueState
from equeue_broker.storage.index_sizes import bytes_stop
from equeue_broker.storage.log.record import patch_committed
from equeue_broker.storage.read_filters import (
    SELECT_BATCH,
    SELECT_RUN_BYTES,
    TagFilter,
    Taken,
    before_damage,
    scan_limit,
    tag_filter,
    wanted_tags,
    with_tags,
)
from equeue_broker.storage.results import Framer, Piece, ReadResult, ReadStatus, RecordsResult
from equeue_proto.accel import CODEC
from equeue_proto.record import FLAG_CONTROL, FLAG_TXN, StoredMessage
from equeue_proto.selection import select_frames
from equeue_proto.selector import Selector

log = logging.getLogger(__name__)


class _Damaged(Exception):
    """A probed index entry failed its check (``offset``): rebuild it, search again."""

    def __init__(self, offset: int) -> None:
        super().__init__(offset)
        self.offset = offset


_MAX_REPAIRS = 256
"""Damaged index entries one read rebuilds (each restarts it) before giving up."""


class Reads:
    """The read paths over a store's log and queues (see the module docstring)."""

    def __init__(self, state: EngineState) -> None:
        """Reads of ``state`` (never changed here)."""
        self._state = state
        self._lock = state.lock
        self._config = state.config
        self._log = state.log
        self._queues = state.queues
        """The engine's own dictionary: read, never changed here."""

    def read(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_messages: int = 1000,
        max_bytes: int = 1 << 20,
        tags: Iterable[str] | None = None,
    ) -> ReadResult:
        """Read up to ``max_messages``/``max_bytes`` from ``offset`` (at least one
        message if any is available, even if larger than ``max_bytes``).

        With ``tags``, only messages carrying one of them are returned; skipped
        offsets still advance ``next_offset``.
        """
        self._check_read_limits(offset, max_messages, max_bytes)
        by_hash = tag_filter(tags)
        wanted = frozenset(t.decode() for ts in by_hash.values() for t in ts) if by_hash else None
        hashes = frozenset(by_hash) if by_hash else None
        with self._lock:
            queue, earliest, end, status, corrected = self._locate(topic, queue_id, offset)
            if status is not ReadStatus.OK:
                return ReadResult(status, [], corrected, earliest, end)
            for _ in range(_MAX_REPAIRS):
                collected = self._collect(
                    queue, offset=offset, end=end, max_messages=max_messages,
                    max_bytes=max_bytes, wanted=wanted, hashes=hashes,
                )  # fmt: skip
                if collected is not None:
                    messages, next_offset = collected
                    return ReadResult(ReadStatus.OK, messages, next_offset, earliest, end)
            raise _too_damaged(queue)

    def read_records(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_messages: int = 1000,
        max_bytes: int = 1 << 20,
        tags: Iterable[str] | None = None,
        frame: Framer | None = None,
        selector: Selector | None = None,
        until: int | None = None,
    ) -> RecordsResult:
        """Like ``read``, but return the records as stored (the record format of
        ``record.py``, concatenated) instead of decoding them.

        Records appended together lie next to each other in the log, so this
        copies whole runs: no Python object per message. It serves pulls.

        With ``frame``, ``records`` is ``prefix + records + suffix`` for the
        (prefix, suffix) that ``frame`` returns for the read: one copy from the
        log builds a caller's whole reply (the broker's pre-encoded PullReply).

        With ``selector`` (a filter expression, ``equeue_proto.selector``), only
        records for which it is TRUE are returned (and with ``tags`` too, only
        those that also carry one of them). A filtered read inspects at most
        ``max_filter_scan`` index entries and ``next_offset`` is past the last
        it inspected, so a selective filter still advances a consumer; the
        ``nbytes``/``count`` are the returned records', and ``next_offset -
        offset - count`` were inspected and left out. With ``until``, offsets
        from it on are neither inspected nor returned (a range read's end).
        """
        self._check_read_limits(offset, max_messages, max_bytes)
        # Expressions and tags run through C run by run, tag conditions included
        # (a per-record step in Python is many times slower); the index's tag-hash
        # skip serves ``tags`` alone without C, or naming the empty tag.
        if tags is not None and (selector is not None or CODEC is not None):
            combined = with_tags(selector, tags)
            selector, tags = (selector, tags) if combined is None else (combined, None)
        wanted = None if tags is None else wanted_tags(tags, selector)
        with self._lock:
            queue, earliest, end, status, corrected = self._locate(topic, queue_id, offset)
            if status is not ReadStatus.OK:
                pieces: list[Piece] = []
                count, nbytes, next_offset = 0, 0, corrected
            else:
                stop = end if until is None else max(offset, min(end, until))
                pieces, count, nbytes, next_offset = self._collect_repairing(
                    queue, offset, stop, max_messages, max_bytes, wanted, selector
                )
            result = RecordsResult(status, b"", count, next_offset, earliest, end, nbytes)
            if frame is not None:
                prefix, suffix = frame(result)
                pieces = [prefix, *pieces, suffix]
            # One copy out of the maps, made while the lock keeps them mapped.
            return dataclasses.replace(result, records=b"".join(pieces))

    def file_runs(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_messages: int = 1000,
        max_bytes: int = 1 << 20,
        frame: Framer | None = None,
        until: int | None = None,
    ) -> tuple[RecordsResult, list[bytes | FileRun]]:
        """``read_records`` without tags or selector, for ``sendfile`` (file_runs.py):
        the same planning, checks and ``RecordsResult`` (``records`` empty), and
        the reply in order as pieces: records as stored as ``FileRun``s (the caller
        closes them), the frame and records a reply changes (a transaction's) as bytes."""
        self._check_read_limits(offset, max_messages, max_bytes)
        with self._lock:
            queue, earliest, end, status, corrected = self._locate(topic, queue_id, offset)
            collected: list[Piece | FileRun] = []
            count, nbytes, next_offset = 0, 0, corrected
            if status is ReadStatus.OK:
                stop = end if until is None else max(offset, min(end, until))
                collected, count, nbytes, next_offset = self._runs_repairing(
                    queue, offset, stop, max_messages, max_bytes
                )
            result = RecordsResult(status, b"", count, next_offset, earliest, end, nbytes)
            try:  # views of the maps copied while the lock keeps them mapped
                pieces = [p if isinstance(p, (bytes, FileRun)) else bytes(p) for p in collected]
                prefix, suffix = (b"", b"") if frame is None else frame(result)
            except BaseException:
                close_runs(collected)  # no descriptor outlives a failed read
                raise
            return result, [prefix, *pieces, suffix] if frame is not None else pieces

    def _runs_repairing(
        self, queue: QueueState, offset: int, end: int, max_messages: int, max_bytes: int
    ) -> tuple[list[Piece | FileRun], int, int, int]:
        """``_collect_runs`` with file runs, again after each repaired entry (lock held)."""
        for _ in range(_MAX_REPAIRS):
            files = RunFiles()
            try:
                collected = self._collect_runs(
                    queue, offset=offset, end=end, max_messages=max_messages,
                    max_bytes=max_bytes, files=files,
                )  # fmt: skip
            except BaseException:  # every path that drops the runs closes them
                files.close()
                raise
            if collected is not None:
                return collected
            files.close()
        raise _too_damaged(queue)

    def _file_run(self, start: int, stop: int, files: RunFiles) -> FileRun | None:
        """``[start, stop)`` of the log (one chunk) as a file run, or None (lock held)."""
        chunk, local = self._log._data_view(start, stop - start)  # its checks, as copy()
        return files.run(chunk.fd, local, stop - start)

    def _locate(
        self, topic: str, queue_id: int, offset: int
    ) -> tuple[QueueState, int, int, ReadStatus, int]:
        """(queue, earliest, end, status, offset to report) of a read (lock held).

        Out-of-range offsets are answered with the earliest or the end."""
        assert self._state.held()
        queue = self._state.live_queue(topic, queue_id)
        earliest, end = queue.index.earliest, queue.visible_end
        if offset < earliest:
            return queue, earliest, end, ReadStatus.OFFSET_TOO_SMALL, earliest
        if offset > end:
            return queue, earliest, end, ReadStatus.OFFSET_TOO_BIG, end
        return queue, earliest, end, ReadStatus.OK, offset

    def _collect_repairing(  # noqa: PLR0917 (read_records' arguments, passed on)
        self, queue: QueueState, offset: int, end: int, max_messages: int, max_bytes: int,
        wanted: TagFilter | None, selector: Selector | None = None,
    ) -> tuple[list[Piece], int, int, int]:  # fmt: skip
        """``_collect_runs``, ``_collect_selected`` or ``_collect_filtered``, again
        after each damaged index entry they meet and have rebuilt (lock held)."""
        assert self._state.held()
        for _ in range(_MAX_REPAIRS):
            if wanted is None and selector is not None:
                collected = self._collect_selected(
                    queue, offset=offset, end=end, max_messages=max_messages,
                    max_bytes=max_bytes, selector=selector,
                )  # fmt: skip
            elif wanted is None:  # without files=True: pieces only
                collected = cast(
                    "tuple[list[Piece], int, int, int] | None",
                    self._collect_runs(
                        queue, offset=offset, end=end, max_messages=max_messages,
                        max_bytes=max_bytes,
                    ),
                )  # fmt: skip
            else:
                collected = self._collect_filtered(
                    queue, offset=offset, end=end, max_messages=max_messages,
                    max_bytes=max_bytes, wanted=wanted, selector=selector,
                )  # fmt: skip
            if collected is not None:
                return collected
        raise _too_damaged(queue)

    def _repair(self, queue: QueueState, offset: int) -> None:
        """Rebuild the damaged index entry of ``offset`` from the log (lock held;
        no view of the log may be alive: the scan may unmap chunks)."""
        assert self._state.held()
        key = (queue.topic, queue.queue_id)
        repair_entry(self._log, queue.index, key, offset, queue.index.end)

    def _collect_runs(
        self,
        queue: QueueState,
        *,
        offset: int,
        end: int,
        max_messages: int,
        max_bytes: int,
        files: RunFiles | None = None,
    ) -> tuple[list[Piece | FileRun], int, int, int] | None:
        """(pieces, count, bytes, next offset) of an unfiltered read (lock held):
        the index is planned into runs of adjacent records (``index_runs``, in C),
        and each run becomes one view of the log; no per-record Python work.
        None after rebuilding a damaged entry: the caller starts again."""
        pieces: list[Piece | FileRun] = []
        count = total = 0
        cursor = offset
        scan_end = min(end, offset + max_messages)
        capacity = self._log.capacity
        mapped_chunk = -1
        while cursor < scan_end and count < max_messages:
            entries = queue.index.read_raw(cursor, scan_end - cursor)
            runs, taken, count, total, stop = index_runs(
                entries, capacity, max_messages, max_bytes, count, total
            )
            for start, stop_at, first in runs:
                if start // capacity != mapped_chunk and pieces:
                    # Touching another chunk may unmap an older one, which
                    # must not have views alive: copy what we hold first.
                    pieces = [p if isinstance(p, FileRun) else bytes(p) for p in pieces]
                mapped_chunk = start // capacity
                if not self._log.record_is(
                    start, queue.topic_bytes, queue.queue_id, cursor + first
                ):  # (the caller closes the file runs made so far)
                    pieces.clear()
                    self._repair(queue, cursor + first)
                    return None
                bad = self._log.first_damaged(start, stop_at)
                run = entries[first * ENTRY_SIZE :]
                if bad is not None:
                    return self._served_before(queue, pieces, offset, cursor + first, run, bad)
                view = self._log.copy(start, stop_at)
                served = _served(view, run, cursor + first)
                run_file = files and served is view and self._file_run(start, stop_at, files)
                pieces.append(run_file or served)  # as stored: sent from the file itself
            cursor += taken
            if stop in {RUNS_EMPTY, RUNS_DAMAGED}:  # an empty entry below the end is damage too
                pieces.clear()
                self._repair(queue, cursor)
                return None
            if stop == RUNS_LIMIT or not entries:
                break
        return pieces, count, total, cursor

    def _served_before(  # noqa: PLR0917 (the state of _collect_runs at the damage)
        self, queue: QueueState, pieces: list[Piece | FileRun], offset: int, run_offset: int,
        run: bytes, bad: int,
    ) -> tuple[list[Piece | FileRun], int, int, int]:  # fmt: skip
        """An unfiltered read cut short before the damaged record at log position
        ``bad``, in the run of records whose entries are ``run`` (of offsets from
        ``run_offset``); ``DamagedRecord`` if the read would start with it."""
        damaged, start = run_offset, ENTRY.unpack_from(run)[0] - 1
        at = start
        for _position, size, _tag, _ts in ENTRY.iter_unpack(run):
            if at >= bad:
                break
            at, damaged = at + size, damaged + 1
        log.warning(
            "%s/%d offset %d: stored record fails its checksum",
            queue.topic,
            queue.queue_id,
            damaged,
        )
        if damaged == offset:  # (the caller closes the file runs)
            pieces.clear()
            raise DamagedRecord(
                queue.topic, queue.queue_id, damaged, self._log.chunk_path(bad), bad
            )
        if at > start:
            pieces.append(_served(self._log.copy(start, at), run, run_offset))
        return pieces, damaged - offset, sum(piece_size(p) for p in pieces), damaged

    def _collect_filtered(
        self, queue: QueueState, *, offset: int, end: int, max_messages: int, max_bytes: int,
        wanted: TagFilter, selector: Selector | None = None,
    ) -> tuple[list[Piece], int, int, int] | None:  # fmt: skip
        """``_collect_runs`` for a tag-filtered read: entry by entry, as skipped
        records break runs (scans at most ``max_filter_scan`` entries; lock held).
        A skip trusts the entry's tag hash, so each entry's checksum is checked
        first: None after rebuilding a damaged entry. With ``selector`` (whose
        tag prefilter ``wanted`` came from), a record of a wanted tag is also
        run through it."""
        out = bytearray()
        count = total = 0
        run_start = run_end = -1
        run_offset = run_next = -1  # the run's first offset, the offset that would extend it
        run_entries = bytearray()
        scan_end = min(end, offset + scan_limit(self._config.max_filter_scan, selector))
        cursor = offset
        capacity = self._log.capacity
        while cursor < scan_end and count < max_messages:
            raw = queue.index.read_raw(cursor, scan_end - cursor)
            if not raw:
                break
            for i, (position_plus_one, size, entry_hash, _ts) in enumerate(ENTRY.iter_unpack(raw)):
                position = position_plus_one - 1
                if position < 0 or entry_damaged(raw, i * ENTRY_SIZE):
                    self._repair(queue, cursor)
                    return None
                tag_hash = entry_hash
                if entry_unchecked(raw, i * ENTRY_SIZE):
                    # No checksum vouches for its tag hash: skip by the record's own
                    # tag, once its header says the entry points at the right record.
                    if not self._log.record_is(position, queue.topic_bytes, queue.queue_id, cursor):
                        self._repair(queue, cursor)
                        return None
                    tag = self._log.tag_at(position)
                    tag_hash = crc32c(tag) if tag else 0  # as index_repair.entry_for
                if tag_hash not in wanted or self._log.tag_at(position) not in wanted[tag_hash]:
                    cursor += 1
                    continue
                bad = self._log.first_damaged(position, position + size)
                if bad is not None:  # serve the records before it, else say which
                    if not count:
                        path = self._log.chunk_path(bad)
                        raise DamagedRecord(queue.topic, queue.queue_id, cursor, path, bad)
                    scan_end = cursor
                    break
                if selector is not None and not self._selected(
                    queue, selector, position, size, raw[i * ENTRY_SIZE : (i + 1) * ENTRY_SIZE],
                    cursor,
                ):  # fmt: skip
                    cursor += 1
                    continue
                if count and total + size > max_bytes:
                    scan_end = cursor  # stop both loops
                    break
                if position != run_end or position % capacity == 0 or cursor != run_next:
                    if run_end > run_start:  # a new run: serve the one before
                        out += _served(self._log.copy(run_start, run_end), run_entries, run_offset)
                    if not self._log.record_is(position, queue.topic_bytes, queue.queue_id, cursor):
                        self._repair(queue, cursor)
                        return None
                    run_start = run_end = position
                    run_offset = cursor
                    run_entries = bytearray()
                run_entries += raw[i * ENTRY_SIZE : (i + 1) * ENTRY_SIZE]
                run_next = cursor + 1
                run_end += size
                count += 1
                total += size
                cursor += 1
                if count >= max_messages:
                    break
        if run_end > run_start:
            out += _served(self._log.copy(run_start, run_end), run_entries, run_offset)
        return [out], count, total, cursor

    def _selected(  # noqa: PLR0917 (the record and its entry)
        self, queue: QueueState, selector: Selector, position: int, size: int, entry: bytes,
        offset: int,
    ) -> bool:  # fmt: skip
        """True if the (checked) record at ``position`` passes ``selector``, as
        served (a transaction's with its commit time)."""
        piece = _served(self._log.copy(position, position + size), entry, offset)
        spans, _ = select_frames(selector, piece, 1)
        return bool(spans)

    def _collect_selected(
        self, queue: QueueState, *, offset: int, end: int, max_messages: int, max_bytes: int,
        selector: Selector,
    ) -> tuple[list[Piece], int, int, int] | None:  # fmt: skip
        """``_collect_runs`` for a read filtered by an expression with no tag
        prefilter: runs of adjacent records planned from the index as for an
        unfiltered read, each run's frames passed through ``select_frames`` (in C:
        no Python object per record), the spans of passing frames served. At
        most ``max_filter_scan`` entries are inspected (lock held). None after
        rebuilding a damaged entry: the caller starts again."""
        taken = Taken(max_messages, max_bytes)
        cursor = offset
        scan_end = min(end, offset + scan_limit(self._config.max_filter_scan, selector))
        capacity = self._log.capacity
        mapped_chunk = -1
        while cursor < scan_end and taken.count < max_messages:
            entries = queue.index.read_raw(cursor, min(scan_end - cursor, SELECT_BATCH))
            if not entries:
                break
            n = len(entries) // ENTRY_SIZE
            runs, planned, _, _, stop = index_runs(entries, capacity, n, SELECT_RUN_BYTES, 0, 0)
            bounds = [first for _, _, first in runs[1:]] + [planned]
            for (start, run_end, first), after in zip(runs, bounds, strict=True):
                if start // capacity != mapped_chunk:
                    # Touching another chunk may unmap an older one, which
                    # must not have views alive: copy what we hold first.
                    taken.detach()
                mapped_chunk = start // capacity
                if not self._log.record_is(
                    start, queue.topic_bytes, queue.queue_id, cursor + first
                ):
                    taken.pieces.clear()
                    self._repair(queue, cursor + first)
                    return None
                run = entries[first * ENTRY_SIZE : after * ENTRY_SIZE]
                bad = self._log.first_damaged(start, run_end)
                good, good_end = before_damage(run, start, run_end, bad)
                if bad is not None and good == 0:
                    if not taken.count and cursor + first == offset:
                        taken.pieces.clear()
                        path = self._log.chunk_path(bad)
                        raise DamagedRecord(queue.topic, queue.queue_id, offset, path, bad)
                    return taken.result(cursor + first)
                stopped = self._select_run(
                    taken, selector, start, good_end, run, good, cursor + first
                )
                if stopped is not None:  # a limit: resume at the first record not taken
                    return taken.result(cursor + first + stopped)
                if bad is not None:  # resume at the damaged record: the next read says so
                    return taken.result(cursor + first + good)
            cursor += planned
            if stop in {RUNS_EMPTY, RUNS_DAMAGED}:  # an empty entry below the end is damage too
                taken.pieces.clear()
                self._repair(queue, cursor)
                return None
        return taken.result(cursor)

    def _select_run(  # noqa: PLR0917 (one run of _collect_selected)
        self, taken: Taken, selector: Selector, start: int, end: int, run: bytes, good: int,
        first_offset: int,
    ) -> int | None:  # fmt: skip
        """Pass the ``good`` records of the run at ``start..end`` through
        ``selector`` into ``taken``; ``Taken.take``'s answer. A function of its own
        so that no view of the chunk outlives it but the pieces taken (which
        ``Taken.detach`` copies before another chunk is touched)."""
        piece = memoryview(
            _served(self._log.copy(start, end), run[: good * ENTRY_SIZE], first_offset)
        )
        spans, _ = select_frames(selector, piece, good)
        return taken.take(piece, spans, run)

    def _collect(
        self, queue: QueueState, *, offset: int, end: int, max_messages: int, max_bytes: int,
        wanted: frozenset[str] | None, hashes: frozenset[int] | None,
    ) -> tuple[list[StoredMessage], int] | None:  # fmt: skip
        """(messages, next offset) of a decoding read (lock held); None after
        rebuilding a damaged index entry (the caller starts again)."""
        assert self._state.held()
        messages: list[StoredMessage] = []
        total = 0
        scan_end = min(
            end, offset + (self._config.max_filter_scan if hashes is not None else max_messages)
        )
        cursor = offset
        while cursor < scan_end:
            raw = queue.index.read_raw(cursor, scan_end - cursor)
            for i, (position_plus_one, size, tag_hash, stamp) in enumerate(ENTRY.iter_unpack(raw)):
                if position_plus_one == 0 or entry_damaged(raw, i * ENTRY_SIZE):
                    self._repair(queue, cursor)
                    return None
                # An unchecked entry's hash is not trusted: its record's tag decides.
                if (
                    hashes is not None
                    and tag_hash not in hashes
                    and not entry_unchecked(raw, i * ENTRY_SIZE)
                ):
                    cursor += 1
                    continue
                position = position_plus_one - 1
                if not self._log.record_is(position, queue.topic_bytes, queue.queue_id, cursor):
                    self._repair(queue, cursor)
                    return None
                if messages and total + size > max_bytes:
                    return messages, cursor
                try:
                    message = self._log.read(position, size)
                except CorruptionError as exc:  # the record fails its checksum
                    if messages:
                        return messages, cursor
                    raise DamagedRecord(
                        queue.topic, queue.queue_id, cursor, exc.path, exc.position
                    ) from None
                # A transaction's: offset and time at commit (its serial may equal its offset).
                if message.queue_offset != cursor or message.store_timestamp_ms != stamp:
                    message = dataclasses.replace(
                        message, queue_offset=cursor, store_timestamp_ms=stamp
                    )
                cursor += 1
                if wanted is not None and message.tag not in wanted:
                    continue  # hash collision
                messages.append(message)
                total += size
                if len(messages) >= max_messages:
                    return messages, cursor
        return messages, cursor

    def _check_read_limits(self, offset: int, max_messages: int, max_bytes: int) -> None:
        # Needs no lock: it looks at the arguments and the configuration only.
        if not isinstance(offset, int) or offset < 0:
            raise InvalidArgument(f"offset must be a non-negative integer, got {offset!r}")
        if not 1 <= max_messages <= self._config.max_read_messages:
            raise InvalidArgument(
                f"max_messages {max_messages} outside [1, {self._config.max_read_messages}]"
            )
        if not 1 <= max_bytes <= self._config.max_read_bytes:
            raise InvalidArgument(
                f"max_bytes {max_bytes} outside [1, {self._config.max_read_bytes}]"
            )

    # -- lookups by position, offset, time or size --------------------------------------

    def read_at_position(self, position: int) -> StoredMessage:
        """The message stored at a global log position (message ids carry it).

        ``NotFound`` unless a record of a live queue starts there (its queue's
        index says so); ``CorruptionError`` if that record fails its checksum.
        A transaction's record comes with its committed offset and store time.
        """
        with self._lock:
            offset, size, raw = self._indexed(position)
            message = self._log.read(position, size)
            stamp = ENTRY.unpack(raw)[3]
            if message.queue_offset == offset and message.store_timestamp_ms == stamp:
                return message
            return dataclasses.replace(message, queue_offset=offset, store_timestamp_ms=stamp)

    def record_at(self, position: int) -> bytes:
        """The stored bytes of the record at ``position`` (see ``read_at_position``),
        as a reply carries them (a transaction's with its committed offset)."""
        with self._lock:
            offset, size, raw = self._indexed(position)
            return bytes(_served(self._log.copy(position, position + size), raw, offset))

    def _indexed(self, position: object) -> tuple[int, int, bytes]:
        """(offset, size, index entry) of the record at ``position`` if a queue's
        index points at it, else ``NotFound`` (lock held)."""
        assert self._state.held()
        self._state.check_open()
        found = None
        if isinstance(position, int) and (
            self._log.start_position <= position < self._log.write_position
        ):
            found = self._find_entry(position)
        if found is None:
            raise NotFound(f"no message at log position {position!r}")
        return found

    def _find_entry(self, position: int) -> tuple[int, int, bytes] | None:
        """(offset, size, entry) of the record at ``position``, if indexed (lock held)."""
        try:
            meta = self._log.meta_at(position)
            queue = self._queues.get((meta.topic.decode(), meta.queue_id))
        except ChunkQuarantined:
            raise  # the record may well be there: DATA_LOSS, not "no such message"
        except (CorruptionError, UnicodeDecodeError, struct.error):
            return None
        if queue is None or meta.flags & FLAG_CONTROL:
            return None
        if meta.flags & FLAG_TXN:
            return self._committed_entry(queue, position, meta.store_timestamp_ms)
        if not queue.index.earliest <= meta.queue_offset < queue.visible_end:
            return None
        self._checked_entry(queue, meta.queue_offset)
        raw = queue.index.read_raw(meta.queue_offset, 1)
        position_plus_one, size, _tag, _ts = ENTRY.unpack(raw)
        return (meta.queue_offset, size, raw) if position_plus_one - 1 == position else None

    def _committed_entry(
        self, queue: QueueState, position: int, staged_ms: int
    ) -> tuple[int, int, bytes] | None:
        """The entry of a transaction's record at ``position``, staged at
        ``staged_ms`` (lock held). Its header holds no offset, but it was
        committed after it was staged and entries' store times never decrease:
        a binary search finds the first entry that may be it, and a scan of the
        entries from there (in C, an index chunk at a time) finds it; the scan
        is as long as what the queue took between the staging and the commit."""
        index = queue.index
        offset = index.first_offset_where(index.earliest, 3, staged_ms)
        wanted = position + 1
        while offset < queue.visible_end:
            raw = index.read_raw(offset, queue.visible_end - offset)
            if not raw:
                return None
            values = memoryview(raw).cast("Q")[::4].tolist()
            if wanted in values:
                i = values.index(wanted)
                entry = raw[i * ENTRY_SIZE : (i + 1) * ENTRY_SIZE]
                return offset + i, ENTRY.unpack(entry)[1], entry
            offset += len(values)
        return None

    def _checked_entry(self, queue: QueueState, offset: int) -> tuple[int, int, int, int]:
        """The entry of ``offset`` (below the end), rebuilt from the log first if it
        fails its checksum or names another record (lock held)."""
        assert self._state.held()
        raw = queue.index.read_raw(offset, 1)
        position_plus_one = ENTRY.unpack(raw)[0] if len(raw) == ENTRY_SIZE else 0
        if (
            not position_plus_one
            or entry_damaged(raw)
            or not self._log.record_is(
                position_plus_one - 1, queue.topic_bytes, queue.queue_id, offset
            )
        ):
            self._repair(queue, offset)
        return queue.index.entry(offset)

    def position_of(self, topic: str, queue_id: int, offset: int) -> int:
        """Log position of a queue offset (``NotFound`` outside [earliest, end))."""
        with self._lock:
            queue = self._state.live_queue(topic, queue_id)
            if not isinstance(offset, int) or not (
                queue.index.earliest <= offset < queue.visible_end
            ):
                raise NotFound(
                    f"{topic}/{queue_id} has no offset {offset!r} (retained: "
                    f"[{queue.index.earliest}, {queue.visible_end}))"
                )
            return self._checked_entry(queue, offset)[0] - 1

    def visible_end(self, topic: str, queue_id: int) -> int:
        """The queue's readable end, read without the lock (a snapshot, for long
        polls that must not block); -1 if the queue does not exist."""
        queue = self._queues.get((topic, queue_id))
        return -1 if queue is None else queue.visible_end

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First offset whose store time is >= ``timestamp_ms`` (the end if none)."""
        with self._lock:
            queue = self._state.live_queue(topic, queue_id)
            for _ in range(_MAX_REPAIRS):
                found = self._search_time(queue, timestamp_ms)
                if found is not None:
                    return min(found, queue.visible_end)
            raise _too_damaged(queue)

    def _search_time(self, queue: QueueState, timestamp_ms: int) -> int | None:
        """A binary search over the index's store times (they never decrease
        along a queue), checking every entry it probes: a damaged one would
        send the search the wrong way. None after rebuilding one from the log."""
        assert self._state.held()
        index = queue.index

        def checked(offset: int) -> IndexEntry:
            raw = index.read_raw(offset, 1)
            if len(raw) < ENTRY_SIZE or raw[:8] == bytes(8) or entry_damaged(raw):
                raise _Damaged(offset)
            return cast("IndexEntry", ENTRY.unpack(raw))

        try:
            return index.first_offset_where(index.earliest, 3, timestamp_ms, checked)
        except _Damaged as damaged:
            self._repair(queue, damaged.offset)
            return None

    def offset_for_bytes(
        self, topic: str, queue_id: int, start: int, end: int, max_bytes: int
    ) -> tuple[int, int]:
        """Where a byte budget read from ``start`` stops (``index_sizes.bytes_stop``):
        ``(stop, bytes)``, the index alone read (no log reads)."""
        if max_bytes < 1:
            raise InvalidArgument(f"max_bytes must be at least 1, got {max_bytes}")
        with self._lock:
            queue = self._state.live_queue(topic, queue_id)
            return bytes_stop(queue, start, end, max_bytes)

    def store_time(self, topic: str, queue_id: int, offset: int) -> int | None:
        """The store time (ms) of the message at ``offset``, from its index
        entry (rebuilt from the log if damaged); None when ``offset`` is at or
        past the readable end (no such message yet). An offset below the
        earliest retained one reads the earliest's: a group whose committed
        offset retention overtook next consumes that one (the lag's age)."""
        with self._lock:
            queue = self._state.live_queue(topic, queue_id)
            offset = max(offset, queue.index.earliest)
            if offset >= queue.visible_end:
                return None
            return self._checked_entry(queue, offset)[3]


def _served(piece: Piece, entries: bytes | bytearray, first_offset: int) -> Piece:
    """A run of records as a reply carries it: a transaction's records with their
    committed offsets (``record.patch_committed``: a copy only if there are any)."""
    patched = patch_committed(piece, entries, first_offset)
    return piece if patched is None else patched


def _too_damaged(queue: QueueState) -> CorruptionError:
    return CorruptionError(
        f"index of {queue.topic}/{queue.queue_id}: more than {_MAX_REPAIRS} damaged entries "
        "in one read", str(queue.index.directory),
    )  # fmt: skip
