"""Damaged bytes at rest in the queue index (issue 15): byte surgery on index
entries, then a reopen or a read, asserting that no acknowledged message is
lost, misserved or skipped, and that no offset is reused.

The index is derived data: a damaged entry is detected (its checksum, or a
check against the record it names) and rebuilt from the log, never trusted,
and never a reason to cut the log (``index_repair.py``). Style and helpers as
in ``test_recovery.py``.
"""

from __future__ import annotations

import logging

import pytest

from equeue_broker.storage import FlushMode, MessageBatch, ReadStatus, Store
from equeue_broker.storage.index.queue_index import ENTRY, ENTRY_SIZE
from equeue_broker.storage.log.chunk import HEADER_SIZE
from tests.conftest import MakeConfig
from tests.support.faults import (
    flip_index_byte,
    index_entry,
    index_files,
    simulate_machine_crash,
    write_at,
    zero_index_entry,
)
from tests.support.sent import (
    TOPIC,
    OpenStore,
    Sent,
    append,
    assert_queue_holds,
    reopen,
    shape,
)

_POSITION_HIGH_BYTE = 7
"""Flipping it makes an entry name a position far past any log."""


def test_flipped_index_entry_in_recovery_window(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """Sync mode, machine crash: the last entry written before the checkpoint
    has a flipped position byte, so it looks like an unsynced entry. Recovery
    used to drop it, then meet the queue's next record in the log with offset
    50, "expected 49", and cut the log there: 101 acknowledged messages lost,
    those of the other queue with them. Now the entry is rebuilt from the log
    and nothing is cut."""
    store = open_store(make_config(flush_mode=FlushMode.SYNC))
    store.create_topic(TOPIC, 2)
    store.create_topic("other", 1)
    sent: dict[int, list[Sent]] = {0: append(store, 0, "a", 50), 1: append(store, 1, "b", 5)}
    store.flush()  # the checkpoint: entries so far are durable
    others = []
    for round_ in range(5):
        sent[0] += append(store, 0, f"c{round_}", 10)
        sent[1] += append(store, 1, f"d{round_}", 10)
        values = [f"o{round_}-{i}".encode() for i in range(10)]
        store.append("other", 0, MessageBatch(values))
        others += values
    config = store.config
    simulate_machine_crash(store)
    flip_index_byte(config, 0, 49, _POSITION_HIGH_BYTE)

    store = open_store(config)
    assert store.recovery.tail_bytes_discarded == 0
    for queue_id in (0, 1):
        assert_queue_holds(store, queue_id, sent[queue_id])
    assert [m.value for m in store.read("other", 0, 0).messages] == others
    assert index_entry(config, 0, 49) == sent[0][49].entry
    more = append(store, 0, "e", 2)
    assert more[0].offset == len(sent[0])
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, sent[0] + more)
    assert_queue_holds(store, 1, sent[1])


def test_flipped_position_in_last_index_entry(open_store: OpenStore) -> None:
    """A clean shutdown, then a flipped position byte in a queue's last entry:
    recovery used to take it for an unsynced entry, drop it (and with it an
    acknowledged message), and the next append reused its offset. Now the end
    comes from the log: the entry is rebuilt, the next append gets a new offset."""
    store = open_store()
    store.create_topic(TOPIC, 2)
    sent = append(store, 0, "a", 6) + append(store, 0, "b", 4)
    other = append(store, 1, "c", 3)
    store.close()
    config = store.config
    flip_index_byte(config, 0, 9, _POSITION_HIGH_BYTE)

    store = open_store(config)
    assert store.queue_info(TOPIC, 0).end == len(sent)
    assert_queue_holds(store, 0, sent)
    assert_queue_holds(store, 1, other)
    assert index_entry(config, 0, 9) == sent[9].entry
    more = append(store, 0, "d")
    assert (more[0].offset, more[0].position) == (10, other[-1].position + other[-1].frame_size)
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, sent + more)


