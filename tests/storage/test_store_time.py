"""Store times by offset (``Reads.store_time``), an append's stored bytes
(``AppendResult.nbytes``) and the fsync timer (``Store.fsync_times``): the
figures group lag in seconds, byte counters and fsync latency are made of."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from equeue_broker.storage import FlushMode, NotFound, RetentionConfig, Store
from equeue_broker.storage.index.queue_index import ENTRY
from equeue_broker.storage.log.flush import FSYNC_BUCKETS, FsyncTimes
from equeue_broker.storage.log.record import MessageBatch
from equeue_broker.storage.producers.table import Idempotence
from tests.conftest import MakeConfig

OpenStore = Callable[..., Store]


def values(n: int, size: int = 100) -> list[bytes]:
    return [f"m{i}:".encode().ljust(size, b".") for i in range(n)]


def stored_sizes(entries: bytes | bytearray) -> int:
    """The records' sizes summed from their index entries (the slow way)."""
    return sum(ENTRY.unpack_from(entries, i)[1] for i in range(0, len(entries), ENTRY.size))


def test_store_time_at_the_first_a_middle_and_the_end_offset(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    before = int(time.time() * 1000)
    store.append("t", 0, MessageBatch(values(5)))
    time.sleep(0.02)  # a later batch has a later store time (ms resolution)
    store.append("t", 0, MessageBatch(values(5)))
    after = int(time.time() * 1000)
    messages = store.read("t", 0, 0).messages
    for offset in (0, 4, 5, 9):
        stamp = store.reads.store_time("t", 0, offset)
        assert stamp == messages[offset].store_timestamp_ms
        assert stamp is not None and before <= stamp <= after
    assert messages[0].store_timestamp_ms < messages[5].store_timestamp_ms
    assert store.reads.store_time("t", 0, 10) is None  # the end: nothing unconsumed
    assert store.reads.store_time("t", 0, 99) is None
    with pytest.raises(NotFound):
        store.reads.store_time("t", 1, 0)
    with pytest.raises(NotFound):
        store.reads.store_time("nope", 0, 0)


def test_store_time_below_the_earliest_reads_the_earliest(make_config: MakeConfig) -> None:
    """A group whose committed offset retention overtook next consumes the
    earliest retained message: its store time is the lag's age."""
    config = make_config(retention=RetentionConfig(max_chunks=1, max_age_ms=None))
    store = Store(config, background=False)
    try:
        store.create_topic("t", 1)
        for _ in range(20):
            store.append("t", 0, MessageBatch(values(40, 500)))
        store.apply_retention()
        earliest = store.queue_info("t", 0).earliest
        assert earliest > 0  # retention removed the head
        first = store.read("t", 0, earliest, max_messages=1).messages[0]
        assert store.reads.store_time("t", 0, 0) == first.store_timestamp_ms
        assert store.reads.store_time("t", 0, earliest) == first.store_timestamp_ms
    finally:
        store.close()


def test_append_nbytes_is_the_stored_records_bytes(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    result = store.append("t", 0, MessageBatch(values(50, 300), keys=[b"k"] * 50))
    assert result.nbytes == stored_sizes(result.entries) > 50 * 300
    one = store.append("t", 0, MessageBatch([b"x"]))
    assert one.nbytes == stored_sizes(one.entries)


def test_append_nbytes_across_a_chunk_boundary_counts_the_gap(open_store: OpenStore) -> None:
    """A batch written in pieces across chunks also counts the sealed chunk's
    tail (documented: O(1), never a sum per message)."""
    store = open_store()
    store.create_topic("t", 1)
    store.append("t", 0, MessageBatch(values(1, 1000)))
    big = store.append("t", 0, MessageBatch(values(200, 1000)))  # > a 64 KiB chunk
    assert big.nbytes >= stored_sizes(big.entries)
    assert big.nbytes - stored_sizes(big.entries) < 8 * 1024 * 4  # a few chunk tails at most


def test_a_duplicate_append_wrote_no_bytes(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    producer_id, epoch = store.init_producer(0)
    idem = Idempotence(producer_id, epoch, 0)
    first = store.append("t", 0, MessageBatch(values(3)), idem)
    again = store.append("t", 0, MessageBatch(values(3)), idem)
    assert first.nbytes > 0
    assert again.duplicate and again.nbytes == 0


def test_delayed_append_nbytes(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    due = int(time.time() * 1000) + 3_600_000
    result = store.append("t", 0, MessageBatch(values(4)), deliver_at_ms=[due])
    assert result.first_offset == -1
    assert result.nbytes == stored_sizes(result.entries) > 0


def test_fsync_times_count_each_log_fsync(make_config: MakeConfig) -> None:
    store = Store(make_config(flush_mode=FlushMode.SYNC), background=False)
    try:
        store.create_topic("t", 1)
        counts, total = store.fsync_times.snapshot()
        assert len(counts) == len(FSYNC_BUCKETS) + 1
        before = sum(counts)
        for _ in range(3):
            store.append("t", 0, MessageBatch(values(2)))
        counts, total = store.fsync_times.snapshot()
        assert sum(counts) - before == store.stats()["fsyncs"] - before >= 3
        assert total > 0
    finally:
        store.close()


def test_fsync_times_buckets() -> None:
    times = FsyncTimes((0.001, 0.01))
    for seconds in (0.0005, 0.001, 0.002, 0.5):
        times.observe(seconds)
    counts, total = times.snapshot()
    assert counts == [2, 1, 1]  # a bound is inclusive (Prometheus' le)
    assert total == pytest.approx(0.5035)
    counts[0] = 99  # a copy
    assert times.snapshot()[0] == [2, 1, 1]
