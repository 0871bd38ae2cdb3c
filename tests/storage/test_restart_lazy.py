"""Restart with queue indexes opened at first use (issue 31, item 5).

A queue the checkpoint vouches for (recovery.py) is not opened at restart: its
end and earliest offset come from the checkpoint, and its index files are
opened, and its deferred recovery run, when it is first read or written. The
tail scan of the log starts at the checkpoint. These tests assert what a
client sees (reads, appends, offsets) across such restarts, including after a
kill and with damage the checkpoint cannot vouch for; never timing.
"""

from __future__ import annotations

from equeue_broker.storage import MessageBatch, Store
from equeue_broker.storage.recovery import load_checkpoint
from equeue_broker.storage.txn.txn_recovery import TxnScan
from tests.conftest import MakeConfig
from tests.support.faults import (
    chunk_path,
    end_offset,
    flip_index_byte,
    read_at,
    write_at,
)
from tests.support.sent import TOPIC, OpenStore, Sent, append, assert_queue_holds, reopen

_POSITION_HIGH_BYTE = 7


def deferred(store: Store, queue_id: int) -> bool:
    return store._state.queues[(TOPIC, queue_id)].index.deferred


def test_untouched_queues_open_at_first_use_and_serve(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic(TOPIC, 3)
    sent = {q: append(store, q, f"q{q}", 70) for q in range(3)}  # past one index chunk (64)
    store = reopen(open_store, store)
    assert all(deferred(store, q) for q in range(3))
    for q in range(3):  # the ends come from the checkpoint, no file opened
        assert store.queue_info(TOPIC, q).end == 70
    assert all(deferred(store, q) for q in range(3))
    assert_queue_holds(store, 0, sent[0])  # a read opens it
    assert not deferred(store, 0)
    sent[1] += append(store, 1, "more", 5)  # so does an append: at the next offset
    assert sent[1][-1].offset == 74
    assert deferred(store, 2)
    store = reopen(open_store, store)
    for q in range(3):
        assert_queue_holds(store, q, sent[q])


def test_kill_after_the_checkpoint_rebuilds_what_was_written_since(
    open_store: OpenStore,
) -> None:
    """Records after the checkpoint are indexed again from the log; the queues
    they touch are opened at restart, the others stay deferred."""
    store = open_store()
    store.create_topic(TOPIC, 3)
    sent = {q: append(store, q, f"a{q}", 10) for q in range(3)}
    store.flush()  # the checkpoint
    sent[1] += append(store, 1, "b", 7)
    store.abandon()  # kill -9: the index entries of "b" were never fsynced
    store = open_store(store.config)
    assert store.recovery.index_entries_rebuilt == 7
    assert not deferred(store, 1)
    assert deferred(store, 0) and deferred(store, 2)
    for q in range(3):
        assert_queue_holds(store, q, sent[q])
    sent[2] += append(store, 2, "c", 3)
    store = reopen(open_store, store)
    for q in range(3):
        assert_queue_holds(store, q, sent[q])


def test_a_torn_append_after_the_checkpoint_is_cut(open_store: OpenStore) -> None:
    """A kill in the middle of an append after the checkpoint: the scan from the
    checkpoint finds the torn bytes and cuts them; nothing before is lost and the
    next append takes the next offset at the cut."""
    store = open_store()
    store.create_topic(TOPIC, 2)
    sent = {0: append(store, 0, "a", 5), 1: append(store, 1, "b", 5)}
    store.flush()
    sent[0] += append(store, 0, "c", 3)
    config = store.config
    last = sent[0][-1]
    store.abandon()
    path = chunk_path(config, last.position)
    torn = read_at(path, end_offset(config, last) - last.frame_size, last.frame_size // 2)
    write_at(path, end_offset(config, last), torn)  # half a record, no batch end
    store = open_store(config)
    assert store.recovery.tail_bytes_discarded == len(torn)
    assert read_at(path, end_offset(config, last), len(torn)) == bytes(len(torn))
    for q in range(2):
        assert_queue_holds(store, q, sent[q])
    more = append(store, 0, "d")
    assert (more[0].offset, more[0].position) == (8, last.position + last.frame_size)


def test_a_damaged_last_entry_is_found_when_the_queue_is_first_used(
    open_store: OpenStore,
) -> None:
    """The checkpoint vouches for a queue's end, not for the bytes of its index:
    a last entry damaged at rest is checked against the log when the queue is
    first used, rebuilt from it, and no offset is used twice."""
    store = open_store()
    store.create_topic(TOPIC, 2)
    sent = {0: append(store, 0, "a", 9), 1: append(store, 1, "b", 4)}
    store.close()
    flip_index_byte(store.config, 0, 8, _POSITION_HIGH_BYTE)
    store = open_store(store.config)
    assert deferred(store, 0)
    more = append(store, 0, "c", 2)  # opens the index: the entry is rebuilt first
    assert [m.offset for m in more] == [9, 10]
    sent[0] += more
    for q in range(2):
        assert_queue_holds(store, q, sent[q])
    store = reopen(open_store, store)
    for q in range(2):
        assert_queue_holds(store, q, sent[q])


def test_a_damaged_entry_after_the_checkpoint_is_rebuilt_from_the_log(
    open_store: OpenStore,
) -> None:
    """An entry written after the checkpoint is not vouched for: the restart
    derives it again from the log, whatever its bytes."""
    store = open_store()
    store.create_topic(TOPIC, 1)
    sent: list[Sent] = append(store, 0, "a", 6)
    store.flush()
    sent += append(store, 0, "b", 6)
    config = store.config
    store.abandon()
    flip_index_byte(config, 0, 9, 3)
    store = open_store(config)
    assert store.recovery.index_entries_rebuilt == 6
    assert_queue_holds(store, 0, sent)


def test_index_geometry_comes_from_the_checkpoint(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """A queue opened lazily keeps the index chunk size it was written with, when
    the configured one has changed since (the checkpoint records it)."""
    store = open_store()
    store.create_topic(TOPIC, 2)
    sent = {q: append(store, q, f"q{q}", 100) for q in range(2)}
    store.close()
    assert load_checkpoint(store.config.data_dir).chunk_entries == {
        (TOPIC, 0): 64,
        (TOPIC, 1): 64,
    }
    store = open_store(make_config(index_entries_per_chunk=16))
    assert deferred(store, 0) and deferred(store, 1)
    sent[1] += append(store, 1, "more", 40)
    for q in range(2):
        assert_queue_holds(store, q, sent[q])
    store = reopen(open_store, store)
    for q in range(2):
        assert_queue_holds(store, q, sent[q])


def test_many_queues_restart_without_opening_their_indexes(open_store: OpenStore) -> None:
    """A store of many queues, closed cleanly: none is opened at restart, and a
    message appended to any of them afterwards takes the next offset."""
    store = open_store()
    for t in range(4):
        store.create_topic(f"t{t}", 16)
        for q in range(16):
            store.append(f"t{t}", q, MessageBatch([b"x%d" % q] * (q + 1)))
    store.close()
    store = open_store(store.config)
    assert all(q.index.deferred for q in store._state.queues.values())
    for t in range(4):
        for q in range(16):
            assert store.append(f"t{t}", q, MessageBatch([b"y"])).first_offset == q + 1
    store = reopen(open_store, store)
    for t in range(4):
        result = store.read(f"t{t}", 15, 0, max_messages=100)
        assert [m.value for m in result.messages] == [b"x15"] * 16 + [b"y"]


def test_a_truncation_below_the_checkpoint_saves_one_at_once(open_store: OpenStore) -> None:
    """A replica's truncation cuts bytes the checkpoint on disk vouches for; a
    restart trusts that checkpoint without reading them, so the truncation
    saves a new one before anything is appended there again."""
    store = open_store()
    store.create_topic(TOPIC, 2)
    kept = append(store, 0, "a", 10)
    cut = store.log_end
    append(store, 0, "b", 5)
    append(store, 1, "b", 3)
    store.flush()
    assert load_checkpoint(store.config.data_dir).index_position > cut
    store.truncate(cut, TxnScan(1, {}, False, store.epochs, store.producers))
    saved = load_checkpoint(store.config.data_dir)
    assert saved.index_position == cut
    assert saved.ends is not None
    assert (saved.ends[(TOPIC, 0)], saved.ends[(TOPIC, 1)]) == (10, 0)
    kept += append(store, 0, "c", 8)
    store.abandon()  # killed before the next flush
    store = open_store(store.config)
    assert_queue_holds(store, 0, kept)
    assert store.queue_info(TOPIC, 1).end == 0
