"""Idempotent producers in the store: the rules, the producer record, and the
state surviving restarts, crashes and replication (storage/producers/)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from equeue_broker.replication.replica_log import ReplicaLog
from equeue_broker.storage import MessageBatch, StorageConfig, Store
from equeue_broker.storage.config import FlushMode, ProducerConfig
from equeue_broker.storage.errors import (
    CorruptionError,
    InvalidArgument,
    LimitExceeded,
    OutOfOrderSequence,
    ProducerFenced,
    UnknownProducer,
)
from equeue_broker.storage.producers.records import (
    PRODUCER_TAG,
    ProducerBatch,
    decode_value,
    encode_value,
)
from equeue_broker.storage.producers.table import Idempotence, ProducerTable
from equeue_proto.record import FLAG_BATCH_END, FLAG_CONTROL, read_meta

OpenStore = Callable[..., Store]
MakeConfig = Callable[..., StorageConfig]


def _batch(*values: bytes) -> MessageBatch:
    return MessageBatch(list(values))


def _values(store: Store, topic: str = "t", queue_id: int = 0) -> list[bytes]:
    return [m.value for m in store.read(topic, queue_id, 0, max_messages=10_000).messages]


# -- the record ------------------------------------------------------------------------


def test_the_producer_record_round_trips_and_refuses_garbage() -> None:
    batch = ProducerBatch((1 << 63) - 1, 7, 123_456, "topic-ü", 1023, -1, 99)
    assert decode_value(encode_value(batch)) == batch
    with pytest.raises(CorruptionError, match="too short"):
        decode_value(b"\x01abc")
    with pytest.raises(CorruptionError, match="unknown version"):
        decode_value(b"\x09" + encode_value(batch)[1:])


def test_the_producer_record_and_its_batch_are_one_atomic_piece(open_store: OpenStore) -> None:
    """In the log: the producer record (CONTROL, no BATCH_END) right before the
    batch, whose last record ends the piece; the batch's first record lies at
    the record's position plus its frame (what the table keeps)."""
    store = open_store()
    store.create_topic("t", 1)
    pid, epoch = store.init_producer(0)
    result = store.append("t", 0, _batch(b"a", b"b"), Idempotence(pid, epoch, 0))
    data = store.read_log(0, 1 << 20).data
    first = read_meta(data, 0)
    assert first.flags & FLAG_CONTROL and not first.flags & FLAG_BATCH_END
    assert first.tag == PRODUCER_TAG.encode()
    assert result.first_position() == first.frame_size
    second = read_meta(data, first.frame_size)
    assert second.topic == b"t" and not second.flags & FLAG_BATCH_END
    last = read_meta(data, first.frame_size + second.frame_size)
    assert last.flags & FLAG_BATCH_END


# -- the rules ---------------------------------------------------------------------------


def test_a_repeated_batch_gets_its_original_offsets_and_is_not_appended(
    open_store: OpenStore,
) -> None:
    store = open_store()
    store.create_topic("t", 2)
    pid, epoch = store.init_producer(0)
    assert pid > 0 and epoch == 0
    first = store.append("t", 0, _batch(b"a", b"b"), Idempotence(pid, epoch, 0))
    again = store.append("t", 0, _batch(b"a", b"b"), Idempotence(pid, epoch, 0))
    assert again.duplicate and not first.duplicate
    assert (again.first_offset, again.positions()) == (first.first_offset, first.positions())
    # Sequences are per queue: queue 1 starts at 0.
    store.append("t", 1, _batch(b"x"), Idempotence(pid, epoch, 0))
    store.append("t", 0, _batch(b"c"), Idempotence(pid, epoch, 1))
    assert _values(store) == [b"a", b"b", b"c"]
    assert _values(store, queue_id=1) == [b"x"]


