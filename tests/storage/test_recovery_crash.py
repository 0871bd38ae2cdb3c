"""Simulated machine crashes (every byte not fsynced dropped) and process crashes
(the page cache survives), in both flush modes.

As ``tests/storage/test_recovery.py``: build a store, crash it, reopen it, and assert
exactly which messages survive, at which offsets, with which bytes.
"""

from __future__ import annotations

from equeue_broker.storage import FlushMode, StorageConfig, Store
from tests.conftest import MakeConfig
from tests.support.faults import log_chunks, simulate_machine_crash
from tests.support.sent import (
    TOPIC,
    OpenStore,
    Sent,
    append,
    assert_queue_holds,
    read_queue,
    reopen,
    shape,
)

# -- machine and process crashes --------------------------------------------------------


def test_machine_crash_sync_mode_keeps_acknowledged(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """Sync mode: every append that returned is durable, across sealed chunks."""
    store = open_store(make_config(flush_mode=FlushMode.SYNC))
    store.create_topic(TOPIC, 2)
    sent: dict[int, list[Sent]] = {0: [], 1: []}
    for round_ in range(24):
        queue_id = round_ % 2
        sent[queue_id] += append(store, queue_id, f"r{round_}", 1 + round_ % 5, size=900)
    config = store.config
    assert len(log_chunks(config.data_dir)) >= 2
    simulate_machine_crash(store)

    store = open_store(config)
    assert store.recovery.index_entries_rebuilt == len(sent[0]) + len(sent[1])
    assert_queue_holds(store, 0, sent[0])
    assert_queue_holds(store, 1, sent[1])
    more = append(store, 0, "x", 2)
    assert more[0].offset == len(sent[0])
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, sent[0] + more)
    assert_queue_holds(store, 1, sent[1])


def crash_async(
    open_store: OpenStore, *, drop_unsynced_index: bool
) -> tuple[StorageConfig, dict[int, list[Sent]], dict[int, list[Sent]]]:
    """Async mode: flushed appends, then unflushed ones, then a machine crash.

    The unflushed appends cross into a new chunk: those that stayed in the
    sealed chunk were fsynced by the seal, those in the new active chunk are
    lost. Returns (config, flushed, unflushed) by queue.
    """
    store = open_store()
    store.create_topic(TOPIC, 2)
    flushed: dict[int, list[Sent]] = {0: [], 1: []}
    unflushed: dict[int, list[Sent]] = {0: [], 1: []}
    for round_ in range(8):
        flushed[round_ % 2] += append(store, round_ % 2, f"a{round_}", 3, size=800)
    store.flush()
    for round_ in range(24):
        unflushed[round_ % 2] += append(store, round_ % 2, f"b{round_}", 3, size=800)
    config = store.config
    assert len(log_chunks(config.data_dir)) == 2
    simulate_machine_crash(store, drop_unsynced_index=drop_unsynced_index)
    return config, flushed, unflushed


def check_after_async_crash(
    store: Store,
    open_store: OpenStore,
    flushed: dict[int, list[Sent]],
    unflushed: dict[int, list[Sent]],
) -> None:
    capacity = store.config.chunk_capacity_bytes
    for queue_id in (0, 1):
        messages = read_queue(store, queue_id)
        end = store.queue_info(TOPIC, queue_id).end
        assert end == len(messages) >= len(flushed[queue_id])
        assert [m.queue_offset for m in messages] == list(range(end))
        # What survives is a prefix of what was appended, byte for byte.
        written = flushed[queue_id] + unflushed[queue_id]
        assert [shape(m) for m in messages] == [s.shape() for s in written[:end]]
        # Exactly what was fsynced survives: the flushed appends and the
        # unflushed ones that a seal made durable.
        assert [s for s in written if s.position < capacity] == written[:end]
        assert 0 < end - len(flushed[queue_id]) < len(unflushed[queue_id])
    survivors = {q: (flushed[q] + unflushed[q])[: store.queue_info(TOPIC, q).end] for q in (0, 1)}
    more = {q: append(store, q, f"c{q}", 2) for q in (0, 1)}
    for queue_id in (0, 1):
        assert more[queue_id][0].offset == len(survivors[queue_id])
        assert more[queue_id][0].position >= capacity
        assert_queue_holds(store, queue_id, survivors[queue_id] + more[queue_id])
    store = reopen(open_store, store)
    for queue_id in (0, 1):
        assert_queue_holds(store, queue_id, survivors[queue_id] + more[queue_id])


def test_machine_crash_async_mode_loses_only_unflushed(open_store: OpenStore) -> None:
    config, flushed, unflushed = crash_async(open_store, drop_unsynced_index=True)
    store = open_store(config)
    assert store.recovery.tail_bytes_discarded == 0
    check_after_async_crash(store, open_store, flushed, unflushed)


def test_machine_crash_async_mode_index_outlives_log(open_store: OpenStore) -> None:
    """As above, but the unsynced index pages reached the disk and the log's did
    not: index entries of lost records must not resurrect them."""
    config, flushed, unflushed = crash_async(open_store, drop_unsynced_index=False)
    store = open_store(config)
    check_after_async_crash(store, open_store, flushed, unflushed)


def test_process_crash_async_mode_loses_nothing(open_store: OpenStore) -> None:
    """A killed process loses nothing it wrote: the page cache survives it. The
    index entries past the checkpoint are rebuilt from the log."""
    store = open_store()
    store.create_topic(TOPIC, 2)
    sent0 = append(store, 0, "a", 5) + append(store, 0, "b", 2)
    sent1 = append(store, 1, "c", 3)
    config = store.config
    store.abandon()

    store = open_store(config)
    assert store.recovery.tail_bytes_discarded == 0
    assert store.recovery.index_entries_rebuilt == len(sent0) + len(sent1)
    assert_queue_holds(store, 0, sent0)
    assert_queue_holds(store, 1, sent1)
