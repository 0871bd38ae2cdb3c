"""A replica's side of log replication: the master's bytes at the master's positions.

A replica's message log is a byte-for-byte copy of its master's: every record
lies at the same global position (so message ids, which name positions, stay
valid on either), and chunks roll exactly where the master's did (a record
never spans chunks; the master says where data continues). ``ReplicaLog``
is the one entry point that writes such bytes (``append``), beside the
store's normal appends, which a replica never takes. For each piece it

1. checks the position: the replica's log end, or the start of the next chunk
   (the master sealed the one before there: the replica seals its own at the
   same data size), or, for an empty replica, any chunk start (the master's
   retention removed what came before: the replica's log starts there too);
2. checks every frame with the record checks recovery uses
   (``check_frame``), and that each record names its own position;
3. appends the bytes, then derives index entries locally the way recovery
   does (``recovery.rebuild_indexes``): a record's entry from the record, a
   transaction's staged records nothing until its commit record, whose
   entries are derived from the staged records (txn_recovery.py), with one
   ``TxnScan`` kept across pieces. The store's ``Transactions`` adopts what the
   scan found, so checkpoints, and a restart's recovery, agree with the log.

``truncate`` cuts a divergent tail (into sealed chunks too: later chunk
files are deleted and the chunk holding the cut becomes the active one), and
``apply_metadata`` makes topics (with their incarnations) and consumer-group
offsets the master's.

Metadata document (JSON, UTF-8; ``encode_metadata``/``decode_metadata``)::

    {"broker_name": "broker-a",
     "topics": [{"name": "t", "incarnation": 123, "created_ms": 1700000000000,
                 "queues": [[queue_id, producer_visible, consumer_visible], ...]}],
     "offsets": {"group": {"topic": [[queue_id, next_offset], ...]}}}

This module reaches into the store's state (its locks, log, queues, topics,
through its ``TopicAdmin`` (topic_admin.py), and offsets) the way store.py's
own helper modules do; store.py stays the owner.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from typing import Any

from equeue_broker.storage.errors import (
    CorruptionError,
    InvalidArgument,
    PreconditionFailed,
    io_error,
)
from equeue_broker.storage.message_log import check_frames
from equeue_broker.storage.offsets import GroupOffsets
from equeue_broker.storage.recovery import rebuild_indexes
from equeue_broker.storage.store import Store
from equeue_broker.storage.topics import QueueMeta, TopicMeta
from equeue_broker.storage.txn_recovery import TxnScan
from equeue_proto.record import (
    AT_BODY,
    AT_POSITION,
    BODY_TO_FRAME,
    FLAG_CONTROL,
    FLAG_TXN,
    check_frame,
    read_meta,
)

log = logging.getLogger(__name__)

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class Metadata:
    """A master's group metadata (the module docstring's document)."""

    broker_name: str
    topics: tuple[TopicMeta, ...]
    offsets: dict[str, GroupOffsets]


def encode_metadata(meta: Metadata) -> bytes:
    document = {
        "broker_name": meta.broker_name,
        "topics": [
            {
                "name": t.name,
                "incarnation": t.incarnation,
                "created_ms": t.created_ms,
                "queues": [[q.queue_id, q.producer_visible, q.consumer_visible] for q in t.queues],
            }
            for t in meta.topics
        ],
        "offsets": {
            group: {topic: sorted(queues.items()) for topic, queues in topics.items()}
            for group, topics in meta.offsets.items()
        },
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def decode_metadata(data: bytes) -> Metadata:
    """The document ``data`` holds; ``InvalidArgument`` naming what is wrong."""
    try:
        document: Any = json.loads(data)
        topics = tuple(
            TopicMeta(
                str(t["name"]),
                tuple(QueueMeta(int(q), bool(p), bool(c)) for q, p, c in t["queues"]),
                int(t["created_ms"]),
                incarnation=int(t["incarnation"]),
            )
            for t in document["topics"]
        )
        offsets = {
            str(group): {str(topic): {int(q): int(o) for q, o in qs} for topic, qs in ts.items()}
            for group, ts in document["offsets"].items()
        }
        return Metadata(str(document["broker_name"]), topics, offsets)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidArgument(f"bad replication metadata: {exc!r}") from None


def metadata_generation(store: Store) -> tuple[object, int]:
    """(the topics mapping, the offsets' version): the topics mapping is replaced
    on every topic or queue change and the version counts offset changes, so
    while neither moved, ``master_metadata`` returns the same. Read it before
    the metadata (a change in between then makes the next one differ)."""
    return store._topic_admin.topics, store._offsets.version


def master_metadata(store: Store, broker_name: str) -> Metadata:
    """What a master sends its replicas."""
    return Metadata(broker_name, tuple(store.topics()), store._offsets.snapshot())


class ReplicaLog:
    """Writes a master's log into ``store`` (the store must take no other writes)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        found = store.transactions.recovered()
        self._scan = TxnScan(found.next_serial, found.sinks, False, store.epochs)
        self._scan.found.open = found.open

    @property
    def end(self) -> int:
        with self._store._lock:
            return self._store._log.write_position

    @property
    def capacity(self) -> int:
        return self._store._log.capacity

    def append(self, position: int, data: bytes | memoryview) -> int:
        """Append the master's bytes ``data`` at ``position``; return the new log end.

        ``PreconditionFailed`` if ``position`` is not where this log can
        continue, ``CorruptionError`` if a frame fails its checks (nothing is
        written then)."""
        store = self._store
        with store._lock:
            store._check_writable()
            self._place(position, len(data))
            _check_frames(position, data)
            self._start_queues(data)
            message_log = store._log
            ends = [(queue, queue.index.end) for queue in store._queues.values()]
            try:
                message_log.append_bytes(data)
            except OSError as exc:
                store._fail(exc)  # the log on disk is no longer known: restart
                raise
            rebuild_indexes(
                message_log, store._queues, position, position, self._scan, appended=data
            )
            end = message_log.write_position
            # Readable once durable here and below the master's high watermark
            # (visibility.py).
            for q, was in ends:
                if q.index.end > was:
                    store._visibility.hold(end, q, q.index.end)
            changed = store._publish_locked()
        store.transactions.adopt(self._scan.found)
        if store._committer is not None:  # sync flush: durable before the replica asks on
            try:
                store._commit.make_durable(end)  # publishes what it makes durable
            except OSError as exc:
                with store._lock:
                    store._fail(exc)
                raise io_error("the message log (fsync)", exc) from exc
        if changed and store._listeners:
            store._notify(changed)
        return end

    def _place(self, position: int, size: int) -> None:
        """Make the log's write position ``position`` if it may be (lock held)."""
        message_log = self._store._log
        end = message_log.write_position
        capacity = message_log.capacity
        active = message_log.active
        if position != end:
            if position == (active.number + 1) * capacity:
                message_log.roll()  # the master sealed this chunk at the same size
            elif _empty(self._store) and position % capacity == 0 and position > end:
                log.warning(
                    "empty replica starts its log at position %d (the master's log start)",
                    position,
                )
                message_log.chunks.clear()
                active.close()
                active.path.unlink()
                message_log._new_chunk(position // capacity)
            else:
                raise PreconditionFailed(
                    f"replicated bytes start at log position {position}, but this log ends at {end}"
                )
        if size > message_log.room():
            raise PreconditionFailed(
                f"replicated bytes [{position}, {position + size}) do not fit the chunk "
                f"at {position} (room {message_log.room()}): chunk capacities differ?"
            )

    def _start_queues(self, data: bytes | memoryview) -> None:
        """An empty queue whose first replicated record has a later offset (the
        master's retention removed the earlier ones) starts there (lock held)."""
        queues = self._store._queues
        if not any(q.index.end == q.index.earliest == 0 for q in queues.values()):
            return  # the common case: no queue is still empty at offset 0
        pos = 0
        seen: set[tuple[bytes, int]] = set()
        while pos < len(data):
            meta = read_meta(data, pos)
            pos += meta.frame_size
            if meta.flags & (FLAG_TXN | FLAG_CONTROL) or (meta.topic, meta.queue_id) in seen:
                continue
            seen.add((meta.topic, meta.queue_id))  # only a queue's first record says
            queue = queues.get((meta.topic.decode(), meta.queue_id))
            index = None if queue is None else queue.index
            if index is not None and index.end == index.earliest == 0 < meta.queue_offset:
                index.end = index.earliest = meta.queue_offset
                assert queue is not None
                queue.visible_end = queue.notified_end = meta.queue_offset

    def truncate(self, position: int) -> None:
        """Cut the log at ``position`` (a divergent tail), and every index entry,
        open transaction and epoch marker at or after it, into sealed chunks if
        need be. Loud: it drops records."""
        store = self._store
        with store._lock:
            message_log = store._log
            end = message_log.write_position
            if position >= end:
                return
            if position < message_log.start_position:
                raise PreconditionFailed(
                    f"the replica's log diverges from its master's at position {position}, "
                    f"before its own log start {message_log.start_position}: empty the "
                    "replica's data directory and restart it"
                )
            sealed = position < message_log.start_of(message_log.active)
            log.error(
                "REPLICA TRUNCATES its log from %d to %d (%d bytes lost%s): they are not on "
                "the master (diverged, or the master lost them)", end, position, end - position,
                ", into sealed chunks" if sealed else "",
            )  # fmt: skip
            if sealed:
                message_log.truncate_into_sealed(position)
            else:
                message_log.truncate(position)
            store._visibility.cut(position)
            for queue in store._queues.values():
                queue.index.recover(position)
                # Never more than was readable: records held below the high
                # watermark stay held.
                queue.visible_end = queue.notified_end = min(queue.visible_end, queue.index.end)
                if queue.index.end > queue.visible_end:  # a held piece was cut in two
                    store._visibility.hold(position, queue, queue.index.end)
            store._checkpoint = min(store._checkpoint, position)
            store.epochs.cut(position)
            found = self._scan.found
            found.open = {s: t for s, t in found.open.items() if t.first_position < position}
            # To what the log holds, not what is readable: records held below the
            # high watermark are not lost.
            store._offsets.clamp({k: q.index.end for k, q in store._queues.items()})
        store.transactions.adopt(self._scan.found)

    def apply_metadata(self, meta: Metadata) -> bool:
        """Make topics and group offsets the master's; True if anything changed."""
        store = self._store
        changed = False
        wanted = {t.name: t for t in meta.topics}
        for name, have in {t.name: t for t in store.topics()}.items():
            if name not in wanted or wanted[name].incarnation != have.incarnation:
                log.info("replica: topic %s deleted (the master's is gone or newer)", name)
                store.delete_topic(name)
                changed = True
        admin = store._topic_admin
        with store._admin_lock, store._lock:
            for name, topic in wanted.items():
                have_meta = admin.topics.get(name)
                if have_meta == topic:
                    continue
                changed = True
                before = admin.topics
                old_ids = {q.queue_id for q in have_meta.queues} if have_meta else set()
                new_ids = {q.queue_id for q in topic.queues}
                admin.save({**before, name: topic})
                for queue_id in sorted(old_ids - new_ids):
                    store._queues.pop((name, queue_id)).index.release()
                    admin.forget(name, queue_id)
                admin.open_queues(name, sorted(new_ids - old_ids), before)
                for q in topic.queues:
                    store._queues[(name, q.queue_id)].producer_visible = q.producer_visible
        if store._offsets.replace_all(meta.offsets):
            changed = True
        return changed


def _empty(store: Store) -> bool:
    """The store holds no record at all (lock held)."""
    message_log = store._log
    return len(message_log.chunks) == 1 and message_log.active.data_size == 0


def _check_frames(position: int, data: bytes | memoryview) -> None:
    """Every frame of ``data`` valid, naming its own position (record.py's checks).

    The frames and their positions are checked in one call (the C codec's loop
    where it is built): a sync-mode write waits for this; only a bad frame is
    looked at again, to say what is wrong with it."""
    bad = check_frames(data, 0, len(data), position)
    if bad < 0:
        return
    verdict = check_frame(data, bad, len(data))
    if isinstance(verdict, str):
        raise CorruptionError(
            f"replicated record at log position {position + bad} is invalid: {verdict}"
        )
    (stored,) = _U64.unpack_from(data, bad + AT_POSITION)
    raise CorruptionError(
        f"replicated record at log position {position + bad} names position {stored}"
    )


def records_end(data: bytes | memoryview, limit: int) -> int:
    """The end of the last whole record of ``data`` within ``limit`` bytes (at
    least the first record, whatever its size): where a master cuts a reply.

    The cut is found from the length prefixes, then the frames before it are
    checked in one call (the C codec's loop where it is built). A master's
    usual reply, everything it has within the limit, is found by that one call
    alone (no Python per record)."""
    end = len(data)
    if end <= limit and check_frames(data, 0, end) < 0:
        return end  # whole frames tile all of it
    pos = 0
    while pos < end:
        body = _U32.unpack_from(data, pos)[0] if pos + AT_BODY <= end else 0
        size = body + BODY_TO_FRAME
        if body == 0 or pos + size > end:
            break  # not a whole frame: the check below names it
        if pos and pos + size > limit:
            return _checked(data, pos)
        pos += size
    if pos < end:  # stopped at a frame that is not whole
        raise CorruptionError(
            f"invalid record in the log at offset {pos}: {check_frame(data, pos, end)}"
        )
    return _checked(data, pos)


def _checked(data: bytes | memoryview, end: int) -> int:
    """``end``, once every frame before it passed its checks."""
    bad = check_frames(data, 0, end)
    if bad >= 0:
        raise CorruptionError(
            f"invalid record in the log at offset {bad}: {check_frame(data, bad, end)}"
        )
    return end


@dataclass(frozen=True)
class LogPiece:
    """A master's answer to a replica asking from a position (``read_for_replica``)."""

    position: int
    """Where ``data`` starts; below the asked position: the replica must cut its
    log there first (the asked position is past the end, or not a record boundary)."""
    data: bytes
    end: int
    """The master's log end (what a replica may copy)."""
    start: int
    """The master's log start."""


def read_for_replica(store: Store, position: int, max_bytes: int) -> LogPiece:
    """The log bytes a replica whose log ends at ``position`` needs next: whole
    records, at most ``max_bytes`` (at least one record), within one chunk. In
    sync flush mode only durable bytes are sent (a replica never holds what a
    master's crash could take back)."""
    with store._lock:
        store._check_open()
        message_log = store._log
        end = message_log.write_position
        if store._committer is not None:
            end = min(end, store._commit.durable)
        start = message_log.start_position
        if position > end:
            return LogPiece(end, b"", end, start)
        position = max(position, start)  # retention removed it: the replica starts there
        chunk = message_log.chunk_at(position)
        chunk_end = message_log.start_of(chunk) + chunk.data_size
        if position == chunk_end and chunk.sealed:
            position = (chunk.number + 1) * message_log.capacity
            chunk_end = (
                end
                if position >= message_log.start_of(message_log.active)
                else (position + message_log.chunk_at(position).data_size)
            )
        stop = min(chunk_end, end)
        if position >= stop:
            return LogPiece(position, b"", end, start)
        view = message_log.copy(position, stop)
        if isinstance(check_frame(view, 0, len(view)), str) or (
            read_meta(view, 0).position != position
        ):
            return LogPiece(_boundary_before(store, position), b"", end, start)
        cut = records_end(view, max_bytes)
        return LogPiece(position, bytes(view[:cut]), end, start)


def _boundary_before(store: Store, position: int) -> int:
    """The last record boundary of the log at or before ``position`` (lock held)."""
    message_log = store._log
    chunk = message_log.chunk_at(position)
    boundary = message_log.start_of(chunk)
    for at, meta in message_log.iter_records(boundary):
        if at + meta.frame_size > position:
            break
        boundary = at + meta.frame_size
    return boundary
