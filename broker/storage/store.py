"""The store: topics and queues over one message log, with recovery and retention.

Data directory layout::

    <data_dir>/LOCK                       flock'ed while a store has it open
    <data_dir>/log/<n:09d>.chunk          message log chunks (message_log.py)
    <data_dir>/index/<topic>/<q>/<n>.idx  queue index chunks (queue_index.py)
    <data_dir>/topics.json[.bak]          topic/queue metadata (topics.py)
    <data_dir>/offsets.json[.bak]         consumer-group offsets (offsets.py)
    <data_dir>/checkpoint.json[.bak]      log position below which every index
                                          entry is fsynced
    <data_dir>/txn/                       staged transactions (transactions.py)

Consistency: the log is the source of truth; indexes are derived. On open the
store cuts the log after its last complete append, drops index entries at or
after the checkpoint, and rebuilds them by scanning the log from the
checkpoint, so the log and every index agree after any crash, and opening costs
time proportional to the data written since the last checkpoint (about one
flush interval), not to the size of the log.

Durability (see ``FlushMode``): in sync mode an append returns after an fsync
of its records (group commit), and readers see only durable records; in async
mode appends are visible at once and fsynced every ``flush_interval_ms``.
Committed offsets are persisted before a commit returns in sync mode.

Thread safety: every public method may be called from any thread.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import fcntl
import functools
import itertools
import logging
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

from equeue_broker.storage.atomic_file import load_json, remove_temp_files, save_json
from equeue_broker.storage.config import FlushMode, StorageConfig
from equeue_broker.storage.errors import (
    AlreadyExists,
    CorruptionError,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    PreconditionFailed,
    StorageError,
    StoreClosed,
    io_error,
)
from equeue_broker.storage.flush import GroupCommit, SyncCommitter
from equeue_broker.storage.message_log import MessageLog
from equeue_broker.storage.names import validate_group, validate_topic
from equeue_broker.storage.offsets import GroupOffsets, OffsetStore
from equeue_broker.storage.queue_index import (
    ENTRY,
    ENTRY_SIZE,
    RUNS_EMPTY,
    RUNS_LIMIT,
    QueueIndex,
    index_runs,
)
from equeue_broker.storage.record import (
    EncodedBatch,
    MessageBatch,
    PreparedBatch,
    encode_records,
    frame_sizes,
    prepare_batch,
    rebase_records,
)
from equeue_broker.storage.topics import QueueMeta, TopicMeta, load_topics, save_topics
from equeue_broker.storage.transactions import Transactions
from equeue_proto.record import FRAME_OVERHEAD, StoredMessage

log = logging.getLogger(__name__)

Listener = Callable[[str, int, int], None]
"""Called with (topic, queue_id, visible_end) when new records become readable."""


class ReadStatus(enum.Enum):
    OK = "ok"
    """``offset`` was within [earliest, end]; ``messages`` may be empty at the end."""
    OFFSET_TOO_SMALL = "offset_too_small"
    """``offset`` is below the earliest retained offset; ``next_offset`` is the earliest."""
    OFFSET_TOO_BIG = "offset_too_big"
    """``offset`` is past the end; ``next_offset`` is the end."""


@dataclass(frozen=True)
class ReadResult:
    status: ReadStatus
    messages: list[StoredMessage]
    next_offset: int
    """The offset to read next: after the last message returned or skipped by the
    tag filter, or the corrected offset for an out-of-range request."""
    earliest: int
    end: int
    """One past the last readable offset (durable in sync mode, written in async)."""


@dataclass(frozen=True)
class RecordsResult:
    """A read whose records stay in the stored record format (see ``read_records``)."""

    status: ReadStatus
    records: bytes = field(repr=False)
    """``count`` records, each ``u32 len | body | u32 crc | u32 len`` (record.py)."""
    count: int
    next_offset: int
    earliest: int
    end: int
    nbytes: int = 0
    """Bytes of the records alone (``records`` may also hold a frame's prefix and suffix)."""


Piece = bytes | bytearray | memoryview
"""Part of a read's records: a view of a log map, or a copy of one."""

Framer = Callable[[RecordsResult], tuple[bytes, bytes]]
"""(prefix, suffix) to join around a read's records in the same copy (see
``Store.read_records``); called with the read's result, ``records`` still empty."""


@dataclass(frozen=True)
class AppendResult:
    topic: str
    queue_id: int
    first_offset: int
    count: int
    entries: bytes | bytearray = field(repr=False)
    """The index entries written, one per message (see queue_index.py)."""

    def positions(self) -> list[int]:
        """Global log position of each message (the basis of message ids)."""
        return [p - 1 for p in memoryview(self.entries).cast("Q")[:: ENTRY_SIZE // 8]]


@dataclass(frozen=True)
class QueueInfo:
    topic: str
    queue_id: int
    earliest: int
    end: int
    producer_visible: bool
    consumer_visible: bool


@dataclass(frozen=True)
class RecoveryReport:
    tail_records_scanned: int
    tail_bytes_discarded: int
    index_entries_rebuilt: int
    records_of_deleted_topics: int
    seconds: float
    bytes_scanned: int
    """Bytes read to find where the log's last chunk and each queue index end."""


@dataclass(frozen=True)
class RetentionReport:
    log_chunks_deleted: int
    index_chunks_deleted: int
    log_start_position: int


@dataclass
class _Queue:
    topic: str
    topic_bytes: bytes
    queue_id: int
    index: QueueIndex
    visible_end: int = 0
    producer_visible: bool = True
    """Cached from the topic metadata, for the append hot path."""
    notified_end: int = 0
    """Highest visible end announced to listeners."""


class Store:
    """A message store rooted at ``config.data_dir``; opens and recovers on creation."""

    def __init__(self, config: StorageConfig, background: bool = True) -> None:
        self.config = config
        self._lock = threading.RLock()
        self._closed = False
        self._failed: BaseException | None = None
        self._listeners: list[Listener] = []
        self._notify_lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        self._pending: deque[tuple[int, _Queue, int]] = deque()
        self._last_store_ms = 0
        self._queues: dict[tuple[str, int], _Queue] = {}
        self._blocked: set[tuple[str, int]] = set()
        """Queues an interrupted transaction commit must finish first."""
        root = config.data_dir
        root.mkdir(mode=0o700, parents=True, exist_ok=True)  # data is private to the broker
        self._lock_fd = _lock_data_dir(root)
        try:
            remove_temp_files(root)
            self._log = MessageLog(
                root / "log", config.chunk_capacity_bytes, config.max_mapped_chunks
            )
            self._topics = load_topics(root / "topics.json")
            self._offsets = OffsetStore(root / "offsets.json")
            self.recovery = self._recover()
        except BaseException:
            self._release_files()
            raise
        self._commit = GroupCommit(
            self._sync_target,
            self._log.write_position,
            self._publish_durable,
            sticky_errors=config.flush_mode is FlushMode.SYNC,
        )
        self._committer: SyncCommitter | None = None
        if config.flush_mode is FlushMode.SYNC:
            self._committer = SyncCommitter(self._commit_round)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:  # rolls forward commits a crash interrupted, so before anyone reads
            self.transactions = Transactions(self, root / "txn", config.transactions)
        except BaseException:
            if self._committer is not None:
                self._committer.close()
            self._release_files()
            raise
        if background:
            self._thread = threading.Thread(target=self._maintain, name="equeue-store", daemon=True)
            self._thread.start()

    # -- recovery -------------------------------------------------------------------

    def _recover(self) -> RecoveryReport:
        started = time.monotonic()
        self._log.open()
        document = load_json(self.config.data_dir / "checkpoint.json") or {}
        checkpoint = int(document.get("index_position", 0))
        checkpoint = min(max(checkpoint, self._log.start_position), self._log.write_position)
        scanned = self._log.tail.scanned_bytes if self._log.tail else 0
        for topic in self._topics.values():
            for q in topic.queues:
                queue = self._open_queue(topic.name, q.queue_id)
                queue.producer_visible = q.producer_visible
                scanned += queue.index.recover(checkpoint)
        rebuilt, orphans = self._rebuild_indexes(checkpoint)
        for queue in self._queues.values():
            queue.index.delete_chunks_below(self._log.start_position)
            queue.index.sync()
            queue.visible_end = queue.notified_end = queue.index.end
        # Async mode persists offsets of records that a power loss can take with it
        # (a consumer may commit what it read before the fsync): a group's offset
        # past its queue's end would make it skip the next messages written there.
        ends = {key: q.visible_end for key, q in self._queues.items()}
        for group, name, queue_id, was, now in self._offsets.clamp(ends):
            log.warning(
                "group %s: committed offset %d of %s/%d is past the end after recovery; "
                "lowered to %d", group, was, name, queue_id, now,
            )  # fmt: skip
        # The tail may hold data a killed process wrote but never fsynced: make it
        # durable before the checkpoint claims everything below it is indexed.
        os.fsync(self._log.sync_target()[1])
        self._checkpoint = self._log.write_position
        self._save_checkpoint()
        tail = self._log.tail
        report = RecoveryReport(
            tail.scanned_records if tail else 0,
            tail.truncated_bytes if tail else 0,
            rebuilt,
            orphans,
            time.monotonic() - started,
            scanned,
        )
        log.info("store opened: %s", report)
        return report

    def _rebuild_indexes(self, checkpoint: int) -> tuple[int, int]:
        """Re-create index entries for every record at or after ``checkpoint``."""
        rebuilt = orphans = 0
        pending: dict[tuple[str, int], bytearray] = {}
        expected = {key: q.index.end for key, q in self._queues.items()}
        for position, meta in self._log.iter_records(checkpoint):
            key = (meta.topic.decode(), meta.queue_id)
            if key not in expected:
                orphans += 1  # a deleted topic's records wait for retention
                continue
            if meta.queue_offset != expected[key]:
                # Only stale bytes of a failed append can break the sequence: cut them.
                log.warning(
                    "record at %d has offset %d, expected %d for %s; cutting log there",
                    position,
                    meta.queue_offset,
                    expected[key],
                    key,
                )
                if position < self._log.start_of(self._log.active):
                    raise CorruptionError(
                        f"queue {key} offsets not contiguous at position {position}"
                    )
                self._log.truncate(position)
                break
            tag_hash = crc32c(meta.tag) if meta.tag else 0
            pending.setdefault(key, bytearray()).extend(
                ENTRY.pack(position + 1, meta.frame_size, tag_hash, meta.store_timestamp_ms)
            )
            expected[key] += 1
            rebuilt += 1
        for key, entries in pending.items():
            queue = self._queues[key]
            queue.index.write(queue.index.end, entries)
        return rebuilt, orphans

    def _open_queue(self, topic: str, queue_id: int) -> _Queue:
        directory = self.config.data_dir / "index" / topic / str(queue_id)
        queue = _Queue(
            topic,
            topic.encode(),
            queue_id,
            QueueIndex(directory, self.config.index_entries_per_chunk),
        )
        self._queues[(topic, queue_id)] = queue
        return queue

    # -- topics -----------------------------------------------------------------------

    # Every metadata change is saved to topics.json before memory changes: if the
    # save fails (disk full), the broker goes on as if the call never happened,
    # rather than accepting appends to a topic a restart would not know.

    def create_topic(self, name: str, queue_count: int | None = None) -> TopicMeta:
        validate_topic(name)
        count = self.config.default_queue_count if queue_count is None else queue_count
        self._check_queue_count(name, count)
        with self._lock:
            self._check_open()
            if name in self._topics:
                raise AlreadyExists(f"topic {name!r} already exists")
            if len(self._topics) >= self.config.max_topics:
                raise LimitExceeded(
                    f"cannot create topic {name!r}: max_topics={self.config.max_topics}"
                )
            meta = TopicMeta(name, tuple(QueueMeta(i) for i in range(count)), _now_ms())
            before = self._topics
            self._save_topics({**before, name: meta})
            self._open_queues(name, [q.queue_id for q in meta.queues], before)
            return meta

    def delete_topic(self, name: str) -> None:
        """Delete a topic, its indexes and its groups' offsets. Its records stay in
        the log until retention deletes their chunks; they are never readable again."""
        self.flush()  # its unindexed records must be behind the checkpoint, or recovery
        with self._lock:  # would re-index them into a new topic of the same name
            self._topic(name)
            self._save_topics({k: v for k, v in self._topics.items() if k != name})
            for key in [k for k in self._queues if k[0] == name]:
                self._queues.pop(key).index.destroy()
            self._offsets.forget(name)

    def add_queues(self, name: str, count: int = 1) -> TopicMeta:
        with self._lock:
            meta = self._topic(name)
            self._check_queue_count(name, len(meta.queues) + count)
            next_id = max((q.queue_id for q in meta.queues), default=-1) + 1
            new_ids = range(next_id, next_id + count)
            for queue_id in new_ids:
                meta = meta.with_queue(QueueMeta(queue_id))
            before = self._topics
            self._save_topics({**before, name: meta})
            self._open_queues(name, list(new_ids), before)
            return meta

    def set_queue_visibility(
        self, topic: str, queue_id: int, producer: bool | None = None, consumer: bool | None = None
    ) -> QueueMeta:
        with self._lock:
            meta = self._topic(topic)
            current = self._queue_meta(meta, queue_id)
            updated = QueueMeta(
                queue_id,
                current.producer_visible if producer is None else producer,
                current.consumer_visible if consumer is None else consumer,
            )
            self._save_topics({**self._topics, topic: meta.with_queue(updated)})
            self._queues[(topic, queue_id)].producer_visible = updated.producer_visible
            return updated

    def delete_queue(self, topic: str, queue_id: int) -> None:
        """Delete a queue hidden from producers and consumers whose every message
        has been consumed by every group that committed on it."""
        with self._lock:
            meta = self._topic(topic)
            qmeta = self._queue_meta(meta, queue_id)
            if qmeta.producer_visible or qmeta.consumer_visible:
                raise PreconditionFailed(
                    f"queue {topic}/{queue_id} must be hidden from producers and consumers first"
                )
            queue = self._queues[(topic, queue_id)]
            low = self._offsets.min_committed(topic, queue_id)
            if low is not None and low < queue.visible_end:
                raise PreconditionFailed(
                    f"queue {topic}/{queue_id} still has {queue.visible_end - low} "
                    "unconsumed messages"
                )
            self._save_topics({**self._topics, topic: meta.without_queue(queue_id)})
            self._queues.pop((topic, queue_id)).index.destroy()
            self._offsets.forget(topic, queue_id)

    def topics(self) -> list[TopicMeta]:
        with self._lock:
            return sorted(self._topics.values(), key=lambda t: t.name)

    def topic(self, name: str) -> TopicMeta:
        with self._lock:
            return self._topic(name)

    def queue_info(self, topic: str, queue_id: int) -> QueueInfo:
        with self._lock:
            qmeta = self._queue_meta(self._topic(topic), queue_id)
            queue = self._queues[(topic, queue_id)]
            return QueueInfo(
                topic,
                queue_id,
                queue.index.earliest,
                queue.visible_end,
                qmeta.producer_visible,
                qmeta.consumer_visible,
            )

    def _topic(self, name: str) -> TopicMeta:
        self._check_open()
        meta = self._topics.get(name)
        if meta is None:
            validate_topic(name)
            raise NotFound(f"topic {name!r} does not exist")
        return meta

    def _queue_meta(self, meta: TopicMeta, queue_id: int) -> QueueMeta:
        qmeta = meta.queue(queue_id) if isinstance(queue_id, int) else None
        if qmeta is None:
            raise NotFound(f"topic {meta.name!r} has no queue {queue_id!r}")
        return qmeta

    def _check_queue_count(self, name: str, count: int) -> None:
        if not isinstance(count, int) or not 1 <= count <= self.config.max_queues_per_topic:
            raise LimitExceeded(
                f"topic {name!r}: queue count {count!r} outside [1, "
                f"{self.config.max_queues_per_topic}] (max_queues_per_topic)"
            )

    def _open_queues(self, topic: str, queue_ids: list[int], before: dict[str, TopicMeta]) -> None:
        """Open new queues' indexes; if that fails, put the metadata back (lock held)."""
        try:
            for queue_id in queue_ids:
                self._open_queue(topic, queue_id)
        except OSError as exc:
            for queue_id in queue_ids:
                queue = self._queues.pop((topic, queue_id), None)
                if queue is not None:
                    queue.index.release()
            self._save_topics(before)
            raise io_error(f"the index of {topic}", exc) from exc

    def _save_topics(self, topics: dict[str, TopicMeta]) -> None:
        """Persist ``topics``, then make them the store's (lock held)."""
        try:
            save_topics(self.config.data_dir / "topics.json", topics)
        except OSError as exc:
            raise io_error("topics.json", exc) from exc
        self._topics = topics

    # -- appends ----------------------------------------------------------------------

    def append(self, topic: str, queue_id: int, batch: MessageBatch) -> AppendResult:
        """Append ``batch`` to one queue at consecutive offsets, all or nothing.

        Returns after the records are written (async) or durable (sync). In
        sync mode the write itself runs on the committer thread, batched with
        other appends into one fsync (see ``SyncCommitter``).
        """
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            with self._lock:
                queue = self._writable_queue(topic, queue_id)  # raises the precise error
        prepared = prepare_batch(batch, queue.topic_bytes, self.config.limits)
        if self._committer is None:
            with self._lock:
                result = self._write(self._writable_queue(topic, queue_id), prepared)
                queue.visible_end = end = queue.index.end
            if self._listeners:
                self._notify([(queue, end)])
            return result
        self._check_open()
        work = functools.partial(self._write_pending, topic, queue_id, prepared)
        outcome = self._committer.submit(work, self.config.sync_timeout_ms / 1000)
        assert isinstance(outcome, AppendResult)
        return outcome

    def prepare(self, topic: str, queue_id: int, batch: MessageBatch) -> PreparedBatch:
        """Check ``batch`` as ``append`` would, without writing it (for staging)."""
        with self._lock:
            queue = self._writable_queue(topic, queue_id)
        return prepare_batch(batch, queue.topic_bytes, self.config.limits)

    def append_atomically(
        self,
        queues: Sequence[tuple[str, int]],
        decide: Callable[[dict[tuple[str, int], int]], None],
        batches: Callable[[], Iterable[tuple[str, int, EncodedBatch]]],
        resume: bool = False,
    ) -> dict[tuple[str, int], int]:
        """Append encoded batches (``record.EncodedBatch``) to several queues as
        one unit; return each queue's first new offset.

        No other append runs in between, and readers see the new records of
        every queue at once. First every queue is checked writable, then
        ``decide(first offsets)`` runs with each queue's current end (the
        transaction layer makes its commit decision durable there, or measures
        what a roll-forward still has to append), then every batch from
        ``batches()`` is written.
        An error after ``decide`` leaves a prefix written (and readable): the
        caller rolls the rest forward from its decision; until a call with
        ``resume`` succeeds, those queues refuse other appends (which would
        break the roll-forward's arithmetic).
        """
        keys = list(dict.fromkeys(queues))

        def work() -> dict[tuple[str, int], int]:
            targets = {key: self._writable_queue(*key, resuming=resume) for key in keys}
            firsts = {key: queue.index.end for key, queue in targets.items()}
            decide(firsts)
            try:
                for topic, queue_id, batch in batches():
                    queue = targets.get((topic, queue_id))
                    if queue is None:
                        raise InvalidArgument(f"queue {topic}/{queue_id} was not declared")
                    self._write_encoded(queue, batch)
                self._blocked.difference_update(keys)
            except BaseException:
                self._blocked.update(keys)
                raise
            finally:
                if self._committer is not None:
                    position = self._log.write_position
                    self._pending.extend((position, q, q.index.end) for q in targets.values())
                else:
                    for q in targets.values():
                        q.visible_end = q.index.end
            return firsts

        if self._committer is None:
            with self._lock:
                try:
                    return work()
                finally:
                    if self._listeners:
                        self._notify([(q, q.visible_end) for q in self._queues_of(keys)])
        self._check_open()
        # A commit waits for its own appends however large (bounded: an hour);
        # a roll-forward measures what is appended inside ``work``, so a retry
        # after a timeout cannot append anything twice.
        outcome = self._committer.submit(work, max(self.config.sync_timeout_ms / 1000, 3600))
        assert isinstance(outcome, dict)
        return outcome

    def unblock(self, topic: str, queue_id: int) -> None:
        """Let a queue take appends again (its interrupted commit is resolved)."""
        with self._lock:
            self._blocked.discard((topic, queue_id))

    def _queues_of(self, keys: Iterable[tuple[str, int]]) -> list[_Queue]:
        return [q for q in map(self._queues.get, keys) if q is not None]

    def _write_pending(self, topic: str, queue_id: int, prepared: PreparedBatch) -> AppendResult:
        """Sync mode, on the committer thread: write; readable once the round is durable."""
        queue = self._writable_queue(topic, queue_id)
        result = self._write(queue, prepared)
        self._pending.append((self._log.write_position, queue, queue.index.end))
        return result

    def _commit_round(self, works: list[Callable[[], object]]) -> list[object]:
        """Run a round of sync-mode appends, then fsync once for all of them."""
        outcomes: list[object] = []
        with self._lock:
            start = self._log.write_position
            for work in works:
                try:
                    outcomes.append(work())
                except Exception as exc:
                    outcomes.append(exc)
            target = self._log.write_position
        try:
            self._commit.make_durable(target)
        except OSError as exc:
            self._abandon_round(start, exc)
            raise io_error("the message log (fsync)", exc) from exc
        return outcomes

    def _abandon_round(self, start: int, cause: OSError) -> None:
        """Sync mode, the round's fsync failed: its appends were not made durable,
        so they must never become readable, now or after a restart. Cut them out
        of the log and refuse writes until a restart (after a failed fsync the
        kernel's view of the file cannot be trusted; recovery rebuilds it)."""
        with self._lock:
            self._failed = cause
            self._pending = deque(p for p in self._pending if p[0] <= start)
            try:
                if self._log.start_of(self._log.active) <= start < self._log.write_position:
                    self._log.truncate(start)
            except OSError as exc:
                log.error("cannot cut a failed round out of the log: %s", exc)
        log.error("fsync failed (%s); the store refuses writes until restarted", cause)

    def _writable_queue(self, topic: str, queue_id: int, resuming: bool = False) -> _Queue:
        self._check_writable()
        queue = self._queues.get((topic, queue_id))
        if queue is None:  # find out why, for the error message
            self._queue_meta(self._topic(topic), queue_id)
            raise NotFound(f"queue {topic}/{queue_id} does not exist")
        if self._blocked and not resuming and (topic, queue_id) in self._blocked:
            raise StorageError(
                f"queue {topic}/{queue_id} takes no appends until an interrupted "
                "transaction commit is completed (retried in the background)"
            )
        if not queue.producer_visible and not resuming:  # a decided commit still completes
            raise PreconditionFailed(f"queue {topic}/{queue_id} is hidden from producers")
        return queue

    def _write(self, queue: _Queue, prepared: PreparedBatch) -> AppendResult:
        count = len(prepared.batch)
        entries = bytearray(count * ENTRY_SIZE)
        first_offset = queue.index.end
        store_ms = self._last_store_ms = max(_now_ms(), self._last_store_ms)
        fixed = FRAME_OVERHEAD + len(queue.topic_bytes)

        def sizes(start: int) -> Iterator[int]:
            all_sizes = frame_sizes(prepared.batch, prepared.tags, prepared.headers, fixed)
            return itertools.islice(all_sizes, start, None)

        def write(start: int, stop: int, size: int) -> None:
            self._write_piece(
                queue, prepared, start=start, stop=stop, size=size,
                first_offset=first_offset, store_ms=store_ms, entries=entries,
            )  # fmt: skip

        self._write_in_pieces(queue.topic, prepared.total_bytes, count, sizes, write)
        return AppendResult(queue.topic, queue.queue_id, first_offset, count, entries)

    def _write_encoded(self, queue: _Queue, batch: EncodedBatch) -> None:
        """Append records encoded ahead (a transaction's)."""
        first_offset = queue.index.end
        store_ms = self._last_store_ms = max(_now_ms(), self._last_store_ms)

        def sizes(start: int) -> Iterator[int]:
            return itertools.islice(batch.frame_sizes(), start, None)

        def write(start: int, stop: int, size: int) -> None:
            piece = batch.slice(start, stop)
            assert piece.total_bytes == size
            self._write_rebased(queue, piece, first_offset + start, store_ms)

        self._write_in_pieces(queue.topic, batch.total_bytes, batch.count, sizes, write)

    def _write_in_pieces(
        self,
        topic: str,
        total: int,
        count: int,
        sizes: Callable[[int], Iterator[int]],
        write: Callable[[int, int, int], None],
    ) -> None:
        """How every append is laid out: in one piece when it fits the active
        chunk, else in one piece at the start of a new chunk, else (larger than
        a chunk) split at record boundaries, one atomic piece per chunk.
        ``write(start, stop, bytes)`` writes records ``[start, stop)``;
        ``sizes(start)`` gives frame sizes from ``start`` (a Python loop, only
        for appends larger than a chunk)."""
        if total > self._log.room() and total <= self._log.capacity:
            self._roll(topic)  # keep the append in one chunk, so it stays atomic
        if total <= self._log.room():  # the common case
            write(0, count, total)
            return
        start = 0
        while start < count:
            room = self._log.room()
            stop, used = start, 0
            for size in sizes(start):
                if used + size > room:
                    break
                used += size
                stop += 1
            if stop == start:
                assert room < self._log.capacity, "a record larger than a chunk"
                self._roll(topic)
                continue
            write(start, stop, used)
            start = stop

    def _write_rebased(
        self, queue: _Queue, batch: EncodedBatch, first_offset: int, store_ms: int
    ) -> None:
        entries = bytearray(batch.count * ENTRY_SIZE)

        def encode(out: memoryview, position: int) -> int:
            return rebase_records(
                out, batch, position=position, first_offset=first_offset,
                store_ms=store_ms, index_out=entries,
            )  # fmt: skip

        def bad(exc: Exception) -> Exception:
            return CorruptionError(f"staged records of {queue.topic}: {exc}")

        self._append_indexed(queue, batch.total_bytes, encode, first_offset, entries, bad)

    def _write_piece(
        self, queue: _Queue, prepared: PreparedBatch, *, start: int, stop: int, size: int,
        first_offset: int, store_ms: int, entries: bytearray,
    ) -> None:  # fmt: skip
        entry_view = memoryview(entries)[start * ENTRY_SIZE : stop * ENTRY_SIZE]

        def encode(out: memoryview, position: int) -> int:
            return encode_records(
                out, position=position, topic=queue.topic_bytes, queue_id=queue.queue_id,
                first_offset=first_offset + start, store_ms=store_ms, prepared=prepared,
                start=start, stop=stop, index_out=entry_view,
            )  # fmt: skip

        def bad(exc: Exception) -> Exception:  # e.g. a bad timestamp
            return InvalidArgument(f"bad message batch: {exc}")

        self._append_indexed(queue, size, encode, first_offset + start, entry_view, bad)

    def _append_indexed(  # noqa: PLR0917 (private, called in two places)
        self,
        queue: _Queue,
        size: int,
        encode: Callable[[memoryview, int], int],
        first_offset: int,
        entries: bytearray | memoryview,
        bad_input: Callable[[Exception], Exception],
    ) -> None:
        """Append ``size`` bytes that ``encode`` writes, then their index
        ``entries``; an index write that fails undoes the log write. An encoder
        refusing its input raises ``bad_input(exc)``; I/O errors raise ``io_error``."""
        try:
            position = self._log.append(size, encode)
        except (TypeError, ValueError, OverflowError) as exc:
            raise bad_input(exc) from None
        except OSError as exc:
            raise io_error(queue.topic, exc) from exc
        try:
            queue.index.write(first_offset, entries)
        except OSError as exc:
            self._undo_write(position, exc)
            raise io_error(queue.topic, exc) from exc

    def _roll(self, topic: str) -> None:
        try:
            self._log.roll()
        except OSError as exc:
            raise io_error(topic, exc) from exc

    def _undo_write(self, position: int, cause: OSError) -> None:
        """Cut a failed append out of the log; if even that fails, stop accepting writes."""
        try:
            if self._log.write_position > position:
                self._log.truncate(position)
        except OSError as exc:
            log.error("cannot undo a failed append (%s); store refuses writes until restart", exc)
            self._failed = cause

    def _sync_target(self) -> tuple[int, int]:
        with self._lock:
            return self._log.sync_target()

    def _publish_durable(self, durable: int) -> None:
        """Make records below ``durable`` (now fsynced) readable; sync mode."""
        changed = []
        with self._lock:
            while self._pending and self._pending[0][0] <= durable:
                _, queue, end = self._pending.popleft()
                if end > queue.visible_end:
                    queue.visible_end = end
                    changed.append((queue, end))
        if self._listeners:
            self._notify(changed)

    def add_listener(self, listener: Listener) -> None:
        """Register ``listener(topic, queue_id, visible_end)`` for newly readable records.

        Called on the appending (or flushing) thread, outside the store lock;
        it must be quick and must not raise.
        """
        self._listeners.append(listener)

    def _notify(self, changes: Iterable[tuple[_Queue, int]]) -> None:
        # Appending threads race to get here: the notify lock plus the per-queue
        # mark make every listener see each queue's ends strictly increasing.
        with self._notify_lock:
            for queue, end in changes:
                if end <= queue.notified_end:
                    continue
                queue.notified_end = end
                for listener in self._listeners:
                    listener(queue.topic, queue.queue_id, end)

    # -- reads -----------------------------------------------------------------------

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
        by_hash = self._tag_filter(tags)
        wanted = frozenset(t.decode() for ts in by_hash.values() for t in ts) if by_hash else None
        hashes = frozenset(by_hash) if by_hash else None
        with self._lock:
            queue, earliest, end, status, corrected = self._locate(topic, queue_id, offset)
            if status is not ReadStatus.OK:
                return ReadResult(status, [], corrected, earliest, end)
            messages, next_offset = self._collect(
                queue, offset=offset, end=end, max_messages=max_messages,
                max_bytes=max_bytes, wanted=wanted, hashes=hashes,
            )  # fmt: skip
            return ReadResult(ReadStatus.OK, messages, next_offset, earliest, end)

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
    ) -> RecordsResult:
        """Like ``read``, but return the records as stored (the record format of
        ``record.py``, concatenated) instead of decoding them.

        Records appended together lie next to each other in the log, so this
        copies whole runs: no Python object per message. It serves pulls.

        With ``frame``, ``records`` is ``prefix + records + suffix`` for the
        (prefix, suffix) that ``frame`` returns for the read: one copy from the
        log builds a caller's whole reply (the broker's pre-encoded PullReply).
        """
        self._check_read_limits(offset, max_messages, max_bytes)
        wanted = self._tag_filter(tags)
        with self._lock:
            queue, earliest, end, status, corrected = self._locate(topic, queue_id, offset)
            if status is not ReadStatus.OK:
                pieces: list[Piece] = []
                count, nbytes, next_offset = 0, 0, corrected
            elif wanted is None:
                pieces, count, nbytes, next_offset = self._collect_runs(
                    queue, offset=offset, end=end, max_messages=max_messages, max_bytes=max_bytes
                )
            else:
                pieces, count, nbytes, next_offset = self._collect_filtered(
                    queue, offset=offset, end=end, max_messages=max_messages,
                    max_bytes=max_bytes, wanted=wanted,
                )  # fmt: skip
            result = RecordsResult(status, b"", count, next_offset, earliest, end, nbytes)
            if frame is not None:
                prefix, suffix = frame(result)
                pieces = [prefix, *pieces, suffix]
            # One copy out of the maps, made while the lock keeps them mapped.
            return dataclasses.replace(result, records=b"".join(pieces))

    def _locate(
        self, topic: str, queue_id: int, offset: int
    ) -> tuple[_Queue, int, int, ReadStatus, int]:
        """(queue, earliest, end, status, offset to report) of a read (lock held).

        Out-of-range offsets are answered with the earliest or the end."""
        self._queue_meta(self._topic(topic), queue_id)
        queue = self._queues[(topic, queue_id)]
        earliest, end = queue.index.earliest, queue.visible_end
        if offset < earliest:
            return queue, earliest, end, ReadStatus.OFFSET_TOO_SMALL, earliest
        if offset > end:
            return queue, earliest, end, ReadStatus.OFFSET_TOO_BIG, end
        return queue, earliest, end, ReadStatus.OK, offset

    def _tag_filter(self, tags: Iterable[str] | None) -> dict[int, frozenset[bytes]] | None:
        """{tag hash: tag strings with that hash} for a tag-filtered read, else None."""
        if tags is None:
            return None
        encoded = frozenset(t.encode() for t in tags)
        if not encoded:
            raise InvalidArgument("tags must name at least one tag (None reads every message)")
        by_hash: dict[int, set[bytes]] = {}
        for tag in encoded:
            by_hash.setdefault(crc32c(tag), set()).add(tag)
        return {h: frozenset(v) for h, v in by_hash.items()}

    def _collect_runs(
        self, queue: _Queue, *, offset: int, end: int, max_messages: int, max_bytes: int
    ) -> tuple[list[Piece], int, int, int]:
        """(pieces, count, bytes, next offset) of an unfiltered read: the index
        is planned into runs of adjacent records (``index_runs``, in C), and
        each run becomes one view of the log; no per-record Python work."""
        pieces: list[Piece] = []
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
                    pieces = [bytes(p) for p in pieces]
                mapped_chunk = start // capacity
                self._log.check_record(start, queue.topic_bytes, queue.queue_id, cursor + first)
                pieces.append(self._log.copy(start, stop_at))
            cursor += taken
            if stop == RUNS_EMPTY:
                raise CorruptionError(
                    f"index entry for offset {cursor} of {queue.topic}/{queue.queue_id} is empty"
                )
            if stop == RUNS_LIMIT or not entries:
                break
        return pieces, count, total, cursor

    def _collect_filtered(
        self, queue: _Queue, *, offset: int, end: int, max_messages: int, max_bytes: int,
        wanted: dict[int, frozenset[bytes]],
    ) -> tuple[list[Piece], int, int, int]:  # fmt: skip
        """``_collect_runs`` for a tag-filtered read: entry by entry, as skipped
        records break runs (scans at most ``max_filter_scan`` entries)."""
        out = bytearray()
        count = total = 0
        run_start = run_end = -1
        scan_end = min(end, offset + self.config.max_filter_scan)
        cursor = offset
        capacity = self._log.capacity
        while cursor < scan_end and count < max_messages:
            entries = queue.index.read(cursor, scan_end - cursor)
            if not entries:
                break
            for position_plus_one, size, tag_hash, _ts in entries:
                position = position_plus_one - 1
                if tag_hash not in wanted or self._log.tag_at(position) not in wanted[tag_hash]:
                    cursor += 1
                    continue
                if count and total + size > max_bytes:
                    scan_end = cursor  # stop both loops
                    break
                if position != run_end or position % capacity == 0:  # a new run
                    if run_end > run_start:
                        out += self._log.copy(run_start, run_end)
                    self._log.check_record(position, queue.topic_bytes, queue.queue_id, cursor)
                    run_start = position
                    run_end = position
                run_end += size
                count += 1
                total += size
                cursor += 1
                if count >= max_messages:
                    break
        if run_end > run_start:
            out += self._log.copy(run_start, run_end)
        return [out], count, total, cursor

    def _collect(
        self, queue: _Queue, *, offset: int, end: int, max_messages: int, max_bytes: int,
        wanted: frozenset[str] | None, hashes: frozenset[int] | None,
    ) -> tuple[list[StoredMessage], int]:  # fmt: skip
        messages: list[StoredMessage] = []
        total = 0
        scan_end = min(
            end, offset + (self.config.max_filter_scan if hashes is not None else max_messages)
        )
        cursor = offset
        while cursor < scan_end:
            for position_plus_one, size, tag_hash, _ts in queue.index.read(
                cursor, scan_end - cursor
            ):
                if hashes is not None and tag_hash not in hashes:
                    cursor += 1
                    continue
                if messages and total + size > max_bytes:
                    return messages, cursor
                message = self._log.read(position_plus_one - 1, size)
                if message.queue_offset != cursor or message.topic != queue.topic:
                    raise CorruptionError(
                        f"index of {queue.topic}/{queue.queue_id} offset {cursor} points at a "
                        f"record of {message.topic}/{message.queue_id} "
                        f"offset {message.queue_offset}",
                        str(queue.index.directory),
                        cursor,
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
        if not isinstance(offset, int) or offset < 0:
            raise InvalidArgument(f"offset must be a non-negative integer, got {offset!r}")
        if not 1 <= max_messages <= self.config.max_read_messages:
            raise InvalidArgument(
                f"max_messages {max_messages} outside [1, {self.config.max_read_messages}]"
            )
        if not 1 <= max_bytes <= self.config.max_read_bytes:
            raise InvalidArgument(
                f"max_bytes {max_bytes} outside [1, {self.config.max_read_bytes}]"
            )

    def read_at_position(self, position: int) -> StoredMessage:
        """The message stored at a global log position (message ids carry it).

        ``NotFound`` unless a record of a live queue starts there (its queue's
        index says so); ``CorruptionError`` if that record fails its checksum.
        """
        with self._lock:
            self._check_open()
            if not isinstance(position, int) or not (
                self._log.start_position <= position < self._log.write_position
            ):
                raise NotFound(f"no message at log position {position!r}")
            size = self._indexed_size(position)
            if size is None:
                raise NotFound(f"no message at log position {position!r}")
            return self._log.read(position, size)

    def _indexed_size(self, position: int) -> int | None:
        """Size of the record at ``position`` if a queue's index points at it."""
        try:
            meta = self._log.meta_at(position)
            queue = self._queues.get((meta.topic.decode(), meta.queue_id))
        except (CorruptionError, UnicodeDecodeError, struct.error):
            return None
        if queue is None or not queue.index.earliest <= meta.queue_offset < queue.visible_end:
            return None
        position_plus_one, size, _tag, _ts = queue.index.entry(meta.queue_offset)
        return size if position_plus_one - 1 == position else None

    def record_at(self, position: int) -> bytes:
        """The stored bytes of the record at ``position`` (see ``read_at_position``)."""
        with self._lock:
            self._check_open()
            size = None
            if isinstance(position, int) and (
                self._log.start_position <= position < self._log.write_position
            ):
                size = self._indexed_size(position)
            if size is None:
                raise NotFound(f"no message at log position {position!r}")
            return bytes(self._log.copy(position, position + size))

    def position_of(self, topic: str, queue_id: int, offset: int) -> int:
        """Log position of a queue offset (``NotFound`` outside [earliest, end))."""
        with self._lock:
            self._queue_meta(self._topic(topic), queue_id)
            queue = self._queues[(topic, queue_id)]
            if not isinstance(offset, int) or not (
                queue.index.earliest <= offset < queue.visible_end
            ):
                raise NotFound(
                    f"{topic}/{queue_id} has no offset {offset!r} (retained: "
                    f"[{queue.index.earliest}, {queue.visible_end}))"
                )
            return queue.index.entry(offset)[0] - 1

    def visible_end(self, topic: str, queue_id: int) -> int:
        """The queue's readable end, read without the lock (a snapshot, for long
        polls that must not block); -1 if the queue does not exist."""
        queue = self._queues.get((topic, queue_id))
        return -1 if queue is None else queue.visible_end

    def offset_for_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """First offset whose store time is >= ``timestamp_ms`` (the end if none)."""
        with self._lock:
            self._queue_meta(self._topic(topic), queue_id)
            queue = self._queues[(topic, queue_id)]
            found = queue.index.first_offset_where(queue.index.earliest, 3, timestamp_ms)
            return min(found, queue.visible_end)

    def offset_for_bytes(
        self, topic: str, queue_id: int, start: int, end: int, max_bytes: int
    ) -> tuple[int, int]:
        """Where a byte budget read from ``start`` stops: ``(stop, bytes)`` with
        ``stop`` the largest offset <= ``end`` (clipped to the readable end) such
        that the records of ``[start, stop)`` total at most ``max_bytes`` stored
        bytes, but at least one record past ``start`` when there is one, so a
        budget smaller than a record still makes progress.

        Sizes come from the index alone (no log reads).
        """
        if max_bytes < 1:
            raise InvalidArgument(f"max_bytes must be at least 1, got {max_bytes}")
        with self._lock:
            self._queue_meta(self._topic(topic), queue_id)
            queue = self._queues[(topic, queue_id)]
            earliest, visible = queue.index.earliest, queue.visible_end
            if not earliest <= start <= visible:
                raise InvalidArgument(
                    f"start offset {start} for {topic}/{queue_id} outside [{earliest}, {visible}]"
                )
            end = min(max(end, start), visible)
            offset, total = start, 0
            while offset < end:  # bounded: every round consumes >= 1 entry
                sizes = queue.index.record_sizes(offset, min(end - offset, 65_536))
                if not sizes:
                    break
                # sums[k] = bytes of [start, offset + k): a C-speed prefix sum + bisect.
                sums = list(itertools.accumulate(sizes, initial=total))
                taken = bisect.bisect_right(sums, max_bytes) - 1
                if offset == start:
                    taken = max(taken, 1)
                if taken < len(sizes):
                    return offset + taken, sums[taken]
                offset, total = offset + len(sizes), sums[-1]
            return offset, total

    # -- consumer offsets --------------------------------------------------------------

    def commit_offset(self, group: str, topic: str, queue_id: int, next_offset: int) -> None:
        """Record that ``group`` will next consume ``next_offset`` of the queue."""
        self.commit_offsets(group, [(topic, queue_id, next_offset)])

    def commit_offsets(self, group: str, offsets: Iterable[tuple[str, int, int]]) -> None:
        """Commit several (topic, queue_id, next_offset) at once: all are checked
        before any is recorded, and sync mode persists them with one write."""
        validate_group(group)
        with self._lock:
            checked = []
            for topic, queue_id, next_offset in offsets:
                self._queue_meta(self._topic(topic), queue_id)
                end = self._queues[(topic, queue_id)].visible_end
                if not isinstance(next_offset, int) or not 0 <= next_offset <= end:
                    raise InvalidArgument(
                        f"offset {next_offset!r} for {topic}/{queue_id} outside [0, {end}]"
                    )
                checked.append((topic, queue_id, next_offset))
            for topic, queue_id, next_offset in checked:
                self._offsets.commit(group, topic, queue_id, next_offset)
        if self.config.flush_mode is FlushMode.SYNC:
            self._persist_offsets()

    def _persist_offsets(self) -> None:
        try:
            self._offsets.persist()
        except OSError as exc:
            raise io_error("offsets.json", exc) from exc

    def min_committed(self, topic: str, queue_id: int) -> int | None:
        """Lowest offset any group committed on the queue (None if none did)."""
        return self._offsets.min_committed(topic, queue_id)

    def committed_offsets(self, group: str) -> GroupOffsets:
        validate_group(group)
        return self._offsets.get(group)

    def groups(self) -> list[str]:
        return self._offsets.groups()

    def delete_group(self, group: str) -> None:
        validate_group(group)
        if not self._offsets.delete_group(group):
            raise NotFound(f"group {group!r} has no committed offsets")
        self._persist_offsets()

    # -- durability and maintenance ----------------------------------------------------

    def flush(self) -> None:
        """Make everything written so far durable, and advance the index checkpoint."""
        with self._lock:
            self._check_open()
            target = self._log.write_position
            fds = [fd for q in self._queues.values() for fd in q.index.take_dirty()]
        try:
            self._commit.make_durable(target)
            for fd in fds:
                os.fsync(fd)
        except OSError as exc:
            if self.config.flush_mode is FlushMode.SYNC:
                with self._lock:
                    self._failed = self._failed or exc
            raise io_error("the message log or an index (fsync)", exc) from exc
        finally:
            for fd in fds:
                os.close(fd)
        # Every index entry of a record below `target` was written before the
        # dirty index files were collected, and is now fsynced. (The durable log
        # position may be further on, but entries beyond `target` are not synced.)
        # The save runs outside the store lock: it costs several fsyncs.
        with self._checkpoint_lock:
            if target > self._checkpoint and not self._closed:
                self._checkpoint = target
                self._save_checkpoint()
        self._offsets.persist()

    def _save_checkpoint(self) -> None:
        save_json(self.config.data_dir / "checkpoint.json", {"index_position": self._checkpoint})

    def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Delete completed log chunks the retention rules allow, then the index
        chunks that only point into deleted log chunks."""
        rules = self.config.retention
        now = _now_ms() if now_ms is None else now_ms
        self.flush()
        with self._lock:
            needed = self._oldest_unconsumed_position() if rules.keep_unconsumed else None
            deleted = 0
            while len(self._log.chunks) > 1:
                chunk = self._log.chunks[0]
                sealed = len(self._log.chunks) - 1
                by_count = rules.max_chunks is not None and sealed > rules.max_chunks
                by_age = (
                    rules.max_age_ms is not None
                    and now - (chunk.sealed_ms or now) > rules.max_age_ms
                )
                if not (by_count or by_age):
                    break
                if needed is not None and self._log.start_of(chunk) + chunk.data_size > needed:
                    break
                self._log.delete_oldest()
                deleted += 1
            index_deleted = 0
            if deleted:
                for queue in self._queues.values():
                    index_deleted += queue.index.delete_chunks_below(self._log.start_position)
            return RetentionReport(deleted, index_deleted, self._log.start_position)

    def _oldest_unconsumed_position(self) -> int:
        """Lowest log position of a record some group committed on but has not consumed."""
        needed = self._log.write_position
        for (topic, queue_id), queue in self._queues.items():
            low = self._offsets.min_committed(topic, queue_id)
            if low is not None and max(low, queue.index.earliest) < queue.index.end:
                needed = min(needed, queue.index.entry(max(low, queue.index.earliest))[0] - 1)
        return needed

    def _maintain(self) -> None:
        """The background thread: flush, persist offsets, expire transactions,
        apply retention. Each step runs even if another failed (retention and
        expiry free the disk space whose lack may be why a flush fails)."""
        interval = self.config.flush_interval_ms / 1000
        due = {"offsets": time.monotonic(), "retention": time.monotonic()}
        periods = {
            "offsets": self.config.offsets_flush_interval_ms / 1000,
            "retention": self.config.retention.check_interval_ms / 1000,
        }
        steps: list[tuple[str, Callable[[], object]]] = [
            ("flush", self.flush),
            ("offsets", self._persist_offsets),
            ("transactions", self.transactions.expire),
            ("retention", self.apply_retention),
        ]
        errors: dict[str, str] = {}
        while not self._stop.wait(interval):
            for name, step in steps:
                now = time.monotonic()
                if name in due and now < due[name]:
                    continue
                try:
                    step()
                except StoreClosed:
                    return
                except Exception as exc:  # logged once per distinct failure, not per interval
                    if errors.get(name) != str(exc):
                        log.error("background %s failed (retrying): %s", name, exc,
                                  exc_info=not isinstance(exc, StorageError))  # fmt: skip
                        errors[name] = str(exc)
                    continue
                errors.pop(name, None)
                if name in due:
                    due[name] = now + periods[name]

    # -- state -------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "topics": len(self._topics),
                "queues": len(self._queues),
                "groups": len(self._offsets.groups()),
                "log_chunks": len(self._log.chunks),
                "log_start_position": self._log.start_position,
                "log_write_position": self._log.write_position,
                "durable_position": self._commit.durable,
                "fsyncs": self._commit.fsyncs,
                **self.transactions.stats(),
            }

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("the store is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._failed is not None:
            raise StorageError(
                f"store refuses writes after an unrecoverable I/O error: {self._failed}"
            )

    def close(self) -> None:
        """Flush everything, persist offsets, release the data directory."""
        if self._closed:
            return
        self._stop_background()
        self.flush()
        self.transactions.close()
        with self._lock:
            self._closed = True
            for queue in self._queues.values():
                queue.index.close()
            self._log.close()
            self._offsets.persist()
            os.close(self._lock_fd)

    def abandon(self) -> None:
        """Drop the store without flushing anything, as a killed process would.

        For fault-injection tests: what the OS has not been asked to fsync is
        still in the page cache; tests that simulate a machine crash remove it.
        """
        self._stop_background()
        self.transactions.close()
        with self._lock:
            self._closed = True
            self._release_files()

    def _release_files(self) -> None:
        """Close every file without flushing (failed open, abandon)."""
        for queue in self._queues.values():
            queue.index.release()
        if hasattr(self, "_log"):
            self._log.close()
        os.close(self._lock_fd)

    def _stop_background(self) -> None:
        if self._committer is not None:
            self._committer.close()  # finishes the appends already queued
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _lock_data_dir(root: Path) -> int:
    fd = os.open(root / "LOCK", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise PreconditionFailed(f"data directory {root} is in use by another store") from None
    return fd