def test_zeroed_last_index_entry(open_store: OpenStore) -> None:
    """A clean shutdown, then a queue's last entry zeroed (not flipped): it
    looks like an entry never written, so recovery used to take the queue's
    end from the index, one short, and the next append reused the offset of
    an acknowledged message. The checkpoint now records every queue's end,
    so the missing entry is found in the log and rebuilt. (A queue whose
    entries are all gone is not searched: its saved end may belong to a
    deleted incarnation of the topic.)"""
    store = open_store()
    store.create_topic(TOPIC, 2)
    sent = append(store, 0, "a", 6) + append(store, 0, "b", 4)
    other = append(store, 1, "c", 3)
    store.close()
    config = store.config
    zero_index_entry(config, 0, 9)

    store = open_store(config)
    assert store.queue_info(TOPIC, 0).end == len(sent)
    assert_queue_holds(store, 0, sent)
    assert index_entry(config, 0, 9) == sent[9].entry
    more = append(store, 0, "d")
    assert more[0].offset == 10
    store = reopen(open_store, store)
    assert_queue_holds(store, 0, sent + more)
    assert_queue_holds(store, 1, other)


# -- damaged entries met by reads -----------------------------------------------------


def _pulled(store: Store, queue_id: int, tags: list[str] | None = None) -> bytes:
    """Every record of the queue as a pull serves them (``read_records``)."""
    out, offset = b"", 0
    for _ in range(1000):
        result = store.reads.read_records(TOPIC, queue_id, offset, max_messages=7, tags=tags)
        assert result.status is ReadStatus.OK
        if result.next_offset == offset:
            return out
        out, offset = out + result.records, result.next_offset
    raise AssertionError("pull loop did not reach the end")


def _three_batches(store: Store) -> tuple[list[Sent], bytes]:
    store.create_topic(TOPIC, 2)
    sent = []
    for round_ in range(3):
        sent += append(store, 0, f"a{round_}", 10)
        append(store, 1, f"b{round_}", 2)  # so queue 0's batches are not back to back
    return sent, b"".join(store.reads.record_at(s.position) for s in sent)


