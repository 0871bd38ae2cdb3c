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

Results are newest store time first, at most ``limit``; ``truncated`` says
more may match (the limit, or ``max_scan`` entries walked).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from equeue_broker.storage.engine import EngineState
from equeue_broker.storage.errors import CorruptionError, NotFound, PreconditionFailed
from equeue_broker.storage.keys.frames import frame_keys
from equeue_broker.storage.keys.key_index import KeyIndex, KeyIndexDamaged, ScanLimit
from equeue_broker.storage.reads import Reads
from equeue_proto.record import AT_POSITION, BODY_TO_FRAME, HEADER

MAX_LIMIT = 10_000
DEFAULT_LIMIT = 32
NO_END = (1 << 63) - 1


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
        with self._state.lock:
            created = self._state.topic(topic).created_position
            try:
                return self._by_key(keys, topic, key, start_ms, end_ms, limit, created)
            except KeyIndexDamaged as exc:
                keys.rebuild(self._state.log, str(exc))
                return self._by_key(keys, topic, key, start_ms, end_ms, limit, created)

    def _by_key(  # noqa: PLR0917 (the query's parts, called twice)
        self, keys: KeyIndex, topic: str, key: bytes, start_ms: int, end_ms: int, limit: int,
        created: int,
    ) -> QueryResult:  # fmt: skip
        topic_bytes = topic.encode()
        found: dict[int, FoundMessage] = {}
        truncated = False
        walk = keys.candidates(topic_bytes, key, end_ms, keys.config.max_scan)
        try:
            for position in walk:
                if position < created or position in found:
                    continue
                if len(found) >= limit:
                    truncated = True
                    break
                message = self._matching(position, topic_bytes, key)
                if message is not None and start_ms <= message.store_ms < end_ms:
                    found[position] = message
        except ScanLimit:
            truncated = True
        return QueryResult(_newest_first(found.values(), limit), truncated)

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
        if len(found) > limit:
            truncated = True
        return QueryResult(_newest_first(found, limit), truncated)

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
        return out


def _newest_first(messages: Iterable[FoundMessage], limit: int) -> list[FoundMessage]:
    ordered = sorted(messages, key=lambda m: (m.store_ms, m.position), reverse=True)
    return ordered[:limit]
