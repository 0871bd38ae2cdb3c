"""Recovery at open: make the log and every queue index agree after any crash.

The log is the source of truth; indexes are derived. ``recover`` cuts the log
after its last complete append (``MessageLog.open``), drops index entries at or
after the checkpoint and rebuilds them by scanning the log from there, checks
each queue's end against the log and rebuilds damaged entries from it
(``index_repair.py``: a damaged index never cuts the log), lowers
committed offsets a power loss left past their queue's end, and writes a new
checkpoint (only when the saved one no longer holds: else the first flush
fsyncs what was rebuilt and saves it). Opening therefore costs time in
proportion to what was written since the last checkpoint (about one flush
interval), not to the log's size nor to the number of queues: the log's
tail scan starts at the checkpoint (``MessageLog.open``), and a queue the
checkpoint vouches for (``_Vouching``) is not opened at all: its end and
earliest offset are the checkpoint's, and the per-queue steps above run when
its index is first used (``_Later``, ``QueueIndex.open_now``), exactly as
they would have at open.

Transactions are recovered in the same scan (txn_recovery.py), which starts
early enough to see every record of the transactions open at the checkpoint.

This module also owns ``checkpoint.json``: recovery is what trusts it, so its
format is here, and the store's flush advances it with ``save_checkpoint``::

    {"index_position": P,   every index entry of a record (or commit record)
                            below P is fsynced
     "ends": [[topic, queue_id, end, earliest(, per_chunk)], ...],
                            each queue's index end when P was taken: entries
                            past it are dropped at open and derived again from
                            the log (a commit's entries point before P); and
                            its earliest offset, valid while the log still
                            starts at "log_start" (else found by a scan); and
                            its index entries per chunk file when not
                            "entries_per_chunk"
     "entries_per_chunk": E,            the index files' usual geometry (null
                            or absent: unknown, no queue is opened lazily)
     "log_start": S,
     "txn_position": T,     first record of the oldest transaction open at P
                            (P when none was): where the scan starts
     "next_serial": N,      serials below N may be in the log
     "sinks": {sink: [batch id, ms]},   sink progress as of P
     "epochs": [[epoch, start], ...],   the epoch markers below P (epochs.py)
     "held_high_watermark": H,          the replicated high watermark when it
                            held records back (below P), else null: a broker
                            restarted as a replica reads only below it until
                            its master's first reply
     "producers": [...],    idempotent producers' state as of P
                            (producers/table.py ``snapshot``)
     "timer": {...},        delayed delivery as of P (timer/timer.py
                            ``checkpoint_state``): "through", "cursor",
                            "pending", "topics" [[topic, count, [[hour, n],
                            ...]], ...], "chunks" [[chunk, n], ...],
                            "entries" (timer log entries fsynced),
                            "first" (oldest timer log entry kept),
                            "segments" [[segment, latest due], ...]
     "keys": {...}}         the key index as of P (keys/key_index.py
                            ``checkpoint_state``): "windows" [[n, first
                            position, end position, begin ms, end ms,
                            entries, sealed], ...], "slots" (the entry count
                            the active window's slot array on disk is as of);
                            null when the key index is off (rebuilt from the
                            log when it is turned on again)

A document without the later keys (older versions) means: no ends to trust,
no transactions, no sinks, no held high watermark.

Everything here runs inside ``Store.__init__``, before the store is shared
with any other thread, so none of it takes the store lock.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from equeue_broker.storage.config import StorageConfig
from equeue_broker.storage.epochs import EpochHistory
from equeue_broker.storage.errors import ChunkQuarantined, CorruptionError
from equeue_broker.storage.index.index_files import IndexFiles
from equeue_broker.storage.index.index_repair import (
    Wanted,
    entry_for,
    entry_matches,
    find_records,
    intact_end,
)
from equeue_broker.storage.index.queue_index import (
    ENTRY,
    ENTRY_SIZE,
    INDEX_SUFFIX,
    Deferred,
    QueueIndex,
    Segment,
    entry_damaged,
    index_segments,
)
from equeue_broker.storage.index.queue_state import QueueKey, QueueState, open_queue
from equeue_broker.storage.keys.key_index import KeyIndex
from equeue_broker.storage.log.chunk import chunk_file_name
from equeue_broker.storage.log.message_log import MessageLog
from equeue_broker.storage.meta.atomic_file import load_json, save_json
from equeue_broker.storage.meta.offsets import OffsetStore
from equeue_broker.storage.meta.topics import TopicMeta
from equeue_broker.storage.producers.table import ProducerTable
from equeue_broker.storage.results import RecoveryReport
from equeue_broker.storage.retention import settle_earliest
from equeue_broker.storage.timer.timer import Timer
from equeue_broker.storage.txn.txn_recovery import (
    RecoveredTxns,
    Sinks,
    TxnScan,
    migrate_stage_dir,
    remove_stage_dir,
)
from equeue_proto.record import FLAG_CONTROL, FLAG_TXN, RecordMeta, read_meta

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.json"


@dataclass(frozen=True)
class Checkpoint:
    """The document of ``checkpoint.json`` (module docstring)."""

    index_position: int
    ends: dict[QueueKey, int] | None = None
    earliest: dict[QueueKey, int] = field(default_factory=dict)
    log_start: int | None = None
    txn_position: int | None = None
    next_serial: int = 1
    sinks: Sinks = field(default_factory=dict)
    epochs: tuple[tuple[int, int], ...] = ()
    """(epoch, start position) of the log's epoch markers (epochs.py)."""
    held_high_watermark: int | None = None
    """The replicated high watermark when it held records back (sync
    replication), else None: a broker restarted as a replica serves reads
    only below it until its master's first reply (visibility.py)."""
    producers: list[Any] | None = None
    """The producer table as of ``index_position`` (``ProducerTable.snapshot``)."""
    timer: dict[str, Any] | None = None
    """Delayed delivery as of ``index_position`` (``Timer.checkpoint_state``)."""
    keys: dict[str, Any] | None = None
    """The key index as of ``index_position`` (``KeyIndex.checkpoint_state``)."""
    chunk_entries: dict[QueueKey, int] | None = None
    """Each queue's entries per index chunk (its files' geometry), where the
    checkpoint knows it: a queue it vouches for is opened lazily with it."""

    @property
    def scan_from(self) -> int:
        txn = self.index_position if self.txn_position is None else self.txn_position
        return min(self.index_position, txn)


