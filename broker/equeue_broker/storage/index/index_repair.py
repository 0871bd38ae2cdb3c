"""Checking index entries against the log, and rebuilding damaged ones from it.

The log is the source of truth and the index derived data (queue_index.py), so
an index entry is never taken on its word where a wrong one would lose or
misserve a message: recovery checks the last entry of every queue against the
record it names (``recovery.py``), and a read that meets an entry failing its
checksum, or naming a record that is not its own, rebuilds that entry here
(``repair_entry``) and goes on. Rebuilding finds the record by scanning the log
between the records of the nearest intact entries on either side, so it costs
the distance between them, not the log's size.

Every function here must be called with the store lock held (or, at recovery,
before the store is shared).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from crc32c import crc32c

from equeue_broker.storage.errors import CorruptionError
from equeue_broker.storage.index.queue_index import (
    ENTRY,
    ENTRY_SIZE,
    QueueIndex,
    entry_damaged,
    pack_entry,
)
from equeue_broker.storage.index.queue_state import QueueKey
from equeue_broker.storage.log.message_log import MessageLog
from equeue_broker.storage.log.record import restamp_entries
from equeue_proto.record import FLAG_CONTROL, FLAG_TXN, RecordMeta

log = logging.getLogger(__name__)

_NEIGHBOURS = 64
"""How far a repair looks, either side, for an intact entry to bound its scan."""


def entry_for(position: int, meta: RecordMeta) -> bytes:
    """The index entry of the record ``meta`` at log ``position``."""
    tag_hash = crc32c(meta.tag) if meta.tag else 0
    return pack_entry(position + 1, meta.frame_size, tag_hash, meta.store_timestamp_ms)


def entry_matches(
    message_log: MessageLog, raw: bytes, topic: bytes, queue_id: int, offset: int
) -> bool:
    """True if ``raw`` passes its checksum and is exactly the entry of the
    record of (topic, queue, offset) it names.

    The record is checked by its header, which names its own position, not by
    its checksum: a damaged record body is for reads to report (DamagedRecord),
    and must not make its intact entry look damaged."""
    if len(raw) != ENTRY_SIZE or entry_damaged(raw):
        return False
    position = ENTRY.unpack(raw)[0] - 1
    if not message_log.record_is(position, topic, queue_id, offset):
        return False
    meta = message_log.meta_at(position)
    # Compare the data fields only: an older entry has no checksum trailer, and
    # a transaction's entry has the commit's store time, not the staging time.
    compared = 16 if meta.flags & FLAG_TXN else 24
    return raw[:compared] == entry_for(position, meta)[:compared]


@dataclass
class Wanted:
    """Records of one queue to find in the log: from ``offset`` on, until
    ``until`` (exclusive; None: to the scan's end), at or after ``position``."""

    position: int
    offset: int
    until: int | None = None


def find_records(
    message_log: MessageLog, wanted: dict[QueueKey, Wanted], stop: int
) -> dict[QueueKey, bytearray]:
    """Entries for the records ``wanted`` asks for, in one scan of the log from
    the lowest ``position`` to ``stop``; each queue's run of entries ends at the
    first offset the log does not hold next."""
    found: dict[QueueKey, bytearray] = {}
    open_ = {k: Wanted(w.position, w.offset, w.until) for k, w in wanted.items()}
    if not open_:
        return found
    start = max(min(w.position for w in open_.values()), message_log.start_position)
    for position, meta in message_log.iter_records(start):
        if position >= stop:
            break
        if meta.flags & (FLAG_TXN | FLAG_CONTROL):
            continue  # its offset is not in its header (a commit gave it one)
        key = (meta.topic.decode(errors="replace"), meta.queue_id)
        want = open_.get(key)
        if want is None or position < want.position or meta.queue_offset != want.offset:
            continue
        found.setdefault(key, bytearray()).extend(entry_for(position, meta))
        want.offset += 1
        if want.until is not None and want.offset >= want.until:
            del open_[key]
            if not open_:
                break
    return found


def _bounds(message_log: MessageLog, raw: bytes, key: QueueKey, offset: int) -> bool:
    """True if ``raw`` is the intact entry of ``offset`` and its record was
    appended in offset order (not a transaction's, whose record may lie
    anywhere before its commit): only those bound a scan for a neighbour."""
    if not entry_matches(message_log, raw, key[0].encode(), key[1], offset):
        return False
    return not message_log.meta_at(ENTRY.unpack(raw)[0] - 1).flags & FLAG_TXN


def intact_end(message_log: MessageLog, index: QueueIndex, key: QueueKey, offset: int) -> int:
    """Log position just past the record of the nearest intact entry before
    ``offset`` (within ``_NEIGHBOURS``), else the log's start: where a scan for
    the record of ``offset`` can begin (a record boundary)."""
    for before in range(offset - 1, max(index.earliest, offset - _NEIGHBOURS) - 1, -1):
        raw = index.read_raw(before, 1)
        if _bounds(message_log, raw, key, before):
            position_plus_one, size, _tag, _ts = ENTRY.unpack(raw)
            return int(position_plus_one - 1 + size)
    return message_log.start_position


def repair_entry(
    message_log: MessageLog, index: QueueIndex, key: QueueKey, offset: int, end: int
) -> None:
    """Rebuild the entry of ``offset`` (< ``end``, the queue's end) from the log,
    scanning between the records of the nearest intact entries either side.

    ``CorruptionError`` if the log holds no such record there, as for the
    entry of a transaction's record: its header holds no offset (docs/storage.md).
    """
    stop = message_log.write_position
    for after in range(offset + 1, min(end, offset + _NEIGHBOURS)):
        raw = index.read_raw(after, 1)
        if _bounds(message_log, raw, key, after):
            stop = ENTRY.unpack(raw)[0] - 1
            break
    start = intact_end(message_log, index, key, offset)
    found = find_records(message_log, {key: Wanted(start, offset, offset + 1)}, stop)
    if key not in found:
        raise CorruptionError(
            f"index entry of {key[0]}/{key[1]} offset {offset} is damaged and the log "
            "holds no record for it"
        )
    index.write(offset, found[key])
    log.warning(
        "index entry of %s/%d offset %d was damaged; rebuilt from the log (scanned [%d, %d))",
        key[0], key[1], offset, start, stop,
    )  # fmt: skip


def derived_entries(
    queues: tuple[tuple[QueueKey, int, int], ...],
    found: dict[QueueKey, bytearray],
    store_ms: int,
    kind: str,
    what: str,
) -> list[tuple[QueueKey, int, bytearray]]:
    """The index entries a commit-like record (``kind``: a commit, a delayed
    records' deliver) makes: per queue it lists (first offset, count), the
    entries ``found`` in the log for it, stamped with the record's store time;
    ``CorruptionError`` if the log holds another number of them."""
    out = []
    for key, first, count in queues:
        entries = found.get(key, bytearray())
        if len(entries) // 32 != count:
            raise CorruptionError(
                f"{kind} of {key[0]}/{key[1]} offsets [{first}, {first + count}) finds "
                f"{len(entries) // 32} {what} in the log"
            )
        restamp_entries(entries, store_ms)
        out.append((key, first, entries))
    return out
