"""Fault injection on real files: damage a store's files, reopen, check what survives.

In the style of leveldb's ``log_test.cc``: each test builds a store in a tmp dir,
appends known messages (``tests/support/sent.py``), closes (or abandons) it,
performs byte surgery on its files with the helpers of ``tests/support/faults.py``,
reopens it and asserts exactly which messages survive, at which offsets, with
which bytes.

This module: the message log (its tail, sealed chunks) and the queue indexes
out of step with it. Metadata files and leftovers: ``test_recovery_files.py``;
simulated machine and process crashes: ``test_recovery_crash.py``.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from equeue_broker.storage import (
    CorruptionError,
    DiskFullError,
    FlushMode,
    ReadStatus,
    Store,
)
from equeue_broker.storage.index.queue_index import ENTRY, ENTRY_SIZE, QueueIndex
from equeue_broker.storage.log.chunk import FOOTER_SIZE, HEADER_SIZE
from tests.conftest import MakeConfig
from tests.support.faults import (
    chunk_path,
    end_offset,
    file_offset,
    flip_byte,
    index_entry,
    index_files,
    log_chunks,
    read_at,
    simulate_machine_crash,
    value_offset,
    write_at,
    zero_from,
    zero_index_entry,
)
from tests.support.sent import (
    TOPIC,
    OpenStore,
    Sent,
    append,
    assert_queue_holds,
    payload,
    read_queue,
    reopen,
    shape,
)

# -- the message log's tail ----------------------------------------------------------


def test_truncated_tail(open_store: OpenStore) -> None:
    """The active chunk file cut short in the middle of its last record."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    kept = append(store, 0, "a") + append(store, 0, "b", 3) + append(store, 0, "c", 2)
    torn = append(store, 0, "d")[0]
    store.close()
    config = store.config
    path = chunk_path(config, torn.position)
    cut = value_offset(config, torn) + len(torn.value) // 2
    os.truncate(path, cut)

    store = open_store(config)
    assert store.recovery.tail_records_scanned == len(kept)
    assert 0 < store.recovery.tail_bytes_discarded <= cut - file_offset(config, torn.position)
    assert path.stat().st_size == HEADER_SIZE + config.chunk_capacity_bytes + FOOTER_SIZE
    assert_queue_holds(store, 0, kept)
    more = append(store, 0, "e", 2)
    assert (more[0].offset, more[0].position) == (len(kept), torn.position)
    assert_queue_holds(store, 0, kept + more)
    store = reopen(open_store, store)
    assert store.recovery.tail_bytes_discarded == 0
    assert_queue_holds(store, 0, kept + more)


def test_active_chunk_left_short_by_interrupted_cut(open_store: OpenStore) -> None:
    """The active chunk file ends exactly after its last complete append, without
    a footer: the state a crash between the two ``ftruncate`` calls of
    ``MessageLog._cut`` (tail repair, undo of a failed append) leaves behind."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    kept = append(store, 0, "a", 3) + append(store, 0, "b", 4)
    store.close()
    config = store.config
    path = chunk_path(config, kept[-1].position)
    os.truncate(path, end_offset(config, kept[-1]))

    store = open_store(config)
    assert store.recovery.tail_bytes_discarded == 0
    assert path.stat().st_size == HEADER_SIZE + config.chunk_capacity_bytes + FOOTER_SIZE
    assert_queue_holds(store, 0, kept)
    more = append(store, 0, "c")
    assert more[0].offset == len(kept)
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, kept + more)


def test_zeroed_tail(open_store: OpenStore) -> None:
    """The active chunk keeps its size but reads zeros from the middle of its
    last record on (the pages holding the rest never reached the disk)."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    kept = append(store, 0, "a", 2) + append(store, 0, "b")
    torn = append(store, 0, "c")[0]
    store.close()
    config = store.config
    path = chunk_path(config, torn.position)
    cut = value_offset(config, torn) + len(torn.value) // 2
    zero_from(path, cut)

    store = open_store(config)
    assert store.recovery.tail_records_scanned == len(kept)
    assert store.recovery.tail_bytes_discarded == cut - file_offset(config, torn.position)
    assert_queue_holds(store, 0, kept)
    more = append(store, 0, "d", 3)
    assert (more[0].offset, more[0].position) == (len(kept), torn.position)
    store = reopen(open_store, store)
    assert store.recovery.tail_bytes_discarded == 0
    assert_queue_holds(store, 0, kept + more)


