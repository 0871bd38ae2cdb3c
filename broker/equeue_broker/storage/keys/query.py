"""Queries of a topic's messages by key and by store-time range.

By key: the key index (key_index.py) names candidate log positions, newest
first; each candidate's record is read and kept only when

- it is readable now, as a read by message id would find it
  (``Reads.record_at``: a plain record below its queue's readable end and not
  below its earliest offset; a staged or delayed record only once committed or
  delivered, with its committed offset and store time; an aborted one never);
- it belongs to the asked topic and to its current incarnation (not below the
  topic's ``created_position``: a deleted topic's entries stay until their
  window expires);
- its key, or one of the keys of its ``keys`` header, equals the asked key
  byte for byte: a hash collision never returns another key's message;
- its store time lies in the asked range.

By time alone: per queue, the offsets of the range (``offset_for_timestamp``),
its newest ``limit`` records, merged by store time.

Results are newest store time first, at most ``limit`` and at most
``max_read_bytes`` of records (the reply stays under the gRPC size limit);
``truncated`` says more may match: the limit or the byte limit reached,
``max_scan`` entries walked, ``TIME_BUDGET_S`` spent, or the index changed
under a walk (retention, a replica's truncation, a rebuild).

A query by key walks its candidates ``CHUNK`` at a time and releases the
engine lock between chunks, so writes are not held behind a long walk.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from equeue_broker.storage.engine import EngineState
from equeue_broker.storage.errors import (
    ChunkQuarantined,
    CorruptionError,
    NotFound,
    PreconditionFailed,
)
from equeue_broker.storage.keys.frames import frame_keys
from equeue_broker.storage.keys.key_index import KeyIndex, KeyIndexDamaged, ScanLimit
from equeue_broker.storage.reads import Reads
from equeue_proto.record import AT_POSITION, BODY_TO_FRAME, FLAG_DELAYED, FLAG_TXN, HEADER

MAX_LIMIT = 10_000
DEFAULT_LIMIT = 32
NO_END = (1 << 63) - 1
_STAGED = FLAG_TXN | FLAG_DELAYED
CHUNK = 256
"""Candidates walked per hold of the engine lock."""
TIME_BUDGET_S = 0.5
"""A query by key stops (``truncated``) after this long: a key with millions
of entries (or a slow disk) cannot make one query run for minutes."""


@dataclass(slots=True)
class _Found:
    """What a query collected so far, within its limits."""

    limit: int
    max_bytes: int
    messages: dict[int, FoundMessage] = field(default_factory=dict)
    size: int = 0
    truncated: bool = False

    def full(self) -> bool:
        return len(self.messages) >= self.limit or self.size >= self.max_bytes

    def add(self, message: FoundMessage) -> None:
        """Keep ``message`` unless it would pass the byte limit (the first always fits)."""
        if self.messages and self.size + len(message.record) > self.max_bytes:
            self.truncated = True
            self.size = self.max_bytes
            return
        self.messages[message.position] = message
        self.size += len(message.record)


@dataclass(frozen=True, slots=True)
class FoundMessage:
    """One message a query found: its record as a read serves it."""

    record: bytes
    position: int
    store_ms: int


@dataclass(frozen=True, slots=True)
class QueryResult:
    messages: list[FoundMessage]
    truncated: bool


class KeyQuery:
    """Queries over one store (takes the engine lock)."""

    def __init__(self, state: EngineState, reads: Reads, keys: KeyIndex | None) -> None:
        self._state = state
        self._reads = reads
        self._keys = keys

    def by_key(
        self, topic: str, key: bytes, start_ms: int = 0, end_ms: int = NO_END,
        limit: int = DEFAULT_LIMIT,
    ) -> QueryResult:  # fmt: skip
        """The readable messages of ``topic`` with ``key``, stored in [start_ms, end_ms)."""
        if self._keys is None:
            raise PreconditionFailed(
                "the key index is off (broker setting --no-key-index / "
                "storage.key_index.enabled = false): query by time only, or turn it on"
            )
        keys = self._keys
        deadline = time.monotonic() + TIME_BUDGET_S
        try:
            return self._by_key(keys, topic, key, (start_ms, end_ms), limit, deadline)
        except KeyIndexDamaged:  # rebuilt where it was met (lock held): ask again
            return self._by_key(keys, topic, key, (start_ms, end_ms), limit, deadline)

    def _by_key(  # noqa: PLR0917 (the query's parts, called twice)
        self, keys: KeyIndex, topic: str, key: bytes, span: tuple[int, int], limit: int,
        deadline: float,
    ) -> QueryResult:  # fmt: skip
        topic_bytes = topic.encode()
        found = _Found(limit, self._state.config.max_read_bytes)
        walk: Iterator[int] | None = None
        generation = keys.generation
        done = False
        while not done:
            with self._state.lock:
                created = self._state.topic(topic).created_position  # deleted meanwhile: NotFound
                if walk is None:
                    walk = keys.candidates(topic_bytes, key, span[1], keys.config.max_scan)
                    generation = keys.generation
                elif keys.generation != generation:  # a window walked may be gone
                    found.truncated = True
                    break
                try:
                    done = self._walk(walk, found, topic_bytes, key, span, created)
                except KeyIndexDamaged as exc:  # rebuilt before another query meets it too
                    keys.rebuild(self._state.log, str(exc))
                    raise
            if not done and time.monotonic() >= deadline:
                found.truncated = True
                break
            time.sleep(0)  # let a writer waiting for the lock take it before the next chunk
        return QueryResult(_newest_first(found.messages.values(), limit), found.truncated)

    def _walk(  # noqa: PLR0917 (one chunk of _by_key's walk)
        self, walk: Iterator[int], found: _Found, topic: bytes, key: bytes,
        span: tuple[int, int], created: int,
    ) -> bool:  # fmt: skip
        """Walk up to ``CHUNK`` candidates (lock held); True when the walk is over."""
        try:
            for _ in range(CHUNK):
                position = next(walk, None)
                if position is None:
                    return True
                if position < created or position in found.messages:
                    continue
                if found.full():
                    found.truncated = True
                    return True
                if self._skippable(position, topic, span[0]):
                    continue
                message = self._matching(position, topic, key)
                if message is not None and span[0] <= message.store_ms < span[1]:
                    found.add(message)
        except ScanLimit:
            found.truncated = True
            return True
        return False

    def _skippable(self, position: int, topic: bytes, start_ms: int) -> bool:
        """True when the record at ``position`` cannot match, from its fixed
        fields alone (no copy): another topic's (a hash collision), or a plain
        record stored before ``start_ms`` (its store time is final; a staged or
        delayed record's is its commit's or delivery's: read it)."""
        try:
            meta = self._state.log.meta_at(position)
        except (CorruptionError, ChunkQuarantined, struct.error, ValueError):
            return False  # _matching decides (and skips what it cannot read)
        if meta.topic != topic:
            return True
        return not meta.flags & _STAGED and meta.store_timestamp_ms < start_ms

    def _matching(self, position: int, topic: bytes, key: bytes) -> FoundMessage | None:
        """The readable record at ``position`` if it is ``topic``'s and has ``key``."""
        try:
            record = self._reads.record_at(position)
        except (NotFound, CorruptionError):
            return None  # not readable (staged, pending, aborted, expired) or damaged
        _size, _flags, record_topic, store_ms, record_keys = frame_keys(
            record, 0, self._keys.config.max_extra_keys if self._keys else 32
        )
        if record_topic != topic or key not in record_keys:
            return None
        return FoundMessage(record, position, store_ms)

    def by_time(
        self, topic: str, start_ms: int = 0, end_ms: int = NO_END, limit: int = DEFAULT_LIMIT
    ) -> QueryResult:
        """The newest ``limit`` readable messages of ``topic`` stored in [start_ms, end_ms)."""
        reads = self._reads
        found: list[FoundMessage] = []
        truncated = False
        max_bytes = self._state.config.max_read_bytes
        with self._state.lock:
            meta = self._state.topic(topic)
            for q in meta.queues:
                queue = self._state.live_queue(topic, q.queue_id)
                low = reads.offset_for_timestamp(topic, q.queue_id, start_ms) if start_ms else 0
                low = max(low, queue.index.earliest)
                high = queue.visible_end
                if end_ms != NO_END:
                    high = reads.offset_for_timestamp(topic, q.queue_id, end_ms)
                first = max(low, high - limit)
                truncated |= first > low
                found += self._read_range(topic, q.queue_id, first, high)
                found, cut = _newest_within(found, limit, max_bytes)
                truncated |= cut
        return QueryResult(found, truncated)

    def _read_range(self, topic: str, queue_id: int, first: int, end: int) -> list[FoundMessage]:
        """The records of offsets [first, end) of a queue (lock held)."""
        out: list[FoundMessage] = []
        offset = first
        while offset < end:
            config = self._state.config
            result = self._reads.read_records(
                topic, queue_id, offset,
                max_messages=min(end - offset, 1000, config.max_read_messages),
                max_bytes=min(4 << 20, config.max_read_bytes),
            )  # fmt: skip
            if result.count == 0:
                break
            data = result.records
            pos = 0
            for _ in range(result.count):
                fields = HEADER.unpack_from(data, pos)
                size = fields[0] + BODY_TO_FRAME
                position = int.from_bytes(data[pos + AT_POSITION : pos + AT_POSITION + 8], "little")
                out.append(FoundMessage(bytes(data[pos : pos + size]), position, fields[7]))
                pos += size
            offset = result.next_offset
            out, _cut = _newest_within(out, len(out), config.max_read_bytes)  # memory bound
        return out


def _newest_within(
    messages: Iterable[FoundMessage], limit: int, max_bytes: int
) -> tuple[list[FoundMessage], bool]:
    """The newest ``limit`` of ``messages`` whose records total at most
    ``max_bytes`` (the newest always), newest first; True if any was left out."""
    ordered = sorted(messages, key=lambda m: (m.store_ms, m.position), reverse=True)
    kept: list[FoundMessage] = []
    size = 0
    for message in ordered:
        if len(kept) >= limit or (kept and size + len(message.record) > max_bytes):
            return kept, True
        kept.append(message)
        size += len(message.record)
    return kept, False


def _newest_first(messages: Iterable[FoundMessage], limit: int) -> list[FoundMessage]:
    ordered = sorted(messages, key=lambda m: (m.store_ms, m.position), reverse=True)
    return ordered[:limit]
