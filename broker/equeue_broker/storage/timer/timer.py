"""Delayed delivery: the timer state of one store, derived from the log.

A delayed record is written once (flags TXN | DELAYED, its due time as its
queue offset: ``equeue_proto.record``), invisible like a transaction's staged
record. The store's timer thread delivers due records in (due, position)
order with a "deliver" control record written like a transaction commit
(``Store.commit_staged``: index entries at each queue's end, fresh offsets,
store time = delivery time); a "cancel" control record drops one
(timer_records.py). The watermark ``through`` = (due, position) of the last
delivered record says: every delayed record with a key at or below it is
delivered or cancelled.

What this module keeps, all derived from the log:

* the timer index on disk (wheel.py): one entry per delayed record and per
  cancel, chained per 1-second slot; entries are checked against the record
  they name before a delivery (flags, due time, position), so a stale one
  (a crash before a checkpoint, a replica's cut tail) is harmless;
* counts: pending records in all, per topic (with a per-hour histogram of due
  times, for the next due time), per log chunk (retention keeps a chunk with
  a pending record, and every chunk after it: ``pinned``);
* ``through`` and ``cursor`` (slots before it hold no live entry).

Recovery restores the counts from the checkpoint ("timer" section) and
applies every delayed record and timer control record after it (TxnScan
calls ``scan_added`` and ``scan_control``); a replica does the same for the
bytes it copies, and ``undo_tail`` reverses what a cut tail did.

Locking: the methods run with the engine lock held, except where they say;
``deliver_lock`` orders a delivery's choice and its write against cancels.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import operator
import struct
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from equeue_broker.storage.config import TimerConfig
from equeue_broker.storage.errors import InvalidArgument, StorageError
from equeue_broker.storage.index.index_repair import derived_entries, entry_for
from equeue_broker.storage.index.queue_state import QueueKey
from equeue_broker.storage.log.message_log import MessageLog
from equeue_broker.storage.timer.timer_records import (
    TAGS,
    Cancel,
    Deliver,
    Key,
    decode_value,
)
from equeue_broker.storage.timer.wheel import SLOTS, Entry, Wheel, topic_id
from equeue_proto.record import FLAG_CONTROL, FLAG_DELAYED, FLAG_TXN, RecordMeta, StoredMessage

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000
_EARLIEST_SECONDS = 256
"""Busy seconds a next-due lookup reads at most (then it answers a lower bound)."""
_EARLIEST_ENTRIES = 4096
"""Timer entries a next-due lookup reads at most (then it answers a lower
bound): it runs under the engine lock, and one second may hold a million."""
NOTHING: Key = (0, -1)


@dataclass
class _TopicPending:
    count: int = 0
    hours: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Picked:
    """A delayed record chosen for delivery."""

    key: Key
    meta: RecordMeta


class Timer:
    """The delayed records of one store."""

    def __init__(
        self, config: TimerConfig, directory: Path, message_log: MessageLog, delivering: bool
    ) -> None:
        self.config = config
        self._directory = directory
        self._log = message_log
        self.wheel: Wheel | None = None
        self.through: Key = NOTHING
        self.cursor_sec = 0
        """Slots of seconds before it hold no live entry."""
        self._floor_ms = 0
        """A new delayed record is due no earlier (keys stay above ``through``)."""
        self.pending = 0
        self._topics: dict[str, _TopicPending] = {}
        self._chunks: dict[int, int] = {}
        self.from_position = 0
        """Records below it are in the restored counts (the checkpoint's)."""
        self._base = 0
        """A delivery of a record below it was never counted (a rebuild from a
        log whose start retention deleted)."""
        self.delivering = delivering
        """Whether the timer thread delivers (a master) or not (a replica)."""
        self.deliver_lock = threading.Lock()
        self.persist_lock = threading.Lock()
        self._version = 0
        self._live_kept: tuple[int, int, list[Key]] | None = None
        """(second, its chain's head, ``_alive`` of it): see ``_live``."""
        self._compacting: int | None = None
        """The next timer log entry compaction looks at, while it runs."""
        self._earliest: dict[str | None, tuple[int, int | None]] = {}

    # -- open and checkpoints --------------------------------------------------------

    def restore(self, doc: dict[str, Any] | None, position: int, *, usable: bool) -> bool:
        """Take the checkpoint's "timer" section as of log ``position``. None
        (no checkpoint, or one of a version before delayed delivery): start
        empty. False if it cannot be used (``usable`` False, or the index
        files are not what it says): the timer starts empty and the caller
        must scan the whole log."""
        if doc is not None and usable:
            segments = {int(s): int(d) for s, d in doc.get("segments", [])}
            per_segment = int(doc.get("segment_entries", self.config.segment_entries))
            first = int(doc.get("first", 0))
            wheel = Wheel(self._directory, int(doc["entries"]), segments, first, per_segment)
            if wheel.intact:
                self.wheel = wheel
                self._restore_counts(doc, position)
                return True
            wheel.close()
        self.wheel = Wheel(self._directory, None, segment_entries=self.config.segment_entries)
        self._base = self._log.start_position
        return doc is None

    def _restore_counts(self, doc: dict[str, Any], position: int) -> None:
        self.from_position = position
        self.through = (int(doc["through"][0]), int(doc["through"][1]))
        self.cursor_sec = int(doc.get("cursor", 0))
        self.pending = int(doc["pending"])
        for topic, count, hours in doc.get("topics", []):
            self._topics[str(topic)] = _TopicPending(int(count), {int(h): int(n) for h, n in hours})
        self._chunks = {int(c): int(n) for c, n in doc.get("chunks", [])}
        self._floor_ms = max(self.through[0], self.cursor_sec * 1000)

    def checkpoint_state(self) -> tuple[dict[str, Any], dict[int, int]]:
        """(the checkpoint's "timer" section, wheel heads to write) (lock held)."""
        assert self.wheel is not None
        count, dirty = self.wheel.take_dirty()
        doc = {
            "through": list(self.through),
            "cursor": self.cursor_sec,
            "pending": self.pending,
            "topics": [
                [t, p.count, sorted(p.hours.items())] for t, p in sorted(self._topics.items())
            ],
            "chunks": sorted(self._chunks.items()),
            "entries": count,
            "first": self.wheel.first_after(self.through[0]),
            "segments": sorted(self.wheel.max_due.items()),
            "segment_entries": self.wheel.segment_entries,
        }
        return doc, dirty

    def persist(self, dirty: dict[int, int]) -> None:
        """Make the index durable up to ``checkpoint_state`` (outside the lock)."""
        assert self.wheel is not None
        self.wheel.write_heads(dirty)

    def persisted(self, dirty: dict[int, int], doc: dict[str, Any]) -> None:
        """The checkpoint holding ``doc`` is saved (lock held): drop what it no
        longer needs (timer log segments due before its watermark)."""
        assert self.wheel is not None
        self.wheel.written(dirty)
        self.wheel.delete_below(int(doc["first"]))
        self.compact()

    def compact(self, budget: int = 16_384) -> int:
        """A step of compaction of the timer log (lock held): when it holds far
        more entries than records pending, copy the live entries of its oldest
        segment (one due far later than the others keeps it) to its end, at most
        ``budget`` entries looked at per step; once all are, the segment goes
        with the next checkpoint. Returns the entries copied."""
        assert self.wheel is not None
        wheel = self.wheel
        per = wheel.segment_entries
        oldest, active = wheel.first // per, wheel.count // per
        if self._compacting is None or self._compacting < wheel.first:
            self._compacting = None
            garbage = wheel.count - wheel.first - 4 * self.pending
            if active - oldest < 2 or garbage < 2 * per:
                return 0
            self._compacting = oldest * per
        at = self._compacting
        entries = wheel.read_entries(at, budget)
        if not entries:  # its segment is gone
            self._compacting = None
            return 0
        live: dict[int, set[Key]] = {}
        moves = []
        for entry in entries:
            key = (entry.due_ms, entry.target)
            if entry.cancel or key <= self.through:
                continue
            second = entry.due_ms // 1000
            if second not in live:
                live[second] = set(self._live(second))
            if key in live[second]:
                live[second].discard(key)  # one copy of a record's entries
                moves.append((entry.due_ms, entry.target, entry.topic_id))
        if moves:
            wheel.add(moves)
        at += len(entries)
        if at % per == 0:
            wheel.max_due[(at - 1) // per] = 0  # nothing in it is needed any more
            self._compacting = None
        else:
            self._compacting = at
        return len(moves)

    def close(self) -> None:
        if self.wheel is not None:
            self.wheel.close()
            self.wheel = None

    # -- appends ---------------------------------------------------------------------

    def due_times(self, deliver_at_ms: Sequence[int], count: int, now_ms: int) -> list[int]:
        """One due time per message, checked against the limits."""
        if len(deliver_at_ms) not in (1, count):
            raise InvalidArgument(
                f"{len(deliver_at_ms)} delivery times for {count} messages: give one for "
                "the batch or one per message"
            )
        latest = now_ms + self.config.max_delay_ms
        earliest = now_ms - self.config.past_tolerance_ms
        for due in deliver_at_ms:
            if type(due) is not int:
                raise InvalidArgument(f"deliver_at_ms {due!r} is not an integer (ms since epoch)")
        for due in (min(deliver_at_ms), max(deliver_at_ms)):
            if due > latest:
                raise InvalidArgument(
                    f"deliver_at_ms {due} is {due - now_ms} ms from now, beyond the maximum "
                    f"delay max_delay_ms={self.config.max_delay_ms} (the broker's --max-delay); "
                    "deliver sooner, or raise --max-delay (at most 366d)"
                )
            if due < earliest:
                raise InvalidArgument(
                    f"deliver_at_ms {due} is {now_ms - due} ms in the past, beyond "
                    f"past_tolerance_ms={self.config.past_tolerance_ms}; send it without a delay"
                )
        return list(deliver_at_ms) * count if len(deliver_at_ms) == 1 else list(deliver_at_ms)

    def clamp(self, dues: Sequence[int]) -> list[int]:
        """The due times new delayed records get: never below ``through``'s
        (a due time in the past is due at once), nor before the cursor's slot."""
        floor = max(self._floor_ms, self.through[0], self.cursor_sec * 1000)
        return [d if d > floor else floor for d in dues]

    def added(self, topic: str, positions: Sequence[int], dues: Sequence[int]) -> None:
        """Delayed records of ``topic`` were written at ``positions`` (lock held)."""
        assert self.wheel is not None
        tid = topic_id(topic)
        self.wheel.add_topic(dues, positions, tid)
        self._count_many(topic, dues, positions, 1)

    def _count(self, topic: str, due_ms: int, position: int, delta: int) -> None:
        self._count_many(topic, [due_ms], [position], delta)

    def _count_many(
        self, topic: str, dues: Sequence[int], positions: Sequence[int], delta: int
    ) -> None:
        """Records of ``topic`` due at ``dues``, lying at ``positions``, are
        pending (``delta`` 1) or no longer (-1)."""
        if not dues:
            return
        self.pending += delta * len(dues)
        pending = self._topics.setdefault(topic, _TopicPending())
        pending.count += delta * len(dues)
        _add_counts(pending.hours, _buckets(dues, HOUR_MS), delta)
        if not pending.count and not pending.hours:
            del self._topics[topic]
        _add_counts(self._chunks, _buckets(positions, self._log.capacity), delta)
        self._version += 1

    # -- what recovery and replicas apply (TxnScan) ----------------------------------

    def scan_added(self, position: int, meta: RecordMeta) -> None:
        """A delayed record found by a scan of the log."""
        if position >= self.from_position:
            self.added(meta.topic.decode(errors="replace"), [position], [meta.queue_offset])

    def scan_control(
        self, position: int, record: StoredMessage, derive: bool
    ) -> list[tuple[QueueKey, int, bytearray]]:
        """Apply a timer control record found by a scan of the log; for a
        deliver with ``derive``, return the index entries it makes."""
        if record.tag not in TAGS or position < self.from_position:
            return []
        control = decode_value(record.tag, record.value)
        if isinstance(control, Cancel):
            self._apply_cancel(control)
            return []
        metas = [self._meta(p) for p in control.positions]
        self._apply_deliver(control, metas)
        if not derive:
            return []
        start = self._log.start_position
        if any(m is None and p < start for p, m in zip(control.positions, metas, strict=True)):
            # Records retention deleted (an empty replica starting at its master's
            # log start): their offsets are gone with them; the log says where
            # the queues continue.
            log.warning("deliver at %d: some of its records were deleted", position)
            return []
        return _derive(control, metas, record.store_timestamp_ms)

    def _apply_cancel(self, cancel: Cancel) -> None:
        assert self.wheel is not None
        meta = self._meta(cancel.position)
        topic = "" if meta is None else meta.topic.decode(errors="replace")
        self.wheel.add([(cancel.due_ms, cancel.position, topic_id(topic))], cancel=True)
        if meta is not None and cancel.position >= self._base:
            self._count(topic, cancel.due_ms, cancel.position, -1)

    def _apply_deliver(self, deliver: Deliver, metas: Sequence[RecordMeta | None]) -> None:
        by_topic: dict[bytes, tuple[list[int], list[int]]] = {}
        for position, meta in zip(deliver.positions, metas, strict=True):
            if meta is not None and position >= self._base:
                dues, positions = by_topic.setdefault(meta.topic, ([], []))
                dues.append(meta.queue_offset)
                positions.append(position)
        for topic, (dues, positions) in by_topic.items():
            self._count_many(topic.decode(errors="replace"), dues, positions, -1)
        self.through = max(self.through, deliver.through)
        self.cursor_sec = max(self.cursor_sec, self.through[0] // 1000)
        self._floor_ms = max(self._floor_ms, self.through[0])

    def undo_tail(self, position: int) -> dict[QueueKey, int]:
        """The log is about to be cut at ``position`` (a replica's divergent
        tail): undo what its delayed and timer records did (lock held); return
        the first offset each cut deliver gave per queue (the index entries
        from there point before the cut, but go with it)."""
        assert self.wheel is not None
        cuts: dict[QueueKey, int] = {}
        found = list(self._log.iter_records(position))
        # Every record of the log was applied (by the checkpoint's counts or
        # after it): every one cut is undone; what is copied again is applied.
        self.from_position = min(self.from_position, position)
        for at, meta in reversed(found):
            if meta.flags & FLAG_DELAYED and not meta.flags & FLAG_CONTROL:
                self._count(meta.topic.decode(errors="replace"), meta.queue_offset, at, -1)
                continue
            if not meta.flags & FLAG_CONTROL or meta.tag.decode(errors="replace") not in TAGS:
                continue
            record = self._log.read(at, meta.frame_size)
            control = decode_value(record.tag, record.value)
            targets = [control.position] if isinstance(control, Cancel) else control.positions
            if isinstance(control, Deliver):
                self.through = min(self.through, control.before)
                for key, first, _ in control.queues:
                    cuts[key] = min(cuts.get(key, first), first)
            for target in targets:  # pending again: added anew (a cancel's is older)
                target_meta = self._meta(target)
                if target_meta is None:
                    continue
                topic = target_meta.topic.decode(errors="replace")
                self.wheel.add([(target_meta.queue_offset, target, topic_id(topic))])
                self._count(topic, target_meta.queue_offset, target, 1)
        self.cursor_sec = min(self.cursor_sec, self.through[0] // 1000)
        self._floor_ms = self.through[0]
        return cuts

    # -- delivery --------------------------------------------------------------------

    def select(self, now_ms: int, limit: int) -> list[Picked]:
        """Up to ``limit`` pending records due at ``now_ms``, in (due, position)
        order (lock held)."""
        assert self.wheel is not None
        picked: list[Picked] = []
        last_sec = now_ms // 1000
        if not self.pending:  # nothing to find before now (stale entries aside)
            self.cursor_sec = max(self.cursor_sec, last_sec)
            return picked
        start = max(self.cursor_sec, self.through[0] // 1000)
        if last_sec - start > 3600:  # no pending record is due before its hour
            start = max(start, self._first_hour(None) * 3600)
        full = False
        for sec in self.wheel.busy_seconds(start, last_sec):
            for key in self._live(sec):
                if key[0] > now_ms:
                    break
                meta = self._meta(key[1])
                if meta is None or meta.queue_offset != key[0] or not meta.flags & FLAG_TXN:
                    continue  # stale: its record is not (or no longer) there
                picked.append(Picked(key, meta))
                if len(picked) >= limit:
                    full = True
                    break
            if full:
                break
        if not full:
            self.cursor_sec = max(self.cursor_sec, last_sec)
        if picked:
            self._floor_ms = max(self._floor_ms, picked[-1].key[0])
        return picked

    def _live(self, sec: int, topic: int | None = None) -> list[Key]:
        """The live keys above ``through`` in the slot of second ``sec``, sorted.
        The last second's (of all topics) is kept while its chain's head stays:
        the timer thread reads the current second's every tick."""
        assert self.wheel is not None
        if topic is not None:
            keys = self._alive(sec, topic)
        else:
            head = self.wheel.head(sec % SLOTS)
            kept = self._live_kept
            if kept is None or kept[:2] != (sec, head):
                self._live_kept = kept = (sec, head, self._alive(sec, None))
            keys = kept[2]
        return keys[bisect.bisect_right(keys, self.through) :]

    def _alive(self, sec: int, topic: int | None, *, keep: bool = True) -> list[Key]:
        """The keys of the slot of ``sec`` not cancelled, sorted (``keep``: see
        ``Wheel.chain``)."""
        assert self.wheel is not None
        return _alive_keys(self.wheel.chain(sec, keep=keep), topic)

    def delivered(self, deliver: Deliver, picked: Sequence[Picked]) -> None:
        """The deliver record of ``picked`` is written (lock held)."""
        self._apply_deliver(deliver, [p.meta for p in picked])

    def pending_at(self, position: int) -> RecordMeta | None:
        """The pending delayed record at ``position``, if there is one."""
        meta = self._meta(position)
        if meta is None or (meta.queue_offset, position) <= self.through:
            return None
        live = self._live(meta.queue_offset // 1000)
        return meta if (meta.queue_offset, position) in live else None

    def cancelled(self, cancel: Cancel) -> None:
        """The cancel record is written (lock held)."""
        self._apply_cancel(cancel)

    # -- state -----------------------------------------------------------------------

    def summary(self, topic: str | None) -> tuple[int, int | None]:
        """(pending records, earliest due ms or None), of ``topic`` or all."""
        cached = self._earliest.get(topic)
        if cached is not None and cached[0] == self._version:
            earliest = cached[1]
        else:
            earliest = self._find_earliest(topic)
            self._earliest[topic] = (self._version, earliest)
        if topic is None:
            return self.pending, earliest
        pending = self._topics.get(topic)
        return (0 if pending is None else pending.count), earliest

    def _first_hour(self, topic: str | None) -> int:
        """The earliest hour a pending record (of ``topic``) is due in, or -1."""
        pendings = self._topics.values() if topic is None else [self._topics.get(topic)]
        hours = [h for p in pendings if p is not None for h, n in p.hours.items() if n > 0]
        return min(hours, default=-1)

    def _find_earliest(self, topic: str | None) -> int | None:
        assert self.wheel is not None
        hour = self._first_hour(topic)
        if hour < 0:
            return None
        tid = None if topic is None else topic_id(topic)
        through_sec = self.through[0] // 1000
        first = max(hour * 3600, self.cursor_sec, through_sec)
        budget = _EARLIEST_ENTRIES
        for visited, sec in enumerate(self.wheel.busy_seconds(first, hour * 3600 + 3599)):
            if visited >= _EARLIEST_SECONDS:  # a crowded hour: a lower bound will do
                return sec * 1000
            if tid is None and sec == through_sec:
                keys = self._live(sec)  # the current second: the timer thread keeps it
                if keys:
                    return keys[0][0]
                continue
            entries = self.wheel.chain(sec, keep=False, limit=budget)
            budget -= len(entries)
            if budget <= 0:  # a crowded second: a lower bound will do
                return sec * 1000
            keys = _alive_keys(entries, tid)
            at = bisect.bisect_right(keys, self.through)
            if at < len(keys):
                return keys[at][0]
        return hour * HOUR_MS

    def pinned(self) -> int | None:
        """Log position of the chunk of the oldest pending delayed record."""
        if not self._chunks:
            return None
        return min(self._chunks) * self._log.capacity

    def _meta(self, position: int) -> RecordMeta | None:
        """The delayed record at ``position``, if one lies there."""
        if not self._log.start_position <= position < self._log.write_position:
            return None
        try:
            meta = self._log.meta_at(position)
        except (StorageError, struct.error, ValueError, IndexError):
            return None
        if meta.position != position or meta.flags & FLAG_CONTROL:
            return None
        return meta if meta.flags & FLAG_DELAYED else None


def _alive_keys(chain: Sequence[Entry], topic: int | None) -> list[Key]:
    """The keys of a slot's ``chain`` (of ``topic``'s records, or all) not
    cancelled, sorted."""
    cancelled: dict[int, int] = {}
    adds: list[tuple[int, int, int]] = []
    for entry in chain:
        if entry.cancel:
            cancelled[entry.target] = max(cancelled.get(entry.target, -1), entry.number)
        elif topic is None or entry.topic_id == topic:
            adds.append((entry.due_ms, entry.target, entry.number))
    keys = {(due, target) for due, target, number in adds if number > cancelled.get(target, -1)}
    return sorted(keys)


def _buckets(values: Sequence[int], size: int) -> Counter[int]:
    """How many of ``values`` fall in each bucket of ``size`` (key: value // size)."""
    low, high = min(values) // size, max(values) // size
    if low == high:  # the usual case: one batch, one chunk (or hour)
        return Counter({low: len(values)})
    return Counter(map(operator.floordiv, values, itertools.repeat(size)))


def _add_counts(counts: dict[int, int], changes: Counter[int], delta: int) -> None:
    for key, n in changes.items():
        left = counts.get(key, 0) + n * delta
        if left:
            counts[key] = left
        else:
            counts.pop(key, None)


def _derive(
    deliver: Deliver, metas: Sequence[RecordMeta | None], store_ms: int
) -> list[tuple[QueueKey, int, bytearray]]:
    """The index entries a deliver record made, per queue (as a commit's)."""
    by_queue: dict[QueueKey, bytearray] = {}
    dropped = set(deliver.dropped)
    for position, meta in zip(deliver.positions, metas, strict=True):
        if meta is not None and position not in dropped:
            key = (meta.topic.decode(errors="replace"), meta.queue_id)
            by_queue.setdefault(key, bytearray()).extend(entry_for(position, meta))
    return derived_entries(deliver.queues, by_queue, store_ms, "deliver", "delayed records")