def test_torn_record(open_store: OpenStore) -> None:
    """Bytes in the middle of the last record overwritten: its checksum fails."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    kept = append(store, 0, "a", 3) + append(store, 0, "b")
    torn = append(store, 0, "c")[0]
    store.close()
    config = store.config
    path = chunk_path(config, torn.position)
    start = file_offset(config, torn.position)
    record = read_at(path, start, torn.frame_size)
    middle = value_offset(config, torn) + len(torn.value) // 2 - 4
    write_at(path, middle, bytes(b ^ 0x5A for b in read_at(path, middle, 8)))

    store = open_store(config)
    assert store.recovery.tail_records_scanned == len(kept)
    assert store.recovery.tail_bytes_discarded > 0
    # Every byte of the torn frame up to its last non-zero one was discarded.
    assert store.recovery.tail_bytes_discarded == len(record.rstrip(b"\x00"))
    assert read_at(path, start, torn.frame_size) == bytes(torn.frame_size)
    assert_queue_holds(store, 0, kept)
    more = append(store, 0, "d", 2)
    assert (more[0].offset, more[0].position) == (len(kept), torn.position)
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, kept + more)


def test_torn_batch_is_discarded_whole(open_store: OpenStore) -> None:
    """Damage in the last record of a batch discards the whole batch, although
    its first records are intact: an append is all-or-nothing across a crash."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    kept = append(store, 0, "a") + append(store, 0, "b", 2)
    batch = append(store, 0, "c", 4)
    store.close()
    config = store.config
    path = chunk_path(config, batch[-1].position)
    start = file_offset(config, batch[0].position)
    frames = read_at(path, start, end_offset(config, batch[-1]) - start)
    flip_byte(path, value_offset(config, batch[-1]) + 3)

    store = open_store(config)
    assert store.recovery.tail_records_scanned == len(kept) + len(batch) - 1
    assert store.recovery.tail_bytes_discarded == len(frames.rstrip(b"\x00"))
    assert read_at(path, start, len(frames)) == bytes(len(frames))
    assert_queue_holds(store, 0, kept)
    more = append(store, 0, "d", 2)
    assert (more[0].offset, more[0].position) == (len(kept), batch[0].position)
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, kept + more)


