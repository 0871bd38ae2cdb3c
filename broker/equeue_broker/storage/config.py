"""Typed configuration of the storage engine: defaults, units and limits.

Every size is in bytes and every duration carries its unit in its name. Values
are validated when the object is built, so a bad config fails at start-up with a
message naming the field, never later in the middle of a write.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from equeue_broker.storage.errors import InvalidArgument

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

UNIT = "unit"
"""Key of a field's unit in its dataclass metadata: ``bytes``, ``ms`` or what a
count counts. Read it with ``dataclasses.fields``; the broker's ``--help`` and
sample config show it next to each default."""

#: Hard upper bounds that no configuration may exceed (they size on-disk fields).
MAX_QUEUES_PER_TOPIC_LIMIT = 1024
MAX_CHUNK_CAPACITY_BYTES = 4 * GiB - 1
MIN_CHUNK_CAPACITY_BYTES = 4 * KiB


class FlushMode(enum.Enum):
    """When appended data is made durable (fsync).

    ``ASYNC``: an append returns once the records are in the OS page cache; a
    background thread fsyncs every ``flush_interval_ms``. A machine crash loses at
    most the last interval; a process crash (SIGKILL) loses nothing, because the
    page cache survives the process. Readers see records as soon as they are written.

    ``SYNC``: an append returns only after an fsync covering its records has
    completed. Concurrent appenders share one fsync (group commit). Readers see a
    record only once it is durable.
    """

    ASYNC = "async"
    SYNC = "sync"


@dataclass(frozen=True)
class MessageLimits:
    """Size and count limits on what one append may carry."""

    max_message_bytes: int = field(default=4 * MiB, metadata={UNIT: "bytes"})
    """Largest encoded record (value + key + tag + headers + framing)."""
    max_key_bytes: int = field(default=64 * KiB, metadata={UNIT: "bytes"})
    max_tag_bytes: int = field(default=255, metadata={UNIT: "bytes"})
    """Tags are short labels for broker-side filtering; the record stores the length in a byte."""
    max_headers: int = field(default=64, metadata={UNIT: "headers"})
    """Headers per message."""
    max_header_key_bytes: int = field(default=255, metadata={UNIT: "bytes"})
    max_batch_messages: int = field(default=100_000, metadata={UNIT: "messages"})
    max_batch_bytes: int = field(default=64 * MiB, metadata={UNIT: "bytes"})
    """Sum of value/key/header bytes in one append call."""

    def __post_init__(self) -> None:
        _positive(self, "max_message_bytes", "max_key_bytes", "max_batch_messages")
        _positive(self, "max_batch_bytes", "max_headers", "max_header_key_bytes")
        _at_most(self, "max_tag_bytes", 255)
        _at_most(self, "max_header_key_bytes", 65_535)
        _at_most(self, "max_headers", 65_535)


@dataclass(frozen=True)
class RetentionConfig:
    """Which completed log chunks may be deleted. ``None`` disables a rule.

    The active (last) chunk is never deleted. With ``keep_unconsumed`` a chunk is
    kept while any consumer group's committed offset still points into it or
    before it, even if the count or age rule would delete it.
    """

    max_chunks: int | None = field(default=100, metadata={UNIT: "chunks"})
    """Keep at most this many completed chunks (EQueue's default)."""
    max_age_ms: int | None = field(default=7 * 24 * 3600 * 1000, metadata={UNIT: "ms"})
    """Delete completed chunks sealed longer ago than this (7 days)."""
    keep_unconsumed: bool = False
    check_interval_ms: int = field(default=60_000, metadata={UNIT: "ms"})
    """How often the background thread applies retention."""

    def __post_init__(self) -> None:
        if self.max_chunks is not None and self.max_chunks < 0:
            raise InvalidArgument(f"retention.max_chunks must be >= 0, got {self.max_chunks}")
        if self.max_age_ms is not None and self.max_age_ms < 0:
            raise InvalidArgument(f"retention.max_age_ms must be >= 0, got {self.max_age_ms}")
        _positive(self, "check_interval_ms")


@dataclass(frozen=True)
class TransactionConfig:
    """Limits of staged transactions (see transactions.py)."""

    timeout_ms: int = field(default=15 * 60_000, metadata={UNIT: "ms"})
    """An open transaction not written to or committed for this long is aborted."""
    max_open: int = field(default=10_000, metadata={UNIT: "transactions"})
    """Open transactions at once (each keeps 32 B of memory per staged message)."""
    max_bytes: int = field(default=1024 * MiB, metadata={UNIT: "bytes"})
    """Staged bytes per transaction (they are in the log: an open transaction
    keeps retention from deleting its first chunk and every later one)."""
    max_per_commit: int = field(default=10_000, metadata={UNIT: "transactions"})
    """Transactions one commit call may name."""
    max_sinks: int = field(default=10_000, metadata={UNIT: "sinks"})
    """Sinks whose last committed batch is remembered (oldest forgotten first)."""
    sink_ttl_ms: int = field(default=7 * 24 * 3600 * 1000, metadata={UNIT: "ms"})
    """A sink not committed to for this long is forgotten (7 days)."""
    check_after_ms: int = field(default=6_000, metadata={UNIT: "ms"})
    """A transaction with a producer group is first checked with a producer of
    the group this long after its last staged write (RocketMQ's 6 s)."""
    check_every_ms: int = field(default=30_000, metadata={UNIT: "ms"})
    """Then again this often while the answer is unknown or nobody answers."""
    check_max: int = field(default=15, metadata={UNIT: "checks"})
    """Checks of one transaction at most; then ``check_exhausted`` applies."""
    check_exhausted: str = "rollback"
    """After ``check_max`` unanswered checks: "rollback" at once, or "keep"
    (left open until ``timeout_ms`` aborts it)."""

    def __post_init__(self) -> None:
        _positive(self, "timeout_ms", "max_open", "max_bytes", "max_per_commit", "max_sinks")
        _positive(self, "sink_ttl_ms", "check_after_ms", "check_every_ms", "check_max")
        if self.check_exhausted not in ("rollback", "keep"):
            raise InvalidArgument(
                f"check_exhausted must be 'rollback' or 'keep', got {self.check_exhausted!r}"
            )
        # check_after_ms >= timeout_ms is allowed (a transaction then times out
        # before its first check): refusing it would stop brokers started with a
        # short --transaction-timeout-ms and no check settings from starting.


@dataclass(frozen=True)
class ProducerConfig:
    """Limits of idempotent producers' state (producers/table.py)."""

    max_producers: int = field(default=10_000, metadata={UNIT: "producers"})
    """Producer ids remembered at once; beyond it the least recently written
    one is forgotten (its next batch with a sequence other than 0 is refused
    as from an unknown producer, and it asks for a new epoch)."""
    window: int = field(default=5, metadata={UNIT: "batches"})
    """Batches per producer and queue whose offsets are remembered: a retry of
    one of them is acknowledged again, an older one refused (Kafka keeps 5)."""
    max_queues_per_producer: int = field(default=1_024, metadata={UNIT: "queues"})
    """Queues one producer id may write (the state it makes the broker keep)."""
    idle_expiry_ms: int = field(default=7 * 24 * 3600 * 1000, metadata={UNIT: "ms"})
    """A producer that wrote nothing for this long is forgotten (7 days)."""

    def __post_init__(self) -> None:
        _positive(self, "max_producers", "window", "max_queues_per_producer", "idle_expiry_ms")
        _at_most(self, "window", 1_000)


MAX_DELAY_LIMIT_MS = 366 * 24 * 3600 * 1000
"""The longest delay a store can be configured for (its timer wheel covers it)."""


@dataclass(frozen=True)
class TimerConfig:
    """Delayed delivery (storage/timer/)."""

    max_delay_ms: int = field(default=7 * 24 * 3600 * 1000, metadata={UNIT: "ms"})
    """A delivery time later than now plus this is refused (at most 366 days)."""
    past_tolerance_ms: int = field(default=15 * 60_000, metadata={UNIT: "ms"})
    """A delivery time earlier than now minus this is refused; a later past one
    is due at once."""
    tick_ms: int = field(default=100, metadata={UNIT: "ms"})
    """How often the store's timer thread delivers what is due."""
    max_deliver_batch: int = field(default=4096, metadata={UNIT: "messages"})
    """Records one deliver record makes visible at most."""
    segment_entries: int = field(default=1 << 20, metadata={UNIT: "entries"})
    """Entries per timer log segment file (32 bytes each), for a new timer index."""

    def __post_init__(self) -> None:
        _positive(self, "tick_ms", "max_deliver_batch", "past_tolerance_ms", "segment_entries")
        if not isinstance(self.max_delay_ms, int) or not (
            0 < self.max_delay_ms <= MAX_DELAY_LIMIT_MS
        ):
            raise InvalidArgument(
                f"max_delay_ms must be in [1, {MAX_DELAY_LIMIT_MS}] (366 days), "
                f"got {self.max_delay_ms!r}"
            )


@dataclass(frozen=True)
class KeyIndexConfig:
    """The key index (storage/keys/): which records are found by key."""

    enabled: bool = True
    """Index every record's keys as it is written; off: nothing is written and
    a query by key is refused (a query by time still works)."""
    slot_count: int = field(default=1 << 22, metadata={UNIT: "slots"})
    """Hash slots per index file (4 bytes each: 16 MiB, held in memory for the
    active file)."""
    entries_per_file: int = field(default=1 << 24, metadata={UNIT: "entries"})
    """Entries per index file (32 bytes each; the file is sparse)."""
    window_ms: int = field(default=3_600_000, metadata={UNIT: "ms"})
    """Store time one index file covers at most (a time query skips whole files)."""
    max_scan: int = field(default=100_000, metadata={UNIT: "entries"})
    """Index entries one query walks at most; then its reply says truncated."""
    max_extra_keys: int = field(default=32, metadata={UNIT: "keys"})
    """Keys of one message's "keys" header that are indexed; more are ignored."""

    def __post_init__(self) -> None:
        _positive(self, "slot_count", "entries_per_file", "window_ms", "max_scan", "max_extra_keys")
        _at_most(self, "slot_count", 1 << 30)
        _at_most(self, "entries_per_file", (1 << 32) - 2)
        _at_most(self, "window_ms", 49 * 24 * 3600 * 1000)


@dataclass(frozen=True)
class StorageConfig:
    """Configuration of one store (one data directory)."""

    data_dir: Path
    chunk_capacity_bytes: int = field(default=256 * MiB, metadata={UNIT: "bytes"})
    """Data bytes per message-log chunk (header and footer come on top). An
    existing log keeps the capacity it was created with."""
    index_entries_per_chunk: int = field(default=1_000_000, metadata={UNIT: "entries"})
    """Queue-index entries per index chunk file (32 bytes each)."""
    flush_mode: FlushMode = FlushMode.ASYNC
    flush_interval_ms: int = field(default=100, metadata={UNIT: "ms"})
    """Async mode: fsync period. Both modes: how often indexes and the checkpoint are synced."""
    sync_timeout_ms: int = field(default=30_000, metadata={UNIT: "ms"})
    """Sync mode: longest an append waits for its fsync before failing."""
    offsets_flush_interval_ms: int = field(default=1_000, metadata={UNIT: "ms"})
    """Async mode: how often committed consumer offsets are persisted (sync mode
    persists them before a commit returns)."""
    default_queue_count: int = field(default=4, metadata={UNIT: "queues"})
    max_queues_per_topic: int = field(default=256, metadata={UNIT: "queues"})
    max_topics: int = field(default=1_000, metadata={UNIT: "topics"})
    """Index files open at once are bounded by ``max_open_index_files``."""
    max_open_index_files: int = field(default=4_096, metadata={UNIT: "files"})
    """Descriptor bound: index chunk files kept open, least recently used
    closed first (index_files.py), so many queues cannot exhaust descriptors."""
    max_mapped_chunks: int = field(default=4, metadata={UNIT: "chunks"})
    """Memory bound: at most this many sealed log chunks stay memory-mapped for
    reads (the active chunk is always mapped); older ones are read with pread."""
    max_read_messages: int = field(default=10_000, metadata={UNIT: "messages"})
    max_read_bytes: int = field(default=64 * MiB, metadata={UNIT: "bytes"})
    max_filter_scan: int = field(default=100_000, metadata={UNIT: "entries"})
    """A tag-filtered read inspects at most this many index entries per call."""
    max_schema_bytes: int = field(default=256 * KiB, metadata={UNIT: "bytes"})
    """Longest schema text (normalized) one topic's version may have."""
    max_schema_versions: int = field(default=1_000, metadata={UNIT: "versions"})
    """Versions one subject (a topic's value or key schema) keeps at most; then
    SetSchema is refused (RESOURCE_EXHAUSTED): delete the subject and start again."""
    limits: MessageLimits = field(default_factory=MessageLimits)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    transactions: TransactionConfig = field(default_factory=TransactionConfig)
    producers: ProducerConfig = field(default_factory=ProducerConfig)
    timer: TimerConfig = field(default_factory=TimerConfig)
    key_index: KeyIndexConfig = field(default_factory=KeyIndexConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        mode: object = self.flush_mode
        if not isinstance(mode, FlushMode):  # accept "sync"/"async" from config files
            try:
                object.__setattr__(self, "flush_mode", FlushMode(mode))
            except ValueError:
                raise InvalidArgument(
                    f"flush_mode must be 'sync' or 'async', got {self.flush_mode!r}"
                ) from None
        if not MIN_CHUNK_CAPACITY_BYTES <= self.chunk_capacity_bytes <= MAX_CHUNK_CAPACITY_BYTES:
            raise InvalidArgument(
                f"chunk_capacity_bytes must be in [{MIN_CHUNK_CAPACITY_BYTES}, "
                f"{MAX_CHUNK_CAPACITY_BYTES}], got {self.chunk_capacity_bytes}"
            )
        if self.limits.max_message_bytes > self.chunk_capacity_bytes:
            raise InvalidArgument(
                f"limits.max_message_bytes ({self.limits.max_message_bytes}) must not exceed "
                f"chunk_capacity_bytes ({self.chunk_capacity_bytes}): records never span chunks"
            )
        _positive(self, "index_entries_per_chunk", "flush_interval_ms", "default_queue_count")
        _positive(self, "offsets_flush_interval_ms", "max_topics", "max_mapped_chunks")
        _positive(self, "max_open_index_files")
        _positive(self, "sync_timeout_ms")
        _positive(self, "max_read_messages", "max_read_bytes", "max_filter_scan")
        _at_most(self, "max_schema_bytes", 16 * MiB)
        _at_most(self, "max_schema_versions", 100_000)
        _at_most(self, "max_queues_per_topic", MAX_QUEUES_PER_TOPIC_LIMIT)
        _at_most(self, "default_queue_count", self.max_queues_per_topic)


def _positive(obj: object, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InvalidArgument(f"{name} must be a positive integer, got {value!r}")


def _at_most(obj: object, name: str, limit: int) -> None:
    value = getattr(obj, name)
    if not isinstance(value, int) or not 1 <= value <= limit:
        raise InvalidArgument(f"{name} must be an integer in [1, {limit}], got {value!r}")