def load_checkpoint(data_dir: Path) -> Checkpoint:
    """The saved checkpoint (position 0 when there is none yet, or no intact copy:
    every index entry, transaction and sink is then rebuilt from the whole log,
    which costs time, not data)."""
    try:
        document = load_json(data_dir / CHECKPOINT_FILE) or {}
    except CorruptionError as exc:
        log.error("checkpoint lost (%s); rebuilding every index entry from the log", exc)
        return Checkpoint(0)
    ends = document.get("ends")
    per_chunk = document.get("entries_per_chunk")
    chunk_entries = None
    if per_chunk is not None:  # older documents: geometry unknown, every index opened
        chunk_entries = {
            (str(q[0]), int(q[1])): int(q[4]) if len(q) > 4 else int(per_chunk) for q in ends or ()
        }
    return Checkpoint(
        int(document.get("index_position", 0)),
        None if ends is None else {(str(q[0]), int(q[1])): int(q[2]) for q in ends},
        {(str(q[0]), int(q[1])): int(q[3]) for q in ends or () if len(q) > 3},
        document.get("log_start"),
        document.get("txn_position"),
        int(document.get("next_serial", 1)),
        {str(s): (int(b), int(ms)) for s, (b, ms) in document.get("sinks", {}).items()},
        tuple((int(e), int(p)) for e, p in document.get("epochs", ())),
        _optional_int(document.get("held_high_watermark")),
        document.get("producers"),
        document.get("timer"),
        document.get("keys"),
        chunk_entries,
    )