def test_flipped_position_in_middle_index_entry(
    open_store: OpenStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A flipped position byte in an entry mid-queue: the record it names used
    to be unreadable, the error 14,778 characters long with other records'
    bytes in it (RESOURCE_EXHAUSTED: past gRPC's metadata limit). Now the
    entry fails its checksum, is rebuilt from the log (and logged), and both
    read paths serve every message."""
    store = open_store()
    sent, records = _three_batches(store)
    store.close()
    config = store.config
    flip_index_byte(config, 0, 15, 0)

    store = open_store(config)
    with caplog.at_level(logging.WARNING):
        assert _pulled(store, 0) == records
    assert "offset 15 was damaged; rebuilt" in caplog.text
    assert index_entry(config, 0, 15) == sent[15].entry
    flip_index_byte(config, 0, 16, 1)
    assert_queue_holds(store, 0, sent)  # the decoding read repairs too
    assert index_entry(config, 0, 16) == sent[16].entry


def test_wrong_position_in_unchecked_index_entry(open_store: OpenStore) -> None:
    """An entry from before entry checksums (all-zero trailer) naming the wrong
    position: the read's check of the record it lands on catches it, short of
    copying anything, and the entry is rebuilt."""
    store = open_store()
    sent, records = _three_batches(store)
    store.close()
    config = store.config
    for offset, shift in ((12, 40), (20, 0), (21, -3)):  # 20: a correct, unchecked entry
        position_plus_one, size, tag_hash, store_ms = ENTRY.unpack(sent[offset].entry)
        unchecked = ENTRY.pack(position_plus_one + shift, size, tag_hash, store_ms)
        number, slot = divmod(offset, config.index_entries_per_chunk)
        path = index_files(config.data_dir, TOPIC, 0)[number]
        write_at(path, HEADER_SIZE + slot * ENTRY_SIZE, unchecked)

    store = open_store(config)
    assert _pulled(store, 0) == records
    assert index_entry(config, 0, 12) == sent[12].entry
    assert index_entry(config, 0, 20)[24:] == bytes(8)  # intact: left as it was
    assert_queue_holds(store, 0, sent)


def test_flipped_tag_hash_in_unchecked_index_entry(open_store: OpenStore) -> None:
    """An entry from before entry checksums whose tag hash is wrong: nothing
    vouches for the hash, so a tag-filtered read used to skip that message
    silently. Now an unchecked entry is skipped only by its record's own tag."""
    store = open_store()
    sent, _ = _three_batches(store)
    even = [s for s in sent if s.tag == "even"]
    store.close()
    config = store.config
    target = even[3]
    position_plus_one, size, tag_hash, store_ms = ENTRY.unpack(target.entry)
    unchecked = ENTRY.pack(position_plus_one, size, tag_hash ^ 0x100, store_ms)
    number, slot = divmod(target.offset, config.index_entries_per_chunk)
    write_at(
        index_files(config.data_dir, TOPIC, 0)[number], HEADER_SIZE + slot * ENTRY_SIZE, unchecked
    )

    store = open_store(config)
    want = b"".join(store.reads.record_at(s.position) for s in even)
    assert _pulled(store, 0, tags=["even"]) == want  # the pull path (read_records)
    result = store.read(TOPIC, 0, 0, max_messages=1000, tags=["even"])
    assert [shape(m) for m in result.messages] == [s.shape() for s in even]


def test_flipped_tag_hash_in_index_entry(open_store: OpenStore) -> None:
    """A flipped tag-hash byte: a tag-filtered read skips records by hash
    without reading them, so it used to miss that message silently. Now the
    entry fails its checksum and is rebuilt before the filter trusts it."""
    store = open_store()
    sent, _ = _three_batches(store)
    even = [s for s in sent if s.tag == "even"]
    want = b"".join(store.reads.record_at(s.position) for s in even)
    store.close()
    config = store.config
    flip_index_byte(config, 0, 14, 12)
    flip_index_byte(config, 0, 24, 13)

    store = open_store(config)
    assert _pulled(store, 0, tags=["even"]) == want
    assert index_entry(config, 0, 14) == sent[14].entry
    flip_index_byte(config, 0, 14, 14)
    result = store.read(TOPIC, 0, 0, max_messages=1000, tags=["even"])
    assert [shape(m) for m in result.messages] == [s.shape() for s in even]
    assert index_entry(config, 0, 24) == sent[24].entry


def test_flipped_size_in_index_entry_for_lookups(open_store: OpenStore) -> None:
    """Lookups by position or offset (``record_at``, ``read_at_position``,
    ``position_of``: message ids, admin) take a record's size and position
    from its entry. A flipped size byte used to make ``record_at`` copy the
    wrong bytes; now the entry is rebuilt first."""
    store = open_store()
    sent, _ = _three_batches(store)
    want = [store.reads.record_at(s.position) for s in sent[4:7]]
    store.close()
    config = store.config
    flip_index_byte(config, 0, 5, 8)
    flip_index_byte(config, 0, 6, 3)

    store = open_store(config)
    assert [store.reads.record_at(s.position) for s in sent[4:7]] == want
    assert index_entry(config, 0, 5) == sent[5].entry
    flip_index_byte(config, 0, 5, 9)
    assert shape(store.reads.read_at_position(sent[5].position)) == sent[5].shape()
    assert store.reads.position_of(TOPIC, 0, 6) == sent[6].position
    assert index_entry(config, 0, 6) == sent[6].entry


def test_flipped_store_time_in_index_entry_for_timestamp_lookups(open_store: OpenStore) -> None:
    """``offset_for_timestamp`` (a Spark ``startingTimestamp``, ``groups reset
    --to-time``) binary-searches the entries' store times. A flipped time byte
    in the entry it probes first used to send it the wrong way: a time after
    every record answered offset 0..15 instead of the end. Now every probed
    entry is checked and a damaged one rebuilt from the log first."""
    store = open_store()
    sent, _ = _three_batches(store)
    after_all = ENTRY.unpack(index_entry(store.config, 0, len(sent) - 1))[3] + 1
    assert store.reads.offset_for_timestamp(TOPIC, 0, after_all) == len(sent)
    store.close()
    config = store.config
    middle = len(sent) // 2  # the first entry the search probes
    flip_index_byte(config, 0, middle, 22)  # a high byte of the store time: far in the future

    store = open_store(config)
    assert store.reads.offset_for_timestamp(TOPIC, 0, after_all) == len(sent)
    assert index_entry(config, 0, middle) == sent[middle].entry
