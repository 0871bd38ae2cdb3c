"""The store: one data directory's write paths, offsets and lifecycle.

``Store`` opens a data directory and holds its shared state as one
``EngineState`` (engine.py), passed explicitly to the modules that work on
it. It keeps the write paths (``append``, the sync-mode group-commit rounds,
the transaction writes), group-offset admin, and opening, flushing, the
maintenance thread and closing, and exposes its readers: ``store.reads``
(reads.py) and ``store.topic_admin`` (topic_admin.py); ``create_topic``,
``read`` and ``queue_info`` stay here as the embedding API docs/storage.md
documents. The rest depends on that state but never on this module:
recovery.py runs at open, log_writer.py places an append, visibility.py
decides when records become readable, positioned.py works on the log by
position for replication (``append_at``, ``truncate``, ``read_log``),
retention.py deletes expired chunks, and transactions.py reaches the store
through its ``TransactionStore`` protocol. Results are in results.py.

Data directory layout::

    <data_dir>/LOCK                       flock'ed while a store has it open
    <data_dir>/log/<n:09d>.chunk          message log chunks (message_log.py)
    <data_dir>/index/<topic>/<q>/<n>.idx  queue index chunks (queue_index.py)
    <data_dir>/index/.deleted.<hex>/      an index being deleted (deletion.py)
    <data_dir>/timer/wheel, <n:09d>.tlog  delayed records' timer index (timer/wheel.py)
    <data_dir>/keys/<n:09d>.kidx          the key index (keys/key_index.py)
    <data_dir>/topics.json[.bak]          topic/queue metadata (topics.py, topic_admin.py)
    <data_dir>/offsets.json[.bak]         consumer-group offsets (offsets.py)
    <data_dir>/schemas.json[.bak]         topic schemas (schemas.py; ``store.schemas``)
    <data_dir>/checkpoint.json[.bak]      log position below which every index entry is
                                          fsynced, and what is derived from the log as of
                                          it (recovery.py)

Durability (see ``FlushMode``): in sync mode an append returns after an fsync
of its records (group commit), and readers see only durable records; in async
mode appends are visible at once and fsynced every ``flush_interval_ms``.
Committed offsets are persisted before a commit returns in sync mode.

Thread safety: every public method may be called from any thread. The
engine state's ``lock`` (reentrant) guards the log, the queues and the
topics: a private method here that says "lock held" must be called with it
held, as must what engine.py lists (its lookups, ``LogWriter``,
``delete_expired``, positioned.py, the private methods of ``Reads``, the
changes of ``TopicAdmin``), which assert it. Its ``admin_lock`` serialises
topic and queue deletes and (re)creations (topic_admin.py). Listeners are
called outside ``lock``, under ``notify_lock`` (engine.py);
``_checkpoint_lock`` orders checkpoint saves.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from equeue_broker.storage.config import FlushMode, StorageConfig
from equeue_broker.storage.damage import Damage
from equeue_broker.storage.deletion import sweep
from equeue_broker.storage.engine import EngineState, Listener, release_files
from equeue_broker.storage.epochs import EpochHistory, prepare_marker
from equeue_broker.storage.errors import io_error
from equeue_broker.storage.group_offsets import GroupOffsetsApi
from equeue_broker.storage.index.queue_index import ENTRY_SIZE
from equeue_broker.storage.index.queue_state import QueueKey, QueueState, first_offset_at
from equeue_broker.storage.keys.key_index import KeyIndex
from equeue_broker.storage.keys.query import KeyQuery
from equeue_broker.storage.log.flush import FsyncTimes, SyncCommitter, Then
from equeue_broker.storage.log.log_writer import LogWriter
from equeue_broker.storage.log.message_log import SYNC_PREFILL_BYTES, MessageLog
from equeue_broker.storage.log.positioned import LogPiece, append_at, read_piece, truncate_at
from equeue_broker.storage.log.record import MessageBatch, PreparedBatch, prepare_batch
from equeue_broker.storage.maintenance import maintain
from equeue_broker.storage.meta.atomic_file import remove_temp_files
from equeue_broker.storage.meta.data_dir import lock_data_dir
from equeue_broker.storage.meta.offsets import GroupOffsets, OffsetStore
from equeue_broker.storage.meta.schemas import SchemaStore
from equeue_broker.storage.meta.topics import TopicMeta, load_topics
from equeue_broker.storage.producers.records import ProducerBatch, prepare_record
from equeue_broker.storage.producers.table import Idempotence, ProducerTable, repeated_append
from equeue_broker.storage.reads import Reads
from equeue_broker.storage.recovery import Checkpoint, recover, save_checkpoint
from equeue_broker.storage.results import (
    AppendResult,
    QueueInfo,
    ReadResult,
    RetentionReport,
)
from equeue_broker.storage.retention import delete_expired
from equeue_broker.storage.rounds import abandon_round
from equeue_broker.storage.timer.delivery import DelayedMessage, Delivery, TopicCheck
from equeue_broker.storage.timer.timer import Timer
from equeue_broker.storage.topic_admin import TopicAdmin
from equeue_broker.storage.txn.transactions import Transactions
from equeue_broker.storage.txn.txn_recovery import TxnScan
from equeue_broker.storage.txn.txn_writes import write_commit

log = logging.getLogger(__name__)


class Store(GroupOffsetsApi):
    """A message store rooted at ``config.data_dir``; opens and recovers on creation."""

    def __init__(
        self, config: StorageConfig, background: bool = True, *, delivering: bool = True
    ) -> None:
        self.config = config
        self._checkpoint_lock = threading.Lock()
        root = config.data_dir
        root.mkdir(mode=0o700, parents=True, exist_ok=True)  # data is private to the broker
        self._lock_fd = lock_data_dir(root)
        queues: dict[QueueKey, QueueState] = {}
        message_log: MessageLog | None = None
        self.timer: Timer | None = None  # delayed records (timer/), derived from the log
        key_index = KeyIndex(root / "keys", config.key_index) if config.key_index.enabled else None
        try:
            remove_temp_files(root)
            message_log = MessageLog(
                root / "log", config.chunk_capacity_bytes, config.max_mapped_chunks
            )
            topics, self._topics_lost = load_topics(root / "topics.json")
            offsets = OffsetStore(root / "offsets.json")
            self.schemas = SchemaStore(root / "schemas.json", config)  # topic schemas
            self.schemas.retain({name: meta.incarnation for name, meta in topics.items()})
            sweep(root, topics, offsets)
            self.producers = ProducerTable(config.producers)
            """Idempotent producers' state (producers/table.py): derived from
            the log like the indexes; used with the engine lock held."""
            self.timer = timer = Timer(config.timer, root / "timer", message_log, delivering)
            self.recovery, checkpoint, recovered, saved_at = recover(
                config, message_log, topics.values(), offsets, queues,
                producers=self.producers, timer=timer, keys=key_index,
            )  # fmt: skip
            self.held_high_watermark = checkpoint.held_high_watermark
            """The checkpoint's high watermark, if it held records back when saved:
            the server holds a restarted replica's reads there (``set_hw_limit``)."""
        except BaseException:
            if self.timer is not None:
                self.timer.close()
            if key_index is not None:
                key_index.close()
            release_files(self._lock_fd, queues, message_log)
            raise
        self._snapshot_version = -1
        self._snapshot: list[Any] = []
        self._state = state = EngineState(config, message_log, offsets, queues, topics, saved_at)
        state.keys = key_index
        self._writer = LogWriter(state)
        self._topic_admin = TopicAdmin(
            state, flush=self.flush, persist_offsets=self._persist_offsets,
            forget_schemas=self.schemas.forget_topic,
        )  # fmt: skip
        self._reads = Reads(state)
        self.keys = KeyQuery(state, self._reads, key_index)
        """Queries by key and by time (keys/query.py)."""
        self._committer: SyncCommitter | None = None
        if state.sync_flush:
            message_log.prefill_bytes = SYNC_PREFILL_BYTES
            self._committer = SyncCommitter(self._commit_round, self._prefill_log)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.transactions = Transactions(self, config.transactions, recovered)
        self.epochs = EpochHistory(list(checkpoint.epochs))
        """The log's epoch markers (epochs.py): derived from the log like the indexes."""
        self.delivery = Delivery(state, self._writer, timer, self.producers, self.commit_staged)
        if background:
            self.delivery.start()
            self._thread = threading.Thread(target=self._maintain, name="equeue-store", daemon=True)
            self._thread.start()

    # -- the readers: reads.py and topic_admin.py document and implement them ---------

    @property
    def reads(self) -> Reads:
        """Reads and lookups (reads.py): ``read``, ``read_records``,
        ``read_at_position``, ``record_at``, ``position_of``, ``visible_end``,
        ``offset_for_timestamp``, ``offset_for_bytes``, ``store_time``."""
        return self._reads

    @property
    def topic_admin(self) -> TopicAdmin:
        """Topic and queue admin (topic_admin.py): ``create_topic``,
        ``delete_topic``, ``add_queues``, ``set_queue_visibility``,
        ``delete_queue``, ``listing``, ``describe``, ``queue_info``, ``adopt``."""
        return self._topic_admin

    # The embedding API of docs/storage.md (and examples/storage_quickstart.py)
    # names these three on the store itself; the broker uses the readers.

    def create_topic(self, name: str, queue_count: int | None = None) -> TopicMeta:
        """``topic_admin.create_topic``."""
        return self._topic_admin.create_topic(name, queue_count)

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
        """``reads.read``: messages of a queue from ``offset``."""
        return self._reads.read(
            topic, queue_id, offset, max_messages=max_messages, max_bytes=max_bytes, tags=tags
        )

    def queue_info(self, topic: str, queue_id: int) -> QueueInfo:
        """``topic_admin.queue_info``: a queue's earliest and end offsets, visibility."""
        return self._topic_admin.queue_info(topic, queue_id)

    # -- appends ----------------------------------------------------------------------

    def append(
        self, topic: str, queue_id: int, batch: MessageBatch, idem: Idempotence | None = None,
        *, deliver_at_ms: Sequence[int] | None = None,
    ) -> AppendResult:  # fmt: skip
        """Append ``batch`` to one queue at consecutive offsets, all or nothing.

        Returns after the records are written (async) or durable (sync). In
        sync mode the write itself runs on the committer thread, batched with
        other appends into one fsync (see ``SyncCommitter``).

        ``idem``: an idempotent producer's batch (producers/table.py): a
        repeat of one of its last batches to this queue is not written again,
        the result is the original's (``AppendResult.duplicate``).

        ``deliver_at_ms``: delayed records (timer/delivery.py), a due time for the
        batch or per message; ``first_offset`` -1 (``positions()`` hold).
        """
        queue = self._state.queues.get((topic, queue_id))
        if queue is None:
            with self._state.lock:
                queue = self._state.writable_queue(topic, queue_id)  # raises the precise error
        prepared = prepare_batch(batch, queue.topic_bytes, self.config.limits)
        if deliver_at_ms is not None:
            work = self.delivery.work((topic, queue_id), prepared, deliver_at_ms, idem)
            if self._committer is None:
                with self._state.lock:
                    return work()
        elif self._committer is None:
            with self._state.lock:
                result = self._write_locked(topic, queue_id, prepared, idem)
                if result.duplicate:
                    return result
                if self._state.visibility.limit is None:
                    queue.visible_end = end = queue.index.end
                    changed = [(queue, end)]
                else:  # sync replication: readable once below the high watermark
                    self._state.visibility.hold(
                        self._state.log.write_position, queue, queue.index.end
                    )
                    changed = self._state.publish_locked()
            if self._state.listeners and changed:
                self._state.notify(changed)
            return result
        self._state.check_open()
        if deliver_at_ms is None:
            work = functools.partial(self._write_pending, topic, queue_id, prepared, idem)
        outcome = self._committer.submit(work, self.config.sync_timeout_ms / 1000)
        assert isinstance(outcome, AppendResult)
        return outcome

    def append_then(
        self, topic: str, queue_id: int, batch: MessageBatch, idem: Idempotence | None,
        then: Then,
    ) -> AppendResult | None:  # fmt: skip
        """``append`` without blocking (the broker's loop): in sync mode queued, None
        returned, ``then(result or exception)`` called once durable (committer thread)."""
        if self._committer is None:
            return self.append(topic, queue_id, batch, idem)
        prepared = self.prepare(topic, queue_id, batch)  # checks that the queue takes appends
        work = functools.partial(self._write_pending, topic, queue_id, prepared, idem)
        self._committer.submit_then(work, then)
        return None

    # -- delayed delivery (timer/) -----------------------------------------------------

    def cancel_delayed(self, position: int, check: TopicCheck = None) -> DelayedMessage:
        """Cancel the delayed record at ``position`` unless ``check(topic)`` raises (NotFound)."""
        return self.delivery.cancel(position, check)

    def delayed_summary(self, topic: str | None = None) -> tuple[int, int | None]:
        """(pending delayed records, earliest due ms or None), of ``topic`` or all."""
        return self.delivery.summary(topic)

    def set_delivering(self, active: bool) -> None:
        """Deliver due records and expire idle transactions (a master, the
        default) or not (a replica: its log only copies the master's)."""
        self.delivery.set_delivering(active)

    def _expire_idle(self) -> None:
        if self.delivery.timer.delivering:  # a replica's aborts would fork its log
            self.transactions.expire()

    def prepare(self, topic: str, queue_id: int, batch: MessageBatch) -> PreparedBatch:
        """Check ``batch`` as ``append`` would, without writing it (for staging)."""
        with self._state.lock:
            queue = self._state.writable_queue(topic, queue_id)
        return prepare_batch(batch, queue.topic_bytes, self.config.limits)

    # -- transactions: the writes transactions.py asks for (txn_writes.py) -------------

    def stage_records(  # noqa: PLR0917 (a staged write's parts, called in one place)
        self,
        topic: str,
        queue_id: int,
        prepared: PreparedBatch,
        serial: int,
        begin: PreparedBatch | None,
        on_written: Callable[[int, bytearray], None],
        idem: Idempotence | None = None,
    ) -> bool:
        """Append a transaction's checked batch to the log, invisible (after its
        ``begin`` record, if given); ``on_written(position of the first record
        written, index entries to be)`` runs under the lock, so a checkpoint
        never misses a transaction whose records are below it. Not fsynced:
        the commit's durability covers what it commits (docs/storage.md).
        ``idem``: an idempotent producer's batch, written with its producer
        record; False (nothing written) if it repeats one staged already."""
        with self._state.lock:
            queue = self._state.writable_queue(topic, queue_id)
            count = len(prepared.batch)
            said = None
            if idem is not None:
                if self.producers.check((topic, queue_id), idem, count) is not None:
                    return False
                said = ProducerBatch(
                    idem.producer_id, idem.epoch, idem.sequence, topic, queue_id, -1, count
                )
            first = -1 if begin is None else self._writer.write_control(begin)
            entries, done = bytearray(count * ENTRY_SIZE), [0]
            lead = None if said is None else prepare_record(said)
            try:
                self._writer.write_staged(queue, prepared, serial, entries, done, lead=lead)
            finally:  # what reached the log is the transaction's, as recovery will see
                on_written(first, entries if done[0] == count else entries[: done[0] * ENTRY_SIZE])
            if said is not None:
                position = int.from_bytes(entries[:8], "little") - 1
                self.producers.apply(said, position, self._writer.now_ms())
            return True

    def write_control(self, prepared: PreparedBatch) -> None:
        """Append a control record (an abort) to the log; not fsynced."""
        with self._state.lock:
            self._state.check_writable()
            self._writer.write_control(prepared)

    def write_epoch_marker(self, epoch: int) -> int:
        """Append the marker of ``epoch`` (epochs.py) and make it durable, before
        this broker takes writes as master of ``epoch``; return its position."""
        with self._state.lock:
            self._state.check_writable()
            start = self._state.log.write_position  # the previous epoch's end (epochs.py)
            position = self._writer.write_control(prepare_marker(epoch, start))
            self.epochs.add(epoch, start)
        self.flush()
        return position

    def commit_staged(
        self,
        entries: dict[QueueKey, bytearray],
        record: Callable[[dict[QueueKey, int]], PreparedBatch],
        on_written: Callable[[], None],
        *,
        hidden: bool = False,
    ) -> dict[QueueKey, int]:
        """Make staged records visible: ``record(first offsets)`` is the commit
        record (it may raise to cancel), written with ``entries`` (per queue,
        in offset order) by ``txn_writes.write_commit``; ``on_written`` runs
        under the lock after. Readers see every queue's records at once, in
        sync mode once the commit record is durable. Returns the first offsets.
        ``hidden``: queues hidden from producers too (delayed deliveries)."""
        keys = list(entries)
        lookup = self._state.live_queue if hidden else self._state.writable_queue

        def work() -> dict[QueueKey, int]:
            self._state.check_writable()
            targets = {key: lookup(*key) for key in keys}
            firsts = {key: queue.index.end for key, queue in targets.items()}
            prepared = record(firsts)
            write_commit(self._writer, targets, prepared, entries, self._writer.now_ms())
            on_written()
            if self._committer is not None or self._state.visibility.limit is not None:
                position = self._state.log.write_position
                for q in targets.values():
                    self._state.visibility.hold(position, q, q.index.end)
            else:
                for q in targets.values():
                    q.visible_end = q.index.end
            return firsts

        if self._committer is None:
            with self._state.lock:
                firsts = work()
                published = self._state.publish_locked()  # sync replication's hold, if any
            if self._state.listeners:
                with self._state.lock:
                    changed = [(q, q.visible_end) for q in self._queues_of(keys)]
                self._state.notify(published + changed)
            return firsts
        self._state.check_open()
        outcome = self._committer.submit(work, self.config.sync_timeout_ms / 1000)
        assert isinstance(outcome, dict)
        return outcome

    def _queues_of(self, keys: Iterable[QueueKey]) -> list[QueueState]:
        """The queues of ``keys`` that still exist (lock held)."""
        assert self._state.held()
        return [q for q in map(self._state.queues.get, keys) if q is not None]

    def _write_pending(
        self, topic: str, queue_id: int, prepared: PreparedBatch, idem: Idempotence | None
    ) -> AppendResult:
        """Sync mode, on the committer thread inside a round (lock held): write;
        readable once the round is durable (a duplicate's original is, by then)."""
        assert self._state.held()
        result = self._write_locked(topic, queue_id, prepared, idem)
        if not result.duplicate:
            queue = self._state.writable_queue(topic, queue_id)
            self._state.visibility.hold(self._state.log.write_position, queue, queue.index.end)
        return result

    def _write_locked(
        self, topic: str, queue_id: int, prepared: PreparedBatch, idem: Idempotence | None
    ) -> AppendResult:
        """Write a checked batch (lock held); an idempotent one with its
        producer record, or not at all if it repeats a remembered batch."""
        assert self._state.held()
        queue = self._state.writable_queue(topic, queue_id)
        if idem is None:
            return self._writer.write(queue, prepared)
        count = len(prepared.batch)
        seen = self.producers.check((topic, queue_id), idem, count)
        if seen is not None:
            return repeated_append(queue, seen)
        said = ProducerBatch(
            idem.producer_id, idem.epoch, idem.sequence, topic, queue_id, queue.index.end, count
        )
        result = self._writer.write(queue, prepared, prepare_record(said))
        self.producers.apply(said, result.first_position(), self._writer.now_ms())
        return result

    def init_producer(self, producer_id: int) -> tuple[int, int]:
        """(producer id, epoch) for a producer: a new id for 0, else the id's
        next epoch (``ProducerTable.init``). Masters only: a replica refuses."""
        with self._state.lock:
            self._state.check_writable()
            return self.producers.init(producer_id, _now_ms())

    def _commit_round(self, works: list[Callable[[], object]]) -> list[object]:
        """Run a round of sync-mode appends, then fsync once for all of them."""
        outcomes: list[object] = []
        with self._state.lock:
            start = self._state.log.write_position
            for work in works:
                try:
                    outcomes.append(work())
                except Exception as exc:
                    outcomes.append(exc)
            target = self._state.log.write_position
        try:
            self._state.commit.make_durable(target)
        except OSError as exc:
            abandon_round(self._state, start, exc)
            raise io_error("the message log (fsync)", exc) from exc
        return outcomes

    def _prefill_log(self) -> None:
        """Sync mode, on the committer thread between rounds: zeros written and
        synced ahead of the log's data end (``MessageLog.prefill``), while the
        callers of the last round read their replies and send the next batch."""
        state = self._state
        with state.lock:
            if state.closed or state.failed is not None:
                return
            try:
                filled = state.log.prefill()
            except OSError as exc:  # a full disk: appends will say so; nothing is lost
                log.debug("log prefill skipped: %s", exc)
                return
        if filled:
            # Through the group commit: a failed sync here is sticky like an
            # append's (the next round fails rather than trust a later fsync).
            state.commit.make_durable(0, again=True)

    # -- the replicated high watermark (sync replication; docs/replication.md) ---------

    # When a record becomes readable: visibility.py.

    def set_hw_limit(self, limit: int | None) -> None:
        """Records ending beyond ``limit`` stay unreadable; None: no limit.
        Records already readable stay so (a limit that goes back hides nothing)."""
        with self._state.lock:
            self._state.visibility.limit = limit
            changed = self._state.publish_locked()
        if changed and self._state.listeners:
            self._state.notify(changed)

    def hold_back(self, position: int) -> None:
        """Make the records at or after log ``position`` unreadable again, and
        set the limit there: a replica restarted with a held high watermark
        (``held_high_watermark``) must not serve, before its master's first
        reply, what a failover may still take back. Records recovered at open
        are readable at once otherwise; nobody has read them yet."""
        with self._state.lock:
            end = self._state.log.write_position
            self._state.visibility.limit = position
            if position >= end:
                return
            for queue in self._state.queues.values():
                first = first_offset_at(queue, position)
                if first < queue.visible_end:
                    queue.visible_end = queue.notified_end = first
                    self._state.visibility.hold(end, queue, queue.index.end)

    # -- the log by position: what replication/ needs (positioned.py) ------------------

    @property
    def log_end(self) -> int:
        """The log's write position (any thread)."""
        with self._state.lock:
            return self._state.log.write_position

    @property
    def log_start(self) -> int:
        """The position of the oldest record retention kept."""
        with self._state.lock:
            return self._state.log.start_position

    @property
    def chunk_capacity(self) -> int:
        """The capacity of every log chunk (a replica's must be its master's)."""
        return self._state.log.capacity

    def append_at(self, position: int, data: bytes | memoryview, scan: TxnScan) -> int:
        """Append a master's records ``data`` at log ``position`` (a replica,
        which takes no other writes); return the new log end. Index entries and
        transactions are derived as recovery derives them, continuing ``scan``
        (which ``Transactions`` adopts). In sync flush mode durable when it
        returns. Raises as ``positioned.append_at`` does."""
        state = self._state
        scan.timer = self.delivery.timer
        with state.lock:
            end, changed = append_at(state, position, data, scan)
        self.transactions.adopt(scan.found)
        if state.sync_flush:  # durable before the replica asks on
            try:
                state.commit.make_durable(end)  # publishes what it makes durable
            except OSError as exc:
                with state.lock:
                    state.fail(exc)
                raise io_error("the message log (fsync)", exc) from exc
        if changed and state.listeners:
            state.notify(changed)
        return end

    def truncate(self, position: int, scan: TxnScan) -> None:
        """Cut the log at ``position``, and every index entry, epoch marker and
        open transaction of ``scan`` at or after it (``positioned.truncate_at``)."""
        with self._state.lock:
            vouched = self._state.checkpoint
            if position < self._state.log.write_position:
                self.delivery.undo_tail(position)
            truncate_at(self._state, position, self.epochs, scan)
        self.transactions.adopt(scan.found)
        if position < vouched:
            # The checkpoint on disk vouches for bytes just cut (a restart trusts
            # it without reading them): save one for what is left, now.
            with self.delivery.timer.persist_lock:
                self._flush(force=True)

    def read_log(self, position: int, max_bytes: int) -> LogPiece:
        """The log bytes a replica whose log ends at ``position`` needs next
        (``positioned.read_piece``)."""
        return read_piece(self._state, position, max_bytes)

    def metadata_generation(self) -> tuple[object, int]:
        """(the topics mapping, the offsets' version): the topics mapping is replaced
        on every topic or queue change and the version counts offset changes, so
        while neither moved, the topics and offsets are the same. Read it before
        them (a change in between then makes the next one differ)."""
        return self._state.topics, self._state.offsets.version

    def offsets_snapshot(self) -> dict[str, GroupOffsets]:
        """Every group's committed offsets, copied."""
        return self._state.offsets.snapshot()

    def replace_offsets(self, groups: dict[str, GroupOffsets]) -> bool:
        """Make every group's committed offsets these; True if anything changed."""
        return self._state.offsets.replace_all(groups)

    @property
    def durable_end(self) -> int:
        """The log end in the flush mode's meaning: fsynced (sync) or written (async)."""
        with self._state.lock:
            return self._state.durable_locked()

    @property
    def high_watermark(self) -> int:
        """Every record below it may be read: ``durable_end`` capped by the limit."""
        with self._state.lock:
            return self._state.visibility.high_watermark(self._state.durable_locked())

    def add_listener(self, listener: Listener) -> None:
        """Register ``listener(topic, queue_id, visible_end)`` for newly readable records.

        Called on the appending (or flushing) thread, outside the store lock;
        it must be quick and must not raise.
        """
        self._state.listeners.append(listener)

    # -- durability and maintenance ----------------------------------------------------

    def flush(self) -> None:
        """Make everything written so far durable, and advance the index checkpoint."""
        with self.delivery.timer.persist_lock:  # one at a time: timer heads in order
            self._flush()

    def _flush(self, force: bool = False) -> None:  # force: save even if not forward
        with self._state.lock:
            self._state.check_open()
            target = self._state.log.write_position
            fds = [fd for q in self._state.queues.values() for fd in q.index.take_dirty()]
            queues = self._state.queues.items()
            ends = {key: q.index.end for key, q in queues}
            earliest = {key: q.index.earliest for key, q in queues}
            per_chunk = {key: q.index.entries_per_chunk for key, q in queues}
            start = self._state.log.start_position
            txn_position, serial, sinks = self.transactions.checkpoint_state()
            epochs = tuple(self.epochs.entries())
            limit = self._state.visibility.limit
            held = limit if limit is not None and limit < target else None
            producers = self._producer_snapshot()
            timer_doc, heads = self.delivery.timer.checkpoint_state()
            keys_doc, key_fds = KeyIndex.checkpoint_of(self._state.keys)
        checkpoint = Checkpoint(
            target, ends, earliest, start, txn_position, serial, sinks, epochs, held, producers,
            timer_doc, keys_doc, per_chunk,
        )  # fmt: skip
        try:
            self._state.commit.make_durable(target)
            for fd in fds:
                os.fsync(fd)
            self.delivery.timer.persist(heads)
            KeyIndex.persist(key_fds)  # entries and slots before the checkpoint names them
        except OSError as exc:
            if self.config.flush_mode is FlushMode.SYNC:
                with self._state.lock:
                    self._state.failed = self._state.failed or exc
            raise io_error("the message log or an index (fsync)", exc) from exc
        finally:
            for fd in fds:
                os.close(fd)
        # Every index entry of a record below `target` was written before the
        # dirty index files were collected, and is now fsynced. (The durable log
        # position may be further on, but entries beyond `target` are not synced.)
        # The save runs outside the store lock: it costs several fsyncs.
        with self._checkpoint_lock:
            if (force or target > self._state.checkpoint) and not self._state.closed:
                try:
                    save_checkpoint(self.config.data_dir, checkpoint)
                except OSError as exc:
                    raise io_error("checkpoint.json", exc) from exc
                self._state.checkpoint = target
                with self._state.lock:
                    self.delivery.timer.persisted(heads, timer_doc)
        self._persist_offsets()

    def _producer_snapshot(self) -> list[Any]:
        """The producer table as the checkpoint keeps it (lock held): taken
        again only when the table changed since the last one."""
        version = self.producers.version
        if self._snapshot_version != version:
            self._snapshot = self.producers.snapshot()
            self._snapshot_version = version
        return self._snapshot

    def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Delete completed log chunks the retention rules allow, then the index
        chunks that only point into deleted log chunks (retention.py)."""
        now = _now_ms() if now_ms is None else now_ms
        self.flush()
        state = self._state
        with state.lock:
            pins = [self.transactions.pinned(), self.delivery.timer.pinned()]
            pinned = min((p for p in pins if p is not None), default=None)
            return delete_expired(state, now, pinned=pinned)

    def _maintain(self) -> None:
        """The background thread: flush, persist offsets, expire transactions,
        apply retention (maintenance.py)."""
        config = self.config
        maintain(self._stop, config.flush_interval_ms / 1000, [
            ("flush", self.flush, None),
            ("offsets", self._persist_offsets, config.offsets_flush_interval_ms / 1000),
            ("transactions", self._expire_idle, None),
            ("retention", self.apply_retention, config.retention.check_interval_ms / 1000),
        ])  # fmt: skip

    # -- state -------------------------------------------------------------------------

    def damage(self) -> Damage:
        """What was found damaged at open and is not served (see damage.py)."""
        lost = [self._topics_lost, self.schemas.lost, self.transactions.sinks_lost]
        return Damage(
            list(self._state.log.quarantined), self._state.offsets.lost, [w for w in lost if w]
        )

    @property
    def fsync_times(self) -> FsyncTimes:
        """How long the log's fsyncs took (log/flush.py): ``snapshot()``."""
        return self._state.commit.times

    def stats(self) -> dict[str, int]:
        with self._state.lock:
            return {
                "topics": len(self._state.topics),
                "queues": len(self._state.queues),
                "groups": len(self._state.offsets.groups()),
                "log_chunks": len(self._state.log.chunks),
                "log_start_position": self._state.log.start_position,
                "log_write_position": self._state.log.write_position,
                "durable_position": self._state.commit.durable,
                "fsyncs": self._state.commit.fsyncs,
                "prefill_syncs": self._state.commit.prefill_syncs,
                "quarantined_chunks": len(self._state.log.quarantined),
                "idempotent_producers": len(self.producers),
                "delayed_pending": self.delivery.timer.pending,
                **self.transactions.stats(),
            }

    def close(self) -> None:
        """Flush everything, persist offsets, release the data directory."""
        if self._state.closed:
            return
        self._stop_background()
        self.flush()
        self.transactions.close()
        with self._state.lock:
            self._state.closed = True
            self.delivery.timer.close()
            if self._state.keys is not None:
                self._state.keys.close(persist=True)
            for queue in self._state.queues.values():
                queue.index.close()
            self._state.log.close()
            self._state.offsets.persist()
            os.close(self._lock_fd)

    def abandon(self) -> None:
        """Drop the store without flushing anything, as a killed process would.
        For fault-injection tests: what the OS has not been asked to fsync is
        still in the page cache; tests that simulate a machine crash remove it."""
        self._stop_background()
        self.transactions.close()
        with self._state.lock:
            self._state.closed = True
            self.delivery.timer.close()
            if self._state.keys is not None:
                self._state.keys.close()
            release_files(self._lock_fd, self._state.queues, self._state.log)

    def _stop_background(self) -> None:
        self.delivery.stop()
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