def _optional_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def save_checkpoint(data_dir: Path, checkpoint: Checkpoint) -> None:
    """Persist ``checkpoint`` (fsynced)."""
    geometry = checkpoint.chunk_entries or {}
    counts = collections.Counter(geometry.values()).most_common(1)
    common = counts[0][0] if counts else None
    document = {
        "index_position": checkpoint.index_position,
        "ends": [
            [t, q, e, checkpoint.earliest.get((t, q), 0)]
            + ([geometry[t, q]] if geometry.get((t, q), common) != common else [])
            for (t, q), e in sorted((checkpoint.ends or {}).items())
        ],
        "entries_per_chunk": common if len(geometry) == len(checkpoint.ends or {}) else None,
        "log_start": checkpoint.log_start,
        "txn_position": checkpoint.index_position
        if checkpoint.txn_position is None
        else checkpoint.txn_position,
        "next_serial": checkpoint.next_serial,
        "sinks": {s: [b, ms] for s, (b, ms) in sorted(checkpoint.sinks.items())},
        "epochs": [list(entry) for entry in checkpoint.epochs],
        "held_high_watermark": checkpoint.held_high_watermark,
        "producers": checkpoint.producers or [],
        "timer": checkpoint.timer,
        "keys": checkpoint.keys,
    }
    save_json(data_dir / CHECKPOINT_FILE, document)


