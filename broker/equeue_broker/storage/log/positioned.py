"""The log by position: what replication needs of the store, beside its appends.

A replica's message log is a byte-for-byte copy of its master's: every record
lies at the same global position (so message ids, which name positions, stay
valid on either), and chunks roll exactly where the master's did (a record
never spans chunks; the master says where data continues). replication/
writes such bytes through ``Store.append_at`` (here: ``append_at``), which

1. checks the position: the replica's log end, or the start of the next chunk
   (the master sealed the one before there: the replica seals its own at the
   same data size), or, for an empty replica, any chunk start (the master's
   retention removed what came before: the replica's log starts there too);
2. checks every frame with the record checks recovery uses
   (``check_frame``), and that each record names its own position;
3. appends the bytes, then derives index entries locally the way recovery
   does (``recovery.rebuild_indexes``): a record's entry from the record, a
   transaction's staged records nothing until its commit record, whose
   entries are derived from the staged records (txn_recovery.py), with the
   caller's ``TxnScan`` kept across pieces (the store's ``Transactions``
   adopts what it found, so checkpoints, and a restart's recovery, agree with
   the log); the records' keys go into the key index (keys/key_index.py)
   from the same bytes.

``truncate_at`` cuts a divergent tail (into sealed chunks too: later chunk
files are deleted and the chunk holding the cut becomes the active one).
On a master, ``read_piece`` is what a replica asks for: whole records from a
position, within one chunk. Every function here takes the engine's state
(engine.py) and is called with its lock held (``append_at`` and
``truncate_at`` assert it), except ``read_piece``, which takes it.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass

from equeue_broker.storage.engine import EngineState
from equeue_broker.storage.epochs import EpochHistory
from equeue_broker.storage.errors import CorruptionError, PreconditionFailed
from equeue_broker.storage.log.message_log import check_frames
from equeue_broker.storage.recovery import rebuild_indexes
from equeue_broker.storage.txn.txn_recovery import TxnScan
from equeue_broker.storage.visibility import Change
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


def append_at(
    state: EngineState, position: int, data: bytes | memoryview, scan: TxnScan
) -> tuple[int, list[Change]]:
    """Append a master's bytes ``data`` at ``position`` (lock held); return the
    new log end and the queues whose readable end moved.

    ``PreconditionFailed`` if ``position`` is not where this log can
    continue, ``CorruptionError`` if a frame fails its checks (nothing is
    written then)."""
    assert state.held()
    state.check_writable()
    _place(state, position, len(data))
    check_frames_at(position, data)
    _start_queues(state, data)
    message_log = state.log
    ends = [(queue, queue.index.end) for queue in state.queues.values()]
    try:
        message_log.append_bytes(data)
    except OSError as exc:
        state.fail(exc)  # the log on disk is no longer known: restart
        raise
    rebuild_indexes(message_log, state.queues, position, position, scan, appended=data)
    if state.keys is not None:
        state.keys.add_frames(data, position)
    end = message_log.write_position
    # Readable once durable here and below the master's high watermark
    # (visibility.py).
    for q, was in ends:
        if q.index.end > was:
            state.visibility.hold(end, q, q.index.end)
    return end, state.publish_locked()


def _place(state: EngineState, position: int, size: int) -> None:
    """Make the log's write position ``position`` if it may be (lock held)."""
    message_log = state.log
    end = message_log.write_position
    capacity = message_log.capacity
    active = message_log.active
    if position != end:
        if position == (active.number + 1) * capacity:
            message_log.roll()  # the master sealed this chunk at the same size
        elif _empty(state) and position % capacity == 0 and position > end:
            log.warning(
                "empty replica starts its log at position %d (the master's log start)",
                position,
            )
            message_log.restart_at(position // capacity)
        else:
            raise PreconditionFailed(
                f"replicated bytes start at log position {position}, but this log ends at {end}"
            )
    if size > message_log.room():
        raise PreconditionFailed(
            f"replicated bytes [{position}, {position + size}) do not fit the chunk "
            f"at {position} (room {message_log.room()}): chunk capacities differ?"
        )


def _start_queues(state: EngineState, data: bytes | memoryview) -> None:
    """An empty queue whose first replicated record has a later offset (the
    master's retention removed the earlier ones) starts there (lock held)."""
    queues = state.queues
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


def truncate_at(state: EngineState, position: int, epochs: EpochHistory, scan: TxnScan) -> None:
    """Cut the log at ``position`` (a divergent tail), and every index entry,
    open transaction and producer batch (of ``scan``) and epoch marker at or after it, into sealed
    chunks if need be (lock held). Loud: it drops records."""
    assert state.held()
    message_log = state.log
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
    state.visibility.cut(position)
    for queue in state.queues.values():
        queue.index.recover(position)
        # Never more than was readable: records held below the high
        # watermark stay held.
        queue.visible_end = queue.notified_end = min(queue.visible_end, queue.index.end)
        if queue.index.end > queue.visible_end:  # a held piece was cut in two
            state.visibility.hold(position, queue, queue.index.end)
    state.checkpoint = min(state.checkpoint, position)
    if state.keys is not None:
        state.keys.truncate(position)
    epochs.cut(position)
    if scan.producers is not None:
        scan.producers.truncate(position)
    found = scan.found
    found.open = {s: t for s, t in found.open.items() if t.first_position < position}
    scan.cut(position)  # check records cut: un-counted (txn_recovery.py)
    # To what the log holds, not what is readable: records held below the
    # high watermark are not lost.
    state.offsets.clamp({k: q.index.end for k, q in state.queues.items()})


def _empty(state: EngineState) -> bool:
    """The store holds no record at all (lock held)."""
    message_log = state.log
    return len(message_log.chunks) == 1 and message_log.active.data_size == 0


def check_frames_at(position: int, data: bytes | memoryview) -> None:
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
    """A master's answer to a replica asking from a position (``read_piece``)."""

    position: int
    """Where ``data`` starts; below the asked position: the replica must cut its
    log there first (the asked position is past the end, or not a record boundary)."""
    data: bytes
    end: int
    """The master's log end (what a replica may copy)."""
    start: int
    """The master's log start."""


def read_piece(state: EngineState, position: int, max_bytes: int) -> LogPiece:
    """The log bytes a replica whose log ends at ``position`` needs next: whole
    records, at most ``max_bytes`` (at least one record), within one chunk. In
    sync flush mode only durable bytes are sent (a replica never holds what a
    master's crash could take back)."""
    with state.lock:
        state.check_open()
        message_log = state.log
        end = message_log.write_position
        if state.sync_flush:
            end = min(end, state.commit.durable)
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
            return LogPiece(_boundary_before(state, position), b"", end, start)
        cut = records_end(view, max_bytes)
        return LogPiece(position, bytes(view[:cut]), end, start)


def _boundary_before(state: EngineState, position: int) -> int:
    """The last record boundary of the log at or before ``position`` (lock held)."""
    message_log = state.log
    chunk = message_log.chunk_at(position)
    boundary = message_log.start_of(chunk)
    for at, meta in message_log.iter_records(boundary):
        if at + meta.frame_size > position:
            break
        boundary = at + meta.frame_size
    return boundary
