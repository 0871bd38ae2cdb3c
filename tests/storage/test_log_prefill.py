"""Sync mode's prefill: zeros written ahead of the log's data end (message_log.py).

An fdatasync of records written over blocks that already hold synced zeros
commits no file-system journal (the blocks are allocated). The zeros must
change nothing a reader or recovery sees: records stay where they were
written, the tail scan finds the same data end, and a crash (process or
machine) keeps exactly what was acknowledged.
"""

from __future__ import annotations

import os
from pathlib import Path

from equeue_broker.storage import FlushMode, Store
from equeue_broker.storage.log.chunk import HEADER_SIZE, data_extents
from equeue_broker.storage.log.message_log import MessageLog
from tests.conftest import MakeConfig
from tests.support.faults import simulate_machine_crash
from tests.support.sent import (
    TOPIC,
    OpenStore,
    Sent,
    append,
    assert_queue_holds,
    reopen,
)

MiB = 1 << 20
STEP = 256 * 1024


def open_log(directory: Path, capacity: int = 4 * MiB) -> MessageLog:
    log = MessageLog(directory, capacity, max_mapped=2)
    log.open()
    log.prefill_bytes = STEP
    return log


def test_prefill_writes_zeros_ahead_then_waits_for_half_a_step(tmp_path: Path) -> None:
    log = open_log(tmp_path / "log")
    try:
        log.append_bytes(b"r" * 1000)
        assert log.prefill()
        chunk = log.active
        assert chunk.filled_end == HEADER_SIZE + 1000 + STEP
        # The data area up to filled_end is written blocks, not a hole.
        extents = data_extents(chunk.fd, HEADER_SIZE, HEADER_SIZE + chunk.capacity)
        assert extents and extents[-1][1] >= chunk.filled_end
        assert os.pread(chunk.fd, STEP, HEADER_SIZE + 1000) == bytes(STEP)
        assert not log.prefill()  # more than half a step is still ahead
        log.append_bytes(b"s" * (STEP // 2 + 1))
        assert log.prefill()  # refilled from where the zeros ended
        assert chunk.filled_end == HEADER_SIZE + chunk.data_size + STEP
        assert os.pread(chunk.fd, 1000, HEADER_SIZE) == b"r" * 1000  # records untouched
    finally:
        log.close()


def test_prefill_stops_at_the_chunk_capacity(tmp_path: Path) -> None:
    log = open_log(tmp_path / "log", capacity=STEP + STEP // 4)
    try:
        log.append_bytes(b"r" * 100)
        assert log.prefill()
        log.append_bytes(b"s" * (STEP // 2 + 1))
        assert log.prefill()
        assert log.active.filled_end == HEADER_SIZE + log.capacity  # not into the footer room
        assert not log.prefill()
    finally:
        log.close()


def test_prefill_is_off_by_default(tmp_path: Path) -> None:
    log = MessageLog(tmp_path / "log", 4 * MiB, max_mapped=2)
    log.open()
    try:
        log.append_bytes(b"r" * 100)
        assert not log.prefill()
    finally:
        log.close()


def sync_store_with_prefill(
    open_store: OpenStore, make_config: MakeConfig
) -> tuple[Store, list[Sent]]:
    """A sync-mode store whose appends ran past prefilled zeros and stop inside them."""
    store = open_store(make_config(flush_mode=FlushMode.SYNC, chunk_capacity_bytes=8 * MiB))
    store.create_topic(TOPIC, 1)
    state = store._state
    assert state.log.prefill_bytes > 0  # sync mode turns it on
    sent: list[Sent] = []
    for round_ in range(6):
        sent += append(store, 0, f"r{round_}", 20, size=1000)
        store._prefill_log()  # what the committer thread runs between rounds
        assert state.log.active.filled_end > HEADER_SIZE + state.log.active.data_size
    assert state.commit.durable == state.log.write_position  # the zeros' sync published
    stats = store.stats()
    assert stats["prefill_syncs"] >= 1  # counted apart from the appends' fsyncs
    assert sum(store.fsync_times.snapshot()[0]) == stats["fsyncs"]
    return store, sent


def test_sync_store_with_prefill_survives_a_process_crash(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    store, sent = sync_store_with_prefill(open_store, make_config)
    config = store.config
    store.abandon()
    store = open_store(config)
    assert store.recovery.tail_bytes_discarded == 0  # zeros are not a torn append
    assert_queue_holds(store, 0, sent)
    more = append(store, 0, "after", 3)
    assert more[0].offset == len(sent)
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, sent + more)


def test_sync_store_with_prefill_survives_a_machine_crash(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    store, sent = sync_store_with_prefill(open_store, make_config)
    config = store.config
    simulate_machine_crash(store)
    store = open_store(config)
    assert_queue_holds(store, 0, sent)