def recover(
    config: StorageConfig,
    message_log: MessageLog,
    topics: Iterable[TopicMeta],
    offsets: OffsetStore,
    queues: dict[QueueKey, QueueState],
    *,
    producers: ProducerTable,
    timer: Timer,
    keys: KeyIndex | None = None,
) -> tuple[RecoveryReport, Checkpoint, RecoveredTxns, int]:
    """Open ``message_log`` and the index of every queue of ``topics``, repair
    them, recover transactions and ``producers``, and return the report, the
    new checkpoint, the transactions and the position of the checkpoint on
    disk (the new one's, or the saved one's when that still holds: the first
    flush then saves the next).

    Each queue is put into ``queues`` as soon as it is open, so that a caller
    whose open fails part-way can still release every file opened so far.
    """
    started = time.monotonic()
    saved = load_checkpoint(config.data_dir)
    # The records below the checkpoint were fsynced whole: the tail scan
    # checks only what was written after it (when the log agrees it may).
    message_log.open(saved.index_position)
    migrated = migrate_stage_dir(config.data_dir)
    checkpoint = min(
        max(saved.index_position, message_log.start_position), message_log.write_position
    )
    scan_from = min(max(saved.scan_from, message_log.start_position), checkpoint)
    scanned = message_log.tail.scanned_bytes if message_log.tail else 0
    files = (
        IndexFiles.for_dir(config.data_dir, config.max_open_index_files)
        if config.max_open_index_files > 0
        else None
    )
    vouching = _vouching(saved, checkpoint, message_log, str(config.data_dir / "index"))
    for topic in topics:
        for q in topic.queues:
            key = (topic.name, q.queue_id)
            later = None if vouching is None else vouching.later(topic, q.queue_id)
            per_chunk = config.index_entries_per_chunk if later is None else later.per_chunk
            deferred = None if later is None else Deferred(later.end, later.earliest, later.settle)
            queue = open_queue(
                config.data_dir, per_chunk, topic.name, q.queue_id, files=files, deferred=deferred
            )
            if later is not None:
                later.queue = queue
            queues[key] = queue
            queue.producer_visible = q.producer_visible
            if later is None:
                scanned += _open_index(queue, checkpoint, saved.ends)
    sinks = saved.sinks if migrated is None else {**migrated, **saved.sinks}
    # A damaged timer index (or a checkpoint that is not the log's) is rebuilt
    # from the whole log: no pending delayed record may be missed.
    if not timer.restore(saved.timer, checkpoint, usable=checkpoint == saved.index_position):
        scan_from = message_log.start_position
    # Markers from scan_from on are read again by the scan (and cut with the log).
    epochs = EpochHistory([e for e in saved.epochs if e[1] < scan_from])
    producers.restore(saved.producers)
    scan = TxnScan(
        saved.next_serial, sinks, scan_from <= message_log.start_position, epochs, producers
    )
    scan.timer = timer
    opened = {key: q for key, q in queues.items() if not q.index.deferred}
    rebuilt = _restore_ends(message_log, opened, checkpoint)
    more, orphans = rebuild_indexes(message_log, queues, checkpoint, scan_from, scan)
    rebuilt += more
    producers.truncate(message_log.write_position)  # a snapshot past a cut log
    if keys is not None:
        _recover_keys(keys, saved, message_log, checkpoint)
    same_start = saved.log_start == message_log.start_position
    # The saved checkpoint still holds for the log as it is (not cut below
    # it): the entries rebuilt here are fsynced by the first flush, which
    # saves the next one, rather than one fsync per queue before the broker
    # answers. Otherwise (or none was saved, or it was lost) they are
    # fsynced now and a checkpoint saved.
    save = migrated is not None or checkpoint != saved.index_position or saved.ends is None
    for key, queue in queues.items():
        if not queue.index.deferred:
            known = saved.earliest.get(key) if same_start else None
            settle_earliest(queue, message_log.start_position, known)
            if save:
                queue.index.sync()
        queue.visible_end = queue.notified_end = queue.index.end
    _clamp_offsets(offsets, queues)
    # The tail may hold data a killed process wrote but never fsynced: make it
    # durable before a checkpoint claims everything below it is indexed.
    os.fsync(message_log.sync_target()[1])
    found = scan.found
    end = message_log.write_position
    timer_doc, heads = timer.checkpoint_state()
    timer.persist(heads)
    keys_doc, key_fds = KeyIndex.checkpoint_of(keys)
    KeyIndex.persist(key_fds)
    new = Checkpoint(
        end,
        {key: q.index.end for key, q in queues.items()},
        {key: q.index.earliest for key, q in queues.items()},
        message_log.start_position,
        min((t.first_position for t in found.open.values()), default=end),
        found.next_serial,
        found.sinks,
        tuple(e for e in epochs.entries() if e[1] < end),
        # Kept across the restart: what it held back stays held (Store.hold_back).
        saved.held_high_watermark
        if saved.held_high_watermark is not None and saved.held_high_watermark < end
        else None,
        producers.snapshot(),
        timer_doc,
        keys_doc,
        {key: q.index.entries_per_chunk for key, q in queues.items()},
    )
    if save:
        save_checkpoint(config.data_dir, new)
        timer.persisted(heads, timer_doc)
    if migrated is not None:
        remove_stage_dir(config.data_dir)
    tail = message_log.tail
    report = RecoveryReport(
        tail.scanned_records if tail else 0,
        tail.truncated_bytes if tail else 0,
        rebuilt,
        orphans,
        time.monotonic() - started,
        scanned,
    )
    # Fields, not the report's repr: a log shipper indexes them (JSON) and a
    # reader sees key=value (text).
    lazy = sum(q.index.deferred for q in queues.values())
    log.info(
        "store opened in %.3f s", report.seconds,
        extra={"recovery_s": round(report.seconds, 3), "bytes_scanned": report.bytes_scanned,
               "tail_records_scanned": report.tail_records_scanned,
               "tail_bytes_discarded": report.tail_bytes_discarded,
               "index_entries_rebuilt": report.index_entries_rebuilt,
               "records_of_deleted_topics": report.records_of_deleted_topics,
               "queues": len(queues), "indexes_opened_at_first_use": lazy},
    )  # fmt: skip
    if found.open or found.commits or found.aborts:
        log.info(
            "transactions: %d open, %d commits and %d aborts read from the log",
            len(found.open), found.commits, found.aborts,
        )  # fmt: skip
    return report, new, found, end if save else checkpoint


def _open_index(queue: QueueState, checkpoint: int, ends: dict[QueueKey, int] | None) -> int:
    """Open a queue's index now: set its end from its files, dropping the
    entries at or after ``checkpoint`` (and past the saved end, with ``ends``);
    return the bytes read."""
    index = queue.index
    key = (queue.topic, queue.queue_id)
    scanned = index.recover(checkpoint, None if ends is None else ends.get(key))
    if ends is not None:  # later entries: derived again from the log
        saved_end = ends.get(key, 0)
        index.truncate(max(saved_end, index.earliest))
        # Short of the saved end: trailing entries were zeroed on disk (they
        # look never written); their records are below the checkpoint. An
        # empty index is left alone: the saved end may be a deleted
        # incarnation's (a delete cut short before the next checkpoint).
        index.suspect |= index.earliest < index.end < saved_end
    return scanned