def test_torn_record_at_start_of_new_chunk(open_store: OpenStore) -> None:
    """The only append in a freshly rolled active chunk is torn: offsets continue
    after the records of the sealed chunk."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    kept: list[Sent] = []
    while len(log_chunks(store.config.data_dir)) == 1:
        kept += append(store, 0, f"a{len(kept)}", 3, size=1000)
    # The append that rolled is the only one in chunk 1.
    torn = [s for s in kept if s.position >= store.config.chunk_capacity_bytes]
    kept = kept[: len(kept) - len(torn)]
    assert len(torn) == 3
    assert torn[0].position == store.config.chunk_capacity_bytes
    store.close()
    config = store.config
    flip_byte(chunk_path(config, torn[-1].position), value_offset(config, torn[-1]))

    store = open_store(config)
    assert store.recovery.tail_records_scanned == 2
    assert store.recovery.tail_bytes_discarded > 0
    assert_queue_holds(store, 0, kept)
    more = append(store, 0, "b")
    assert (more[0].offset, more[0].position) == (len(kept), config.chunk_capacity_bytes)
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, kept + more)


def test_garbage_after_tail(open_store: OpenStore) -> None:
    """Random non-zero bytes right after the last record of the active chunk."""
    store = open_store()
    store.create_topic(TOPIC, 2)
    kept0 = append(store, 0, "a", 3) + append(store, 0, "b")
    kept1 = append(store, 1, "c", 2)
    store.close()
    config = store.config
    last = kept1[-1]
    garbage = payload("garbage", 0, 300)
    path = chunk_path(config, last.position)
    write_at(path, end_offset(config, last), garbage)

    store = open_store(config)
    # The checkpoint of the clean close vouches for the kept records: the tail
    # scan starts after them and meets the garbage at once.
    assert store.recovery.tail_records_scanned == 0
    assert store.recovery.tail_bytes_discarded == len(garbage)
    assert read_at(path, end_offset(config, last), len(garbage)) == bytes(len(garbage))
    assert_queue_holds(store, 0, kept0)
    assert_queue_holds(store, 1, kept1)
    more0 = append(store, 0, "d", 2)
    more1 = append(store, 1, "e")
    assert more0[0].position == last.position + last.frame_size
    assert_queue_holds(store, 0, kept0 + more0)
    assert_queue_holds(store, 1, kept1 + more1)
    store = reopen(open_store, store)
    assert store.recovery.tail_bytes_discarded == 0
    assert_queue_holds(store, 0, kept0 + more0)
    assert_queue_holds(store, 1, kept1 + more1)
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, kept0 + more0)
    assert_queue_holds(store, 1, kept1 + more1)


def test_garbage_after_zero_gap(open_store: OpenStore) -> None:
    """Non-zero bytes further on, after a run of zeros that looks like the end."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    kept = append(store, 0, "a", 5)
    store.close()
    config = store.config
    path = chunk_path(config, kept[-1].position)
    gap_start = end_offset(config, kept[-1])
    write_at(path, gap_start + 1000, payload("garbage", 1, 200))

    store = open_store(config)
    assert store.recovery.tail_bytes_discarded == 1200
    assert read_at(path, gap_start, 1200) == bytes(1200)
    assert_queue_holds(store, 0, kept)
    more = append(store, 0, "b", 2)
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, kept + more)


