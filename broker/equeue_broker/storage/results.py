"""What the store's calls return: read, append, queue and report values.

These types are the store's public vocabulary (``equeue_broker.storage``
re-exports them), used by the server and by every storage module that builds
one. They live apart from ``store.py`` so that the read, recovery and retention
modules can return them without importing the store, which imports them.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from equeue_broker.storage.index.queue_index import ENTRY_SIZE
from equeue_proto.record import StoredMessage

_FIRST = struct.Struct("<Q")
_LAST = struct.Struct("<QI")
"""An index entry's leading fields: log position + 1, then the record's size (queue_index.py)."""


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
``Reads.read_records``); called with the read's result, ``records`` still empty."""


@dataclass(frozen=True)
class AppendResult:
    topic: str
    queue_id: int
    first_offset: int
    count: int
    entries: bytes | bytearray = field(repr=False)
    """The index entries written, one per message (see queue_index.py)."""
    duplicate: bool = False
    """An idempotent batch appended before: nothing was written, the result
    is the original append's (its entries read back from the index)."""
    deliver_at_ms: tuple[int, ...] = ()
    """Delayed records (``first_offset`` -1): each one's due time, as stored
    (a time in the past is raised to the timer's watermark: due at once)."""

    def first_position(self) -> int:
        """Global log position of the first message (-1 if not known)."""
        return int.from_bytes(self.entries[:8], "little") - 1 if self.entries else -1

    @property
    def nbytes(self) -> int:
        """Log bytes the append wrote for its records (0 for a duplicate), in
        O(1) from the first and the last index entry, never a sum per message
        (the hot path: byte counters). A batch written in pieces across a chunk
        boundary also counts the sealed chunk's footer and unused tail."""
        if self.duplicate or len(self.entries) < ENTRY_SIZE:
            return 0
        (first,) = _FIRST.unpack_from(self.entries)
        last, size = _LAST.unpack_from(self.entries, len(self.entries) - ENTRY_SIZE)
        return int(last + size - first)

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