@dataclass
class _Vouching:
    """What a usable checkpoint says of every queue it lists."""

    saved: Checkpoint
    ends: dict[QueueKey, int]
    chunk_entries: dict[QueueKey, int]
    message_log: MessageLog
    checkpoint: int
    index_root: str

    def later(self, topic: TopicMeta, queue_id: int) -> _Later | None:
        """A queue the checkpoint vouches for is opened at its first use; None
        for the others: created since (a topic created at or after the
        checkpoint, a queue it does not list), or no index file where the
        checkpoint's last entry would be (a queue deleted and created again
        since: its index was started anew)."""
        if topic.created_position >= self.checkpoint:
            return None
        key = (topic.name, queue_id)
        end = self.ends.get(key)
        earliest = self.saved.earliest.get(key)
        per_chunk = self.chunk_entries.get(key)
        if end is None or earliest is None or per_chunk is None:
            return None
        if end > 0:
            name = chunk_file_name((end - 1) // per_chunk, INDEX_SUFFIX)
            if not os.path.exists(f"{self.index_root}/{topic.name}/{queue_id}/{name}"):
                return None
        return _Later(self.message_log, self.checkpoint, end, earliest, per_chunk)


def _vouching(
    saved: Checkpoint, checkpoint: int, message_log: MessageLog, index_root: str
) -> _Vouching | None:
    """The saved checkpoint's queue ends, if it vouches for them: its position
    is the log's (the log was not cut below it), the log still starts where
    it did (so the earliest offsets hold) and it knows the index files'
    geometry. None: every index is opened and checked at open."""
    if (
        saved.ends is None
        or saved.chunk_entries is None
        or checkpoint != saved.index_position
        or saved.log_start != message_log.start_position
    ):
        return None
    return _Vouching(saved, saved.ends, saved.chunk_entries, message_log, checkpoint, index_root)


@dataclass
class _Later:
    """The recovery of one vouched queue, put off until its index is first
    used (``QueueIndex.open_now``): exactly what ``recover`` does for an index
    opened at once, with the open's checkpoint, which no later write of the
    store moves for this queue (it has not been used since)."""

    message_log: MessageLog
    checkpoint: int
    end: int
    earliest: int
    per_chunk: int
    queue: QueueState | None = None

    def settle(self, index: QueueIndex) -> None:
        queue = self.queue
        assert queue is not None and queue.index is index
        key = (queue.topic, queue.queue_id)
        _open_index(queue, self.checkpoint, {key: self.end})
        _restore_ends(self.message_log, {key: queue}, self.checkpoint)
        # The log still starts where it did at open: retention reads every
        # queue's entries (opening each) before it deletes a chunk.
        settle_earliest(queue, self.message_log.start_position, self.earliest)
        if index.end != self.end:  # a damaged index and log, or a queue made anew
            log.warning(
                "%s/%d: index opened at first use ends at %d, the checkpoint said %d",
                *key, index.end, self.end,
            )  # fmt: skip
            queue.visible_end = queue.notified_end = index.end


def _recover_keys(
    keys: KeyIndex, saved: Checkpoint, message_log: MessageLog, checkpoint: int
) -> None:
    """Open the key index as of the checkpoint and index the records after it,
    or rebuild it from the whole log when it cannot be trusted."""
    if keys.restore(saved.keys):
        keys.truncate(checkpoint)  # the log may have lost records below the saved position
        keys.index_log(message_log, checkpoint)
        return
    keys.reset()
    if message_log.write_position > message_log.start_position:
        keys.rebuild(message_log, "its files are missing, damaged or not the log's")


def rebuild_indexes(
    message_log: MessageLog,
    queues: dict[QueueKey, QueueState],
    checkpoint: int,
    scan_from: int | None = None,
    txns: TxnScan | None = None,
    *,
    appended: bytes | memoryview | None = None,
) -> tuple[int, int]:
    """Re-create index entries for every record and commit record at or after
    ``checkpoint``, reading transactions from ``scan_from`` into ``txns``;
    return (entries rebuilt, records of deleted topics skipped).

    ``appended``: the log's bytes from ``checkpoint`` to its end, already
    checked (a replica's reply, just written): indexed from memory, since
    reading them back through the chunk's memory map costs a page fault per
    page and checks every frame a second time."""
    rebuilt = orphans = 0
    pending: dict[QueueKey, bytearray] = {}
    expected: dict[QueueKey, int] = {}
    gaps: dict[QueueKey, Wanted] = {}
    start = checkpoint if scan_from is None else min(scan_from, checkpoint)
    if appended is not None and start == checkpoint:
        segments = _buffer_segments(appended, checkpoint)
    else:
        segments = _segments(message_log, start, checkpoint)
    for position, meta, (_, count, topic, queue_id, first, entries) in segments:
        if meta is not None:  # a transaction's record
            if txns is None:
                continue
            if meta.flags & FLAG_TXN:
                txns.staged(position, meta)
                continue
            derived = txns.control(message_log, position, meta, position >= checkpoint)
            for key, first_offset, staged in derived:
                n = len(staged) // ENTRY_SIZE
                if not _meet(queues, expected, key):
                    orphans += n
                    continue
                if first_offset != expected[key] and key not in pending:
                    _follow_log(message_log, queues[key], key, first_offset, gaps)
                    expected[key] = first_offset
                if first_offset != expected[key]:
                    raise CorruptionError(
                        f"commit record at {position}: {key[0]}/{key[1]} offset {first_offset}, "
                        f"expected {expected[key]}"
                    )
                pending.setdefault(key, bytearray()).extend(staged)
                expected[key] += n
                rebuilt += n
            continue
        if position < checkpoint:
            continue
        # ``count`` records of one queue at consecutive offsets from ``first``:
        # checked as the first one, the others follow it.
        key = (topic.decode(), queue_id)
        if not _meet(queues, expected, key):
            orphans += count  # a deleted topic's records wait for retention
            continue
        if first != expected[key] and key not in pending:
            # The queue's first record after the checkpoint: the log, not the
            # index, says where the queue stands.
            _follow_log(message_log, queues[key], key, first, gaps)
            expected[key] = first
        if first != expected[key]:
            # Only stale bytes of a failed append can break the sequence: cut them.
            log.warning(
                "record at %d has offset %d, expected %d for %s; cutting log there",
                position,
                first,
                expected[key],
                key,
            )
            if position < message_log.start_of(message_log.active):
                raise CorruptionError(f"queue {key} offsets not contiguous at position {position}")
            message_log.truncate(position)
            break
        pending.setdefault(key, bytearray()).extend(entries)
        expected[key] += count
        rebuilt += count
    rebuilt += _fill(message_log, queues, gaps, checkpoint, exact=True)
    for key, written in pending.items():
        queue = queues[key]
        queue.index.write(queue.index.end, written)
    return rebuilt, orphans


def _meet(queues: dict[QueueKey, QueueState], expected: dict[QueueKey, int], key: QueueKey) -> bool:
    """False if ``key`` is no live queue; else True, with its index end in
    ``expected``: a lazily opened index is opened when the scan first meets
    its queue (``QueueIndex.open_now``), so a queue never met costs nothing."""
    if key in expected:
        return True
    queue = queues.get(key)
    if queue is None:
        return False
    queue.index.open_now()
    expected[key] = queue.index.end
    return True


def _buffer_segments(
    data: bytes | memoryview, position: int
) -> Iterator[tuple[int, RecordMeta | None, Segment]]:
    """``_segments`` of checked frames in memory that lie at log ``position``."""
    for segment in index_segments(data, 0, len(data), position):
        at = segment[0]
        yield position + at, None if segment[1] else read_meta(data, at), segment


def _segments(
    message_log: MessageLog, start: int, checkpoint: int
) -> Iterator[tuple[int, RecordMeta | None, Segment]]:
    """The records from ``start`` as ``MessageLog.iter_segments`` gives them
    (runs with their entries, one C call per chunk). A scan that starts before
    the checkpoint (for transactions) goes record by record: a run must not
    straddle the checkpoint, before which records are not re-indexed."""
    if start >= checkpoint:
        yield from message_log.iter_segments(start)
        return
    for position, meta in message_log.iter_records(start):
        if meta.flags & (FLAG_TXN | FLAG_CONTROL):
            yield position, meta, (0, 0, b"", 0, 0, b"")
        else:
            entry = entry_for(position, meta)
            yield position, None, (0, 1, meta.topic, meta.queue_id, meta.queue_offset, entry)


def _restore_ends(
    message_log: MessageLog, queues: dict[QueueKey, QueueState], checkpoint: int
) -> int:
    """Check each queue's last entry against the log, and find in the log the
    records of entries recovery had to drop as damaged; return entries rebuilt.

    A queue's end comes from the log: a damaged last entry must neither lose
    its record nor let the next append reuse its offset."""
    wanted: dict[QueueKey, Wanted] = {}
    for key, queue in queues.items():
        index, suspect = queue.index, queue.index.suspect
        while index.end > index.earliest:
            last = index.end - 1
            raw = index.read_raw(last, 1)
            try:
                if entry_matches(message_log, raw, queue.topic_bytes, queue.queue_id, last):
                    break
            except ChunkQuarantined:
                break  # nothing to check against: reads of it answer DATA_LOSS
            position_plus_one = ENTRY.unpack(raw)[0]
            if not entry_damaged(raw) and 0 < position_plus_one <= message_log.start_position:
                break  # its record was deleted by retention: nothing to check against
            log.warning("index entry of %s/%d offset %d does not match the log", *key, last)
            index.truncate(last)
            suspect = True
        if suspect:
            wanted[key] = Wanted(intact_end(message_log, index, key, index.end), index.end)
    return _fill(message_log, queues, wanted, checkpoint, exact=False)


def _follow_log(
    message_log: MessageLog, queue: QueueState, key: QueueKey, offset: int,
    gaps: dict[QueueKey, Wanted],
) -> None:  # fmt: skip
    """Make the index of ``queue`` end where its first record after the
    checkpoint, of ``offset``, says: entries past it are dropped, entries
    missing before it are to be found in the log (``gaps``)."""
    index = queue.index
    log.warning("%s/%d: log continues at offset %d, index ended at %d", *key, offset, index.end)
    if offset < index.end:
        index.truncate(max(offset, index.earliest))
    else:
        gaps[key] = Wanted(intact_end(message_log, index, key, index.end), index.end, offset)


def _fill(
    message_log: MessageLog, queues: dict[QueueKey, QueueState], wanted: dict[QueueKey, Wanted],
    stop: int, *, exact: bool,
) -> int:  # fmt: skip
    """Write the entries of the records ``wanted`` names, found in the log
    before ``stop``; with ``exact``, every one must be found. Returns the count."""
    found = find_records(message_log, wanted, stop)
    written = 0
    for key, want in wanted.items():
        entries = found.get(key, bytearray())
        count = len(entries) // ENTRY_SIZE
        if exact and want.until is not None and want.offset + count != want.until:
            raise CorruptionError(
                f"queue {key[0]}/{key[1]}: the log holds no record of offset "
                f"{want.offset + count}, before offset {want.until}"
            )
        if count:
            queues[key].index.write(want.offset, entries)
            log.warning("%s/%d: rebuilt %d index entries from the log", *key, count)
            written += count
    return written


def _clamp_offsets(offsets: OffsetStore, queues: dict[QueueKey, QueueState]) -> None:
    # Async mode persists offsets of records that a power loss can take with it
    # (a consumer may commit what it read before the fsync): a group's offset
    # past its queue's end would make it skip the next messages written there.
    ends = {key: q.visible_end for key, q in queues.items()}
    for group, name, queue_id, was, now in offsets.clamp(ends):
        log.warning(
            "group %s: committed offset %d of %s/%d is past the end after recovery; "
            "lowered to %d", group, was, name, queue_id, now,
        )  # fmt: skip