@pytest.fixture(params=["holes reported", "no hole reporting"])
def hole_reporting(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Run a test as is, then as on a file system that cannot report holes
    (``SEEK_DATA`` unavailable: recovery reads whole chunks, as it must then)."""
    if request.param == "no hole reporting":
        monkeypatch.delattr(os, "SEEK_DATA", raising=False)
        return False
    return True


def test_garbage_far_after_tail_past_unwritten_space(
    open_store: OpenStore, hole_reporting: bool
) -> None:
    """Non-zero bytes in the middle and at the very end of the active chunk's data,
    with unwritten (sparse) space between: recovery reads only the written parts
    of the chunk, from the end back, and still finds and zeroes all of them."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    kept = append(store, 0, "a", 3)
    store.close()
    config = store.config
    path = chunk_path(config, kept[-1].position)
    tail = end_offset(config, kept[-1])
    data_end = HEADER_SIZE + config.chunk_capacity_bytes
    for i, at in enumerate([tail + 20_000, data_end - 200]):
        write_at(path, at, payload("garbage", i, 200))

    store = open_store(config)
    assert store.recovery.tail_bytes_discarded == data_end - tail
    rest = data_end + FOOTER_SIZE - tail  # with the footer's room
    assert read_at(path, tail, rest) == bytes(rest)
    assert path.stat().st_size == data_end + FOOTER_SIZE
    assert_queue_holds(store, 0, kept)
    more = append(store, 0, "b", 2)
    assert more[0].position == kept[-1].position + kept[-1].frame_size
    store = reopen(open_store, store)
    assert store.recovery.tail_bytes_discarded == 0
    assert_queue_holds(store, 0, kept + more)


def test_failed_appends_leave_nothing_after_the_log_end(
    open_store: OpenStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Disk full. An append whose log write is cut short leaves bytes after the data
    end; the next append overwrites only their start; a later append whose index
    write fails is undone. The undo zeroes everything written after the new end
    (known from the writes, not found by scanning the chunk), the leftovers of the
    first failure included, so a restart finds nothing to discard."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    kept = append(store, 0, "a", 2)
    config = store.config
    path = chunk_path(config, kept[-1].position)
    log_fd = store._state.log.active.fd
    pwrite = os.pwrite
    log_writes: list[int] = []

    def short_then_full(fd: int, data: bytes | bytearray | memoryview, offset: int) -> int:
        if fd != log_fd:
            return pwrite(fd, data, offset)
        log_writes.append(offset)
        if len(log_writes) == 1:
            with memoryview(data) as view:
                return pwrite(fd, view[: len(view) // 2], offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", short_then_full)
    with pytest.raises(DiskFullError):
        append(store, 0, "big", 10, size=1000)
    monkeypatch.undo()
    assert len(log_writes) == 2
    leftover = read_at(path, end_offset(config, kept[-1]), 4000)
    assert leftover.count(0) < len(leftover) // 4, "the short write left bytes after the end"

    kept += append(store, 0, "b")  # overwrites the start of the leftovers

    def index_full(self: QueueIndex, offset: int, entries: bytes | bytearray | memoryview) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(QueueIndex, "write", index_full)
    with pytest.raises(DiskFullError):
        append(store, 0, "c", 3)
    monkeypatch.undo()
    tail = end_offset(config, kept[-1])
    data_end = HEADER_SIZE + config.chunk_capacity_bytes
    assert read_at(path, tail, data_end - tail) == bytes(data_end - tail)
    assert_queue_holds(store, 0, kept)
    more = append(store, 0, "d", 2)
    assert more[0].position == kept[-1].position + kept[-1].frame_size
    store.abandon()

    store = open_store(config)
    assert store.recovery.tail_bytes_discarded == 0
    assert_queue_holds(store, 0, kept + more)


# -- sealed chunks -----------------------------------------------------------------


def test_flipped_byte_in_completed_chunk(open_store: OpenStore) -> None:
    """A flipped value byte in a sealed chunk: the store opens (sealed chunks are
    not scanned), the damaged message fails its checksum on read, naming the file
    and the record's byte position; every other message reads fine."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    sent: list[Sent] = []
    for round_ in range(10):
        sent += append(store, 0, f"r{round_}", 10, size=1000)
    store.close()
    config = store.config
    chunks = log_chunks(config.data_dir)
    assert len(chunks) >= 2
    victim = sent[20]
    path = chunk_path(config, victim.position)
    assert path == chunks[0]
    assert path.stat().st_size != HEADER_SIZE + config.chunk_capacity_bytes + FOOTER_SIZE  # sealed
    flip_byte(path, value_offset(config, victim) + 500)

    store = open_store(config)
    assert store.recovery.tail_bytes_discarded == 0
    assert store.queue_info(TOPIC, 0).end == len(sent)
    with pytest.raises(CorruptionError) as caught:
        store.read(TOPIC, 0, victim.offset, max_messages=1)
    record_at = file_offset(config, victim.position)
    assert (caught.value.path, caught.value.position) == (str(path), record_at)
    assert str(path) in str(caught.value)
    assert f"byte {record_at}" in str(caught.value)
    with pytest.raises(CorruptionError):
        store.reads.read_at_position(victim.position)
    before = store.read(TOPIC, 0, 0, max_messages=victim.offset).messages
    assert [shape(m) for m in before] == [s.shape() for s in sent[: victim.offset]]
    after = read_queue(store, 0, victim.offset + 1)
    assert [shape(m) for m in after] == [s.shape() for s in sent[victim.offset + 1 :]]
    assert shape(store.reads.read_at_position(sent[21].position)) == sent[21].shape()


def test_sealed_chunk_footer_size_mismatch_is_reported(open_store: OpenStore) -> None:
    """A sealed chunk cut short (its footer lost) is quarantined, naming the file,
    rather than silently treated as data; the other chunks are served."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    sent = []
    for round_ in range(8):
        sent += append(store, 0, f"r{round_}", 10, size=1000)
    store.close()
    sealed = log_chunks(store.config.data_dir)[0]
    os.truncate(sealed, sealed.stat().st_size - FOOTER_SIZE // 2)
    store = open_store(store.config)
    [quarantined] = store.damage().quarantined_chunks
    assert quarantined.path == sealed
    later = [s for s in sent if s.position >= quarantined.end_position]
    assert later
    assert [shape(m) for m in read_queue(store, 0, later[0].offset)] == [s.shape() for s in later]
    with pytest.raises(CorruptionError) as caught:
        store.reads.read_records(TOPIC, 0, 0)
    assert caught.value.path == str(sealed)
    assert f"{TOPIC}/0 offset 0" in str(caught.value)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_failed_open_releases_file_descriptors(open_store: OpenStore) -> None:
    """An open that fails on a damaged chunk closes every file it had opened."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    for round_ in range(16):
        append(store, 0, f"r{round_}", 10, size=1000)
    store.close()
    chunks = log_chunks(store.config.data_dir)
    assert len(chunks) >= 3
    chunks[1].unlink()  # a chunk missing in the middle: the open fails
    fds_before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(CorruptionError):
        Store(store.config, background=False)
    assert sorted(os.listdir("/proc/self/fd")) == fds_before


# -- log and index out of step -------------------------------------------------------


def test_crash_between_log_append_and_index_append(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """Sync mode: the log records are durable, their index entries (written after
    the last checkpoint and never fsynced) are lost in a machine crash."""
    store = open_store(make_config(flush_mode=FlushMode.SYNC))
    store.create_topic(TOPIC, 2)
    sent: dict[int, list[Sent]] = {0: append(store, 0, "a", 5), 1: append(store, 1, "b", 3)}
    store.flush()  # checkpoint: the index entries so far are durable
    checkpointed = {q: len(sent[q]) for q in (0, 1)}
    for round_ in range(6):
        sent[round_ % 2] += append(store, round_ % 2, f"c{round_}", 1 + round_)
    sent[0] += append(store, 0, "d", 70)  # crosses into a second index chunk
    config = store.config
    simulate_machine_crash(store)
    lost = [s for q in (0, 1) for s in sent[q][checkpointed[q] :]]
    assert all(index_entry(config, s.queue_id, s.offset) == bytes(ENTRY_SIZE) for s in lost)
    kept = [s for q in (0, 1) for s in sent[q][: checkpointed[q]]]
    assert all(index_entry(config, s.queue_id, s.offset) == s.entry for s in kept)

    store = open_store(config)
    assert store.recovery.index_entries_rebuilt == len(lost)
    assert store.recovery.tail_bytes_discarded == 0
    for queue_id in (0, 1):
        assert_queue_holds(store, queue_id, sent[queue_id])
        for s in sent[queue_id]:
            assert index_entry(config, queue_id, s.offset) == s.entry
    more = append(store, 1, "e", 2)
    assert more[0].offset == len(sent[1])
    store = reopen(open_store, store)
    assert store.recovery.index_entries_rebuilt == 0
    assert_queue_holds(store, 0, sent[0])
    assert_queue_holds(store, 1, sent[1] + more)


def test_missing_index_entries_behind_older_checkpoint(open_store: OpenStore) -> None:
    """Byte surgery version: the index entries of the last appends are zeroed and
    the checkpoint put back to before them, as if the crash came between the log
    write and the index write of those appends."""
    store = open_store()
    store.create_topic(TOPIC, 2)
    sent0 = append(store, 0, "a", 4)
    sent1 = append(store, 1, "b", 2)
    old = append(store, 0, "c", 3) + append(store, 1, "d") + append(store, 0, "e", 2)
    sent0 += [s for s in old if s.queue_id == 0]
    sent1 += [s for s in old if s.queue_id == 1]
    store.close()
    config = store.config
    for s in old:
        zero_index_entry(config, s.queue_id, s.offset)
    checkpoint = config.data_dir / "checkpoint.json"
    checkpoint.write_text(json.dumps({"index_position": old[0].position}))

    store = open_store(config)
    assert store.recovery.index_entries_rebuilt == len(old)
    assert_queue_holds(store, 0, sent0)
    assert_queue_holds(store, 1, sent1)
    for s in sent0 + sent1:
        assert index_entry(config, s.queue_id, s.offset) == s.entry
    more = append(store, 0, "f")
    assert more[0].offset == len(sent0)
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, sent0 + more)


def test_index_ahead_of_log(open_store: OpenStore) -> None:
    """Index entries (fsynced, behind the checkpoint) point past the end of a log
    whose tail was lost: they are dropped, and offsets are reused only where no
    record survived."""
    store = open_store()
    store.create_topic(TOPIC, 2)
    sent: dict[int, list[Sent]] = {0: [], 1: []}
    for round_ in range(7):
        sent[0] += append(store, 0, f"a{round_}", 10)
        sent[1] += append(store, 1, f"b{round_}", 3)
    store.close()
    config = store.config
    first_lost = sent[0][40]  # queue 0 offsets 40..69 span index chunks 0 and 1
    assert len(index_files(config.data_dir, TOPIC, 0)) == 2
    path = chunk_path(config, first_lost.position)
    assert path == log_chunks(config.data_dir)[-1]
    zero_from(path, file_offset(config, first_lost.position))
    survivors = {0: sent[0][:40], 1: sent[1][:12]}
    assert all(index_entry(config, 0, s.offset) == s.entry for s in sent[0][40:])

    store = open_store(config)
    assert store.recovery.tail_bytes_discarded == 0
    for queue_id in (0, 1):
        assert store.queue_info(TOPIC, queue_id).end == len(survivors[queue_id])
        assert_queue_holds(store, queue_id, survivors[queue_id])
    for s in sent[0][40:]:
        assert index_entry(config, 0, s.offset) == bytes(ENTRY_SIZE)
    result = store.read(TOPIC, 0, 41)
    assert (result.status, result.next_offset) == (ReadStatus.OFFSET_TOO_BIG, 40)
    more0 = append(store, 0, "c", 5)
    more1 = append(store, 1, "d", 2)
    assert (more0[0].offset, more0[0].position) == (40, first_lost.position)
    assert more1[0].offset == 12
    assert_queue_holds(store, 0, survivors[0] + more0)
    assert_queue_holds(store, 1, survivors[1] + more1)
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, survivors[0] + more0)
    assert_queue_holds(store, 1, survivors[1] + more1)


def test_stale_index_entries_far_past_the_end(
    open_store: OpenStore, make_config: MakeConfig, hole_reporting: bool
) -> None:
    """Non-zero entries far past a queue's end, after unwritten (sparse) parts of
    its index chunk (pages of a lost append's entries that reached the disk, or
    garbage): recovery reads only the written parts of the chunk, from the end
    back, and zeroes them, or a later recovery, once the checkpoint had passed
    the positions they name, would take them for entries."""
    store = open_store(make_config(index_entries_per_chunk=4096))
    store.create_topic(TOPIC, 2)
    sent0 = append(store, 0, "a", 5)
    sent1 = append(store, 1, "b", 2)
    store.flush()
    sent0 += append(store, 0, "c", 3)
    config = store.config
    store.abandon()
    last = sent0[-1].position
    stale = {1000: last + 10_000, 4095: last + 20_000}
    for slot, position in stale.items():
        write_at(
            index_files(config.data_dir, TOPIC, 0)[0],
            HEADER_SIZE + slot * ENTRY_SIZE,
            ENTRY.pack(position + 1, 100, 0, 0),
        )

    store = open_store(config)
    assert store.recovery.index_entries_rebuilt == 3
    for slot in stale:
        assert index_entry(config, 0, slot) == bytes(ENTRY_SIZE)
    assert_queue_holds(store, 0, sent0)
    assert_queue_holds(store, 1, sent1)
    more = append(store, 0, "d", 2)
    assert more[0].offset == len(sent0)
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, sent0 + more)
    assert_queue_holds(store, 1, sent1)