def test_gaps_old_sequences_fenced_epochs_and_unknown_ids_are_refused(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    store = open_store(make_config(producers=ProducerConfig(window=2)))
    store.create_topic("t", 1)
    pid, epoch = store.init_producer(0)
    for seq in range(4):
        store.append("t", 0, _batch(b"%d" % seq), Idempotence(pid, epoch, seq))
    with pytest.raises(OutOfOrderSequence, match="sent sequence 5 for t/0, expected 4"):
        store.append("t", 0, _batch(b"gap"), Idempotence(pid, epoch, 5))
    with pytest.raises(OutOfOrderSequence, match="older than the last 2 remembered"):
        store.append("t", 0, _batch(b"1"), Idempotence(pid, epoch, 1))
    assert store.append("t", 0, _batch(b"2"), Idempotence(pid, epoch, 2)).duplicate
    with pytest.raises(OutOfOrderSequence, match="had 1 messages, this one 2"):
        store.append("t", 0, _batch(b"3", b"x"), Idempotence(pid, epoch, 3))
    with pytest.raises(UnknownProducer, match="ask InitProducer"):
        store.append("t", 0, _batch(b"u"), Idempotence(pid + 1, 0, 3))
    same, newer = store.init_producer(pid)
    assert (same, newer) == (pid, epoch + 1)
    with pytest.raises(ProducerFenced, match=f"epoch {epoch} is fenced"):
        store.append("t", 0, _batch(b"old"), Idempotence(pid, epoch, 4))
    with pytest.raises(OutOfOrderSequence, match="expected 0"):
        store.append("t", 0, _batch(b"new"), Idempotence(pid, newer, 4))
    store.append("t", 0, _batch(b"new"), Idempotence(pid, newer, 0))
    assert _values(store) == [b"0", b"1", b"2", b"3", b"new"]


def test_the_table_is_bounded(open_store: OpenStore, make_config: MakeConfig) -> None:
    """At most max_producers ids (the least recently written forgotten) and
    max_queues_per_producer queues per id."""
    config = ProducerConfig(max_producers=3, max_queues_per_producer=2)
    store = open_store(make_config(producers=config))
    store.create_topic("t", 4)
    ids = [store.init_producer(0)[0] for _ in range(4)]
    for pid in ids:
        store.append("t", 0, _batch(b"v"), Idempotence(pid, 0, 0))
    assert len(store.producers) == 3
    with pytest.raises(UnknownProducer):  # the first one was forgotten
        store.append("t", 0, _batch(b"v"), Idempotence(ids[0], 0, 1))
    store.append("t", 1, _batch(b"v"), Idempotence(ids[3], 0, 0))
    with pytest.raises(LimitExceeded, match="max_queues_per_producer=2"):
        store.append("t", 2, _batch(b"v"), Idempotence(ids[3], 0, 0))
    with pytest.raises(InvalidArgument):
        ProducerConfig(window=0)


def test_idle_producers_expire() -> None:
    table = ProducerTable(ProducerConfig(idle_expiry_ms=1_000))
    table.apply(ProducerBatch(5, 0, 0, "t", 0, 0, 1), 100, now_ms=0)
    table.apply(ProducerBatch(6, 0, 0, "t", 0, 1, 1), 200, now_ms=5_000)  # 5 is idle: gone
    assert len(table) == 1
    with pytest.raises(UnknownProducer):
        table.check(("t", 0), Idempotence(5, 0, 1), 1)


def test_truncating_the_log_drops_the_batches_after_the_cut() -> None:
    table = ProducerTable(ProducerConfig())
    for seq, position in enumerate((100, 200, 300)):
        table.apply(ProducerBatch(5, 0, seq, "t", 0, seq, 1), position, now_ms=0)
    table.truncate(200)
    assert table.check(("t", 0), Idempotence(5, 0, 1), 1) is None  # the next again
    assert table.check(("t", 0), Idempotence(5, 0, 0), 1) is not None
    table.truncate(50)  # the queue's first batch cut too: it starts at 0 again
    assert table.check(("t", 0), Idempotence(5, 0, 0), 1) is None


def test_a_cut_behind_the_window_continues_after_the_last_kept_sequence() -> None:
    table = ProducerTable(ProducerConfig(window=1))
    for seq, position in enumerate((100, 200, 300)):
        table.apply(ProducerBatch(5, 0, seq, "t", 0, seq, 1), position, now_ms=0)
    table.truncate(250)  # the one remembered batch (2) goes; 0 and 1 stay in the log
    with pytest.raises(OutOfOrderSequence, match="older than"):
        table.check(("t", 0), Idempotence(5, 0, 1), 1)
    assert table.check(("t", 0), Idempotence(5, 0, 2), 1) is None


# -- the state survives --------------------------------------------------------------------


def test_the_state_survives_a_restart_and_a_crash(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """From the checkpoint after a clean close; from the log alone after a
    process crash that left no checkpoint of the batches."""
    config = make_config()
    store = open_store(config)
    store.create_topic("t", 1)
    pid, epoch = store.init_producer(0)
    store.append("t", 0, _batch(b"a"), Idempotence(pid, epoch, 0))
    store.close()
    store = open_store(config)
    assert store.append("t", 0, _batch(b"a"), Idempotence(pid, epoch, 0)).duplicate
    store.flush()  # the checkpoint has sequence 0 ...
    store.append("t", 0, _batch(b"b", b"c"), Idempotence(pid, epoch, 1))
    store.abandon()  # ... and the crash leaves sequence 1 only in the log
    store = open_store(config)
    again = store.append("t", 0, _batch(b"b", b"c"), Idempotence(pid, epoch, 1))
    assert again.duplicate and again.first_offset == 1
    assert _values(store) == [b"a", b"b", b"c"]


def test_sync_flush_mode_dedupes_too(open_store: OpenStore, make_config: MakeConfig) -> None:
    store = open_store(make_config(flush_mode=FlushMode.SYNC), background=True)
    store.create_topic("t", 1)
    pid, epoch = store.init_producer(0)
    first = store.append("t", 0, _batch(b"a"), Idempotence(pid, epoch, 0))
    again = store.append("t", 0, _batch(b"a"), Idempotence(pid, epoch, 0))
    assert again.duplicate and again.positions() == first.positions()
    assert _values(store) == [b"a"]


def test_a_replica_derives_the_state_from_the_copied_log_and_cuts_it_with_the_log(
    open_store: OpenStore, make_config: MakeConfig, tmp_path: Path
) -> None:
    """A promoted replica acknowledges a retry of a batch its old master
    appended (the failover of issue 25), and forgets what it truncates."""
    master = open_store()
    master.create_topic("t", 1)
    pid, epoch = master.init_producer(0)
    master.append("t", 0, _batch(b"a"), Idempotence(pid, epoch, 0))
    middle = master.log_end
    master.append("t", 0, _batch(b"b"), Idempotence(pid, epoch, 1))
    replica_store = open_store(make_config(data_dir=tmp_path / "replica"))
    replica_store.create_topic("t", 1)
    replica = ReplicaLog(replica_store)
    piece = master.read_log(0, 1 << 20)
    assert replica.append(0, piece.data) == master.log_end
    assert replica_store.append("t", 0, _batch(b"b"), Idempotence(pid, epoch, 1)).duplicate
    replica.truncate(middle)  # a divergent tail: the second batch is gone
    retried = replica_store.append("t", 0, _batch(b"b"), Idempotence(pid, epoch, 1))
    assert not retried.duplicate and retried.first_offset == 1
    assert _values(replica_store) == [b"a", b"b"]
