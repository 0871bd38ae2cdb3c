"""Damaged bytes at rest in the queue index (issue 15): byte surgery on index
entries, then a reopen or a read, asserting that no acknowledged message is
lost, misserved or skipped, and that no offset is reused.

The index is derived data: a damaged entry is detected (its checksum, or a
check against the record it names) and rebuilt from the log, never trusted,
and never a reason to cut the log (``index_repair.py``). Style and helpers as
in ``test_recovery.py``.
"""

from __future__ import annotations

from equeue_broker.storage import FlushMode
from tests.conftest import MakeConfig
from tests.support.faults import flip_index_byte, index_entry, simulate_machine_crash
from tests.support.sent import TOPIC, OpenStore, Sent, append, assert_queue_holds, reopen

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
    sent: dict[int, list[Sent]] = {0: append(store, 0, "a", 50), 1: append(store, 1, "b", 5)}
    store.flush()  # the checkpoint: entries so far are durable
    for round_ in range(5):
        sent[0] += append(store, 0, f"c{round_}", 10)
        sent[1] += append(store, 1, f"d{round_}", 10)
    config = store.config
    simulate_machine_crash(store)
    flip_index_byte(config, 0, 49, _POSITION_HIGH_BYTE)

    store = open_store(config)
    assert store.recovery.tail_bytes_discarded == 0
    for queue_id in (0, 1):
        assert_queue_holds(store, queue_id, sent[queue_id])
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
