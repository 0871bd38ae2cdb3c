"""Staged transactions in the store: stage, commit, abort, sinks, restart, recovery.

Real files in a tmp dir; crashes are simulated with ``Store.abandon`` (nothing
flushed, as a killed process), stopping a commit part-way, and failing a write.
"""

from __future__ import annotations

import errno
import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from equeue_broker.storage import (
    FlushMode,
    InvalidName,
    LimitExceeded,
    MessageBatch,
    NotFound,
    PreconditionFailed,
    StorageError,
    Store,
)
from equeue_broker.storage.config import KiB, MessageLimits, RetentionConfig, TransactionConfig
from equeue_broker.storage.errors import CorruptionError
from equeue_broker.storage.index.queue_index import (
    ENTRY,
    ENTRY_SIZE,
    QueueIndex,
    entry_damaged,
    pack_entry,
)
from equeue_broker.storage.log import record
from equeue_broker.storage.log.message_log import MessageLog
from equeue_broker.storage.log.record import prepare_batch
from equeue_broker.storage.meta.atomic_file import save_json
from equeue_broker.storage.txn.txn_records import (
    Abort,
    Begin,
    Commit,
    Control,
    decode_value,
    encode_control,
    prepare_control,
)
from equeue_broker.testing import BrokerProcess
from equeue_proto import accel
from equeue_proto.record import FLAG_CONTROL, FLAG_TXN, check_frame, decode_record
from equeue_spark.client import (
    Admin,
    ClientConfig,
    EqueueError,
    InvalidRequest,
    NotFoundError,
    PreconditionError,
    Producer,
    read_range,
)
from equeue_spark.client.connection import Connection
from equeue_spark.client.records import decode_records
from equeue_spark.client.transactions import abort_transactions, commit_transactions
from tests.conftest import MakeConfig
from tests.storage.test_formats import LIMITS as FORMAT_LIMITS
from tests.storage.test_formats import messages
from tests.storage.test_store import read_all
from tests.support.records import encode_prepared
from tests.support.waits import wait_for

OpenStore = Callable[..., Store]
T = "orders"


def batch(prefix: str, n: int, keys: bool = False) -> MessageBatch:
    return MessageBatch(
        [f"{prefix}-{i}".encode() for i in range(n)],
        keys=[f"k{i}".encode() for i in range(n)] if keys else None,
    )


def staged_values(store: Store, queue_id: int = 0) -> list[bytes]:
    return read_all(store, T, queue_id)


# -- the on-disk records of a transaction -------------------------------------------


def test_control_records_round_trip() -> None:
    controls: list[Control] = [
        Begin(7, "q1:5:run1:0:0", 1_700_000_000_000),
        Commit((7, 9), "sink-1", 42, (((T, 0), 10, 3), (("other", 1), 0, 1))),
        Commit((), "", -1, ()),
        Abort((3, 4, 5)),
    ]
    for control in controls:
        prepared = prepare_control(control)
        out = bytearray(prepared.total_bytes)
        assert encode_control(out, 4096, prepared, 123) == len(out)
        message = decode_record(out, 0)
        assert (message.topic, message.queue_id, message.position) == ("", 0, 4096)
        assert out[5] & FLAG_CONTROL and not out[5] & FLAG_TXN
        assert decode_value(message.tag, message.value) == control
    with pytest.raises(CorruptionError, match="unknown control record"):
        decode_value("rollback", b"{}")
    with pytest.raises(CorruptionError, match="unreadable 'commit'"):
        decode_value("commit", b'{"serials": [1]}')


def _staged_frames(serial: int) -> tuple[bytes, bytes]:
    b = MessageBatch(
        [b"v0", b"", b"v2" * 100],
        keys=[b"k0", None, b""],
        tags=["a", "", "ccc"],
        headers=[[("h", b"1")], [], [("x", b""), ("y", b"yy")]],
        timestamps_ms=[1, 2, 3],
    )
    prepared = prepare_batch(b, T.encode(), MessageLimits())
    out = bytearray(prepared.total_bytes)
    entries = bytearray(3 * ENTRY_SIZE)
    encode = functools.partial(
        record.encode_records, out, position=800, topic=T.encode(), queue_id=1,
        first_offset=serial, store_ms=111, prepared=prepared, start=0, stop=3,
        index_out=entries, flags=FLAG_TXN,
    )  # fmt: skip
    assert encode() == len(out)
    return bytes(out), bytes(entries)


def test_staged_records_carry_the_serial_and_replies_their_committed_offsets() -> None:
    frames, entries = _staged_frames(serial=77)
    staged = [decode_record(frames, pos) for pos in _frame_starts(frames)]
    assert [m.queue_offset for m in staged] == [77, 77, 77]  # the serial, not an offset
    assert all(frames[pos + 5] & FLAG_TXN for pos in _frame_starts(frames))
    stamped = bytearray(entries)
    record.restamp_entries(stamped, 999)
    python = bytearray(entries)
    for at in range(0, len(python), ENTRY_SIZE):  # the reference, entry by entry
        position, size, tag_hash, _ = ENTRY.unpack_from(python, at)
        python[at : at + ENTRY_SIZE] = pack_entry(position, size, tag_hash, 999)
    assert stamped == python
    patched = record.patch_committed(frames, stamped, 40)
    assert patched is not None and patched == record.patch_committed_py(frames, stamped, 40)
    served = [decode_record(patched, pos) for pos in _frame_starts(patched)]
    assert [(m.queue_offset, m.store_timestamp_ms) for m in served] == [
        (40, 999),
        (41, 999),
        (42, 999),
    ]
    assert [m.value for m in served] == [m.value for m in staged]
    # The checksum is adjusted, not recomputed: damage in the log still shows.
    damaged = bytearray(frames)
    damaged[70] ^= 0xFF
    bad = record.patch_committed(bytes(damaged), stamped, 40)
    assert bad is not None and isinstance(check_frame(bad, 0, len(bad)), str)
    plain, _ = encode_prepared(prepare_batch(batch("p", 2), b"t", MessageLimits()), topic=b"t")
    assert record.patch_committed(plain, b"", 0) is None  # nothing to patch: no copy


def _frame_starts(frames: bytes | bytearray) -> list[int]:
    starts, pos = [], 0
    while pos < len(frames):
        starts.append(pos)
        size = check_frame(frames, pos, len(frames))
        assert isinstance(size, int)
        pos += size
    return starts


@pytest.fixture(params=[FlushMode.ASYNC, FlushMode.SYNC], ids=["async", "sync"])
def store(request: pytest.FixtureRequest, open_store: OpenStore, make_config: MakeConfig) -> Store:
    s = open_store(make_config(flush_mode=request.param))
    s.create_topic(T, 2)
    return s


def test_staged_messages_are_invisible_until_commit(store: Store) -> None:
    store.append(T, 0, batch("plain", 2))
    assert store.transactions.stage("t1", T, [(0, batch("a", 3)), (1, batch("b", 2))]) == 5
    assert store.transactions.stage("t1", T, [(0, batch("c", 1))]) == 6
    assert staged_values(store, 0) == [b"plain-0", b"plain-1"]
    assert store.queue_info(T, 1).end == 0
    result = store.transactions.commit([("t1", 6)])
    assert not result.already_committed
    assert {(q.queue_id, q.first_offset, q.count) for q in result.queues} == {(0, 2, 4), (1, 0, 2)}
    assert staged_values(store, 0) == [b"plain-0", b"plain-1", b"a-0", b"a-1", b"a-2", b"c-0"]
    assert staged_values(store, 1) == [b"b-0", b"b-1"]
    assert store.transactions.list_open() == []


def test_abort_discards_and_offsets_stay_contiguous(store: Store) -> None:
    store.transactions.stage("dead", T, [(0, batch("x", 5))])
    store.transactions.stage("live", T, [(0, batch("y", 2))])
    assert store.transactions.abort(["dead"]) == 1
    store.transactions.commit([("live", 2)])
    store.append(T, 0, batch("z", 1))
    assert staged_values(store, 0) == [b"y-0", b"y-1", b"z-0"]
    assert store.transactions.abort(["dead", "never-existed"]) == 0  # idempotent
    with pytest.raises(PreconditionFailed, match="was aborted"):
        store.transactions.stage("dead", T, [(0, batch("again", 1))])
    with pytest.raises(NotFound, match="'dead' is not open \\(it was aborted\\)"):
        store.transactions.commit([("dead", -1)])


def test_commit_checks_counts_and_is_all_or_nothing(store: Store) -> None:
    store.transactions.stage("a", T, [(0, batch("a", 2))])
    store.transactions.stage("b", T, [(1, batch("b", 2))])
    with pytest.raises(PreconditionFailed, match="holds 2 staged messages; the writer staged 3"):
        store.transactions.commit([("a", 2), ("b", 3)])
    with pytest.raises(NotFound, match="'c' is not open"):
        store.transactions.commit([("a", 2), ("c", 1)])
    assert store.queue_info(T, 0).end == 0 and store.queue_info(T, 1).end == 0
    store.transactions.commit([("a", 2), ("b", 2)])  # still open, still committable
    assert staged_values(store, 0) == [b"a-0", b"a-1"]


def test_sink_replay_is_a_no_op_and_older_batches_are_refused(store: Store) -> None:
    tx = store.transactions
    tx.stage("q1:5:run1:0:0", T, [(0, batch("first", 2))])
    assert not tx.commit([("q1:5:run1:0:0", 2)], sink="q1", batch_id=5).already_committed
    # The driver died before recording batch 5: the replay stages the same rows again.
    tx.stage("q1:5:run2:0:0", T, [(0, batch("first", 2))])
    replay = tx.commit([("q1:5:run2:0:0", 2)], sink="q1", batch_id=5, abort_prefix="q1:5:")
    assert replay.already_committed and replay.aborted == 1
    assert staged_values(store, 0) == [b"first-0", b"first-1"]
    with pytest.raises(PreconditionFailed, match="committed batch 5 already; batch 4 is older"):
        tx.commit([], sink="q1", batch_id=4)
    assert [(s.sink, s.batch_id) for s in tx.sinks()] == [("q1", 5)]


def test_commit_aborts_leftovers_by_prefix(store: Store) -> None:
    tx = store.transactions
    tx.stage("job1:0:0", T, [(0, batch("failed-attempt", 3))])
    tx.stage("job1:0:1", T, [(0, batch("retry", 3))])
    tx.stage("job1:1:0", T, [(1, batch("speculative-loser", 1))])
    tx.stage("job1:1:1", T, [(1, batch("speculative-winner", 1))])
    tx.stage("job2:0:0", T, [(1, batch("other-job", 1))])
    result = tx.commit([("job1:0:1", 3), ("job1:1:1", 1)], abort_prefix="job1:")
    assert result.aborted == 2
    assert staged_values(store, 0) == [b"retry-0", b"retry-1", b"retry-2"]
    assert staged_values(store, 1) == [b"speculative-winner-0"]
    assert [t.txn_id for t in tx.list_open()] == ["job2:0:0"]


def test_bad_ids_and_limits_are_refused(open_store: OpenStore, make_config: MakeConfig) -> None:
    config = make_config(transactions=TransactionConfig(max_open=2, max_bytes=4096))
    store = open_store(config)
    store.create_topic(T, 1)
    tx = store.transactions
    for bad in ["", "../x", "a/b", "x" * 300, "é"]:
        with pytest.raises(InvalidName):
            tx.stage(bad, T, [(0, batch("v", 1))])
    with pytest.raises(NotFound):
        tx.stage("t", "no-such-topic", [(0, batch("v", 1))])
    with pytest.raises(LimitExceeded, match="max_transaction_bytes=4096"):
        tx.stage("big", T, [(0, MessageBatch([b"x" * 5000]))])
    tx.stage("a", T, [(0, batch("v", 1))])
    tx.stage("b", T, [(0, batch("v", 1))])
    with pytest.raises(LimitExceeded, match="max_open_transactions=2"):
        tx.stage("c", T, [(0, batch("v", 1))])


def test_open_transactions_survive_a_crash_and_commit_after(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    config = make_config(flush_mode=FlushMode.SYNC)
    store = open_store(config)
    store.create_topic(T, 2)
    store.transactions.stage("t", T, [(0, batch("a", 3)), (1, batch("b", 1))])
    store.transactions.stage("t", T, [(0, batch("c", 1))])
    store.abandon()
    store = open_store(config)
    [info] = store.transactions.list_open()
    assert (info.txn_id, info.messages, info.queues) == ("t", 5, {(T, 0): 4, (T, 1): 1})
    store.transactions.commit([("t", 5)])
    assert staged_values(store, 0) == [b"a-0", b"a-1", b"a-2", b"c-0"]


def test_idle_transactions_time_out(store: Store) -> None:
    store.transactions.stage("slow", T, [(0, batch("a", 1))])
    timeout = store.transactions.config.timeout_ms
    now = next(t.last_write_ms for t in store.transactions.list_open())
    assert store.transactions.expire(now + timeout - 1) == 0
    assert store.transactions.expire(now + timeout + 1) == 1
    assert store.transactions.list_open() == []
    with pytest.raises(NotFound, match="it was aborted"):
        store.transactions.commit([("slow", 1)])


def test_concurrent_transactions_on_one_queue(store: Store) -> None:
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for round_ in range(5):
                txn = f"w{n}:{round_}"
                store.transactions.stage(txn, T, [(0, batch(f"{n}.{round_}", 10))])
                store.transactions.commit([(txn, 10)])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    values = staged_values(store, 0)
    assert len(values) == len(set(values)) == 4 * 5 * 10
    # Each transaction's ten messages are adjacent and in order.
    for start in range(0, len(values), 10):
        prefix = values[start].rsplit(b"-", 1)[0]
        assert values[start : start + 10] == [b"%s-%d" % (prefix, i) for i in range(10)]


class _Crash(BaseException):
    """The process dies here (not an I/O error: nothing is undone)."""


@pytest.mark.parametrize("mode", [FlushMode.ASYNC, FlushMode.SYNC], ids=["async", "sync"])
def test_crash_between_commit_record_and_its_index_entries(
    open_store: OpenStore, make_config: MakeConfig, mode: FlushMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(flush_mode=mode)
    store = open_store(config)
    store.create_topic(T, 2)
    tx = store.transactions
    store.append(T, 0, batch("plain", 1))
    tx.stage("t", T, [(0, batch("a", 2))])
    tx.stage("t", T, [(1, batch("b", 2))])
    tx.stage("t", T, [(0, batch("c", 2))])
    writes = [0]
    original = QueueIndex.write

    def crash_after_first(index: QueueIndex, first: int, entries: Any) -> None:
        writes[0] += 1
        if writes[0] > 1:
            raise _Crash()
        original(index, first, entries)

    monkeypatch.setattr(QueueIndex, "write", crash_after_first)
    with pytest.raises(_Crash):
        tx.commit([("t", 6)], sink="s", batch_id=0)
    monkeypatch.setattr(QueueIndex, "write", original)
    store.abandon()
    store = open_store(config)  # the commit record is in the log: its entries are derived
    assert staged_values(store, 0) == [b"plain-0", b"a-0", b"a-1", b"c-0", b"c-1"]
    assert staged_values(store, 1) == [b"b-0", b"b-1"]
    assert store.transactions.list_open() == []
    assert [(s.sink, s.batch_id) for s in store.transactions.sinks()] == [("s", 0)]
    assert store.transactions.commit([], sink="s", batch_id=0).already_committed
    store.append(T, 0, batch("late", 1))
    assert store.queue_info(T, 0).end == 6
    store.close()
    store = open_store(config)  # and again from the checkpoint the last open saved
    assert staged_values(store, 0)[-1] == b"late-0"
    assert [(s.sink, s.batch_id) for s in store.transactions.sinks()] == [("s", 0)]


def test_a_failed_index_write_undoes_the_commit(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    tx = store.transactions
    tx.stage("t", T, [(0, batch("a", 2)), (1, batch("b", 2))])
    end = store.stats()["log_write_position"]
    writes = [0]
    original = QueueIndex.write

    def fail_second(index: QueueIndex, first: int, entries: Any) -> None:
        writes[0] += 1
        if writes[0] > 1:
            raise OSError(errno.ENOSPC, "injected: no space left")
        original(index, first, entries)

    monkeypatch.setattr(QueueIndex, "write", fail_second)
    with pytest.raises(StorageError, match="no space left"):
        tx.commit([("t", 4)])
    monkeypatch.setattr(QueueIndex, "write", original)
    assert store.stats()["log_write_position"] == end  # the commit record is cut out again
    assert staged_values(store, 0) == [] and staged_values(store, 1) == []
    assert tx.commit([("t", 4)]).queues  # still open: commit it now
    assert staged_values(store, 0) == [b"a-0", b"a-1"]


@pytest.mark.parametrize("mode", [FlushMode.ASYNC, FlushMode.SYNC], ids=["async", "sync"])
def test_crash_during_staging_and_after_an_abort(
    open_store: OpenStore, make_config: MakeConfig, mode: FlushMode
) -> None:
    config = make_config(flush_mode=mode)
    store = open_store(config)
    store.create_topic(T, 1)
    tx = store.transactions
    tx.stage("kept", T, [(0, batch("k", 2))])
    tx.stage("dropped", T, [(0, batch("d", 3))])
    tx.stage("kept", T, [(0, batch("k2", 1))])
    assert tx.abort(["dropped"]) == 1
    store.flush()  # a checkpoint while "kept" is open: its records are before it
    tx.stage("late", T, [(0, batch("l", 1))])
    store.abandon()
    store = open_store(config)
    assert {(t.txn_id, t.messages) for t in store.transactions.list_open()} == {
        ("kept", 3),
        ("late", 1),
    }
    with pytest.raises(NotFound):
        store.transactions.commit([("dropped", 3)])
    store.transactions.commit([("kept", 3), ("late", 1)])
    assert staged_values(store) == [b"k-0", b"k-1", b"k2-0", b"l-0"]


def test_an_open_transaction_never_blocks_readers(store: Store) -> None:
    tx = store.transactions
    tx.stage("slow", T, [(0, batch("s", 2))])
    store.append(T, 0, batch("plain", 2))
    assert staged_values(store) == [b"plain-0", b"plain-1"]
    tx.stage("fast", T, [(0, batch("f", 1))])
    tx.commit([("fast", 1)])
    tx.commit([("slow", 2)])
    # Offsets in commit order; the records lie in staging order in the log.
    assert staged_values(store) == [b"plain-0", b"plain-1", b"f-0", b"s-0", b"s-1"]
    result = store.reads.read_records(T, 0, 0, max_messages=10)
    messages = decode_records(result.records, "b")
    assert [(m.offset, m.value) for m in messages] == list(enumerate(staged_values(store)))
    assert [m.value for m in store.read(T, 0, 3, max_messages=10).messages] == [b"s-0", b"s-1"]
    decoded = store.read(T, 0, 0, max_messages=10).messages
    assert [m.queue_offset for m in decoded] == [0, 1, 2, 3, 4]
    for m in decoded:  # by message id (log position): the committed offset and time too
        assert store.reads.read_at_position(m.position) == m
        [again] = decode_records(store.reads.record_at(m.position), "b")
        assert (again.offset, again.value) == (m.queue_offset, m.value)


def test_tag_filtered_reads_of_committed_records(store: Store) -> None:
    tx = store.transactions
    tagged = MessageBatch([b"x0", b"y1", b"x2"], tags=["x", "y", "x"])
    tx.stage("a", T, [(0, tagged)])
    store.append(T, 0, MessageBatch([b"x3"], tags=["x"]))
    tx.commit([("a", 3)])
    result = store.reads.read_records(T, 0, 0, max_messages=10, tags=["x"])
    got = [(m.offset, m.value) for m in decode_records(result.records, "b")]
    assert got == [(0, b"x3"), (1, b"x0"), (3, b"x2")]


def test_retention_keeps_chunks_of_open_transactions(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    config = make_config(
        chunk_capacity_bytes=4 * KiB,
        limits=MessageLimits(max_message_bytes=2 * KiB),
        retention=RetentionConfig(max_chunks=1),
    )
    store = open_store(config)
    store.create_topic(T, 1)
    tx = store.transactions
    tx.stage("open", T, [(0, batch("o", 2))])
    first_chunk = store.stats()["log_start_position"]
    for i in range(40):
        store.append(T, 0, MessageBatch([b"%d" % i + b"." * 400]))
    assert store.apply_retention().log_chunks_deleted == 0  # pinned by "open"
    assert store.stats()["log_start_position"] == first_chunk
    tx.commit([("open", 2)])  # offsets 40, 41 point into the oldest chunk
    for i in range(20):
        store.append(T, 0, MessageBatch([b"late-%d" % i + b"." * 400]))
    report = store.apply_retention()
    # Offsets 0.. retire only together with the oldest chunk and the committed
    # records in it: no index entry is left pointing at a gone chunk.
    info = store.queue_info(T, 0)
    assert report.log_chunks_deleted > 0 and info.earliest > 41
    values = [m.value for m in store.read(T, 0, info.earliest, max_messages=100).messages]
    assert len(values) == info.end - info.earliest and values[-1].startswith(b"late-19")


def test_stage_files_of_an_older_version_are_refused_or_migrated(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    config = make_config()
    store = open_store(config)
    store.close()
    old = config.data_dir / "txn"
    old.mkdir()
    (old / ("0" * 32 + ".stage")).write_bytes(b"EQTX")
    with pytest.raises(PreconditionFailed, match="stage files"):
        Store(config, background=False)
    (old / ("0" * 32 + ".stage")).unlink()
    save_json(old / "sinks.json", {"q1": [7, 1_000]})
    store = open_store(config)
    assert [(s.sink, s.batch_id) for s in store.transactions.sinks()] == [("q1", 7)]
    assert not old.exists()


# -- over gRPC, on a real broker process -------------------------------------------


def values_of(address: str, topic: str, queue_id: int) -> list[bytes]:
    return [m.value for b in read_range(topic, queue_id, 0, broker=address) for m in b]


def test_transactions_over_grpc(broker: BrokerProcess) -> None:
    with Producer(broker.address) as producer, Admin(broker.address) as admin:
        admin.create_topic("tx", queues=2)
        producer.send_batch("tx", [b"before"], queue_ids=[0])
        txn = producer.transaction("load:1")
        staged = txn.send_batch("tx", [b"a", b"b", b"c"], queue_ids=[0, 1, 0])
        assert list(staged.queue_ids) == [0, 1, 0] and staged[0].offset == -1
        assert values_of(broker.address, "tx", 0) == [b"before"]  # invisible
        [info] = admin.list_transactions().transactions
        assert (info.transaction_id, info.messages) == ("load:1", 3)
        assert admin.stats().open_transactions == 1
        outcome = txn.commit()
        assert sorted(outcome.queues) == [("tx", 0, 1, 2), ("tx", 1, 0, 1)]
        assert values_of(broker.address, "tx", 0) == [b"before", b"a", b"c"]
        assert values_of(broker.address, "tx", 1) == [b"b"]

        with pytest.raises(RuntimeError), producer.transaction("load:2") as failing:
            failing.send_batch("tx", [b"never"], queue_ids=[0])
            raise RuntimeError("the writer fails")
        assert admin.list_transactions().transactions == []
        with producer.transaction("load:3") as ok:
            ok.send_batch("tx", [b"d"], queue_ids=[0])
        assert values_of(broker.address, "tx", 0) == [b"before", b"a", b"c", b"d"]

        conn = Connection(ClientConfig(broker=broker.address))
        with pytest.raises(NotFoundError, match="'load:2' is not open \\(it was aborted\\)"):
            commit_transactions(conn, [("load:2", 1)])
        with pytest.raises(InvalidRequest, match="'bad/id'"):
            producer.send_batch("tx", [b"x"], transaction_id="bad/id")
        producer.send_batch("tx", [b"x"], queue_ids=[1], transaction_id="count")
        with pytest.raises(PreconditionError, match="holds 1 staged messages; the writer staged 2"):
            commit_transactions(conn, [("count", 2)])
        first = commit_transactions(conn, [("count", 1)], sink="writer-1", batch_id=0)
        producer.send_batch("tx", [b"x"], queue_ids=[1], transaction_id="count-again")
        replay = commit_transactions(conn, [("count-again", 1)], sink="writer-1", batch_id=0)
        assert not first.already_committed and replay.already_committed and replay.aborted == 1
        assert values_of(broker.address, "tx", 1) == [b"b", b"x"]
        sinks = admin.list_transactions().sinks
        assert [(s.sink, s.batch_id) for s in sinks] == [("writer-1", 0)]
        conn.close()


def test_open_transaction_survives_broker_sigkill_in_sync_mode(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    data_dir = tmp_path / "sync-broker"
    first = broker_factory("--flush", "sync", data_dir=data_dir)
    with Producer(first.address) as producer:
        producer.send_batch("tx", [b"s1", b"s2"], queue_ids=[0, 0], transaction_id="t")
    first.kill()
    second = broker_factory("--flush", "sync", data_dir=data_dir)
    conn = Connection(ClientConfig(broker=second.address))
    assert values_of(second.address, "tx", 0) == []
    commit_transactions(conn, [("t", 2)])
    assert values_of(second.address, "tx", 0) == [b"s1", b"s2"]
    conn.close()


def test_broker_aborts_idle_transactions_after_its_timeout(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory("--transaction-timeout-ms", "300", "--flush-interval-ms", "20")
    with Producer(broker.address) as producer, Admin(broker.address) as admin:
        producer.send_batch("tx", [b"x"], transaction_id="forgotten")
        assert len(admin.list_transactions().transactions) == 1
        wait_for(
            "the idle transaction to be aborted",
            lambda: not admin.list_transactions().transactions,
            30,
        )
        with pytest.raises(PreconditionError, match="'forgotten' was aborted already"):
            producer.send_batch("tx", [b"y"], transaction_id="forgotten")


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("point", ["stage", "commit-record", "abort"])
def test_broker_killed_inside_a_transaction(tmp_path: Path, point: str, mode: str) -> None:
    """SIGKILL at three moments (tests/support/killing_broker.py), then a
    restart over the same data: the transaction is as the log says, and the
    writer's retry (a sink's replay) neither loses nor duplicates anything."""
    data = tmp_path / "data"
    flags = ("--flush", mode, "--log-level", "WARNING")
    dying = BrokerProcess(
        data, *flags, module="tests.support.killing_broker", env={"EQUEUE_KILL_AT": point},
        log_path=tmp_path / "dying.log", cwd=REPO,
    )  # fmt: skip
    dying.start()
    config = ClientConfig(broker=dying.address, retries=0, timeout_s=20)
    with Producer(dying.address) as producer, Admin(dying.address) as admin:
        admin.create_topic("tx", queues=1)
        producer.send_batch("tx", [b"before"], queue_ids=[0])
        if point != "stage":
            producer.send_batch("tx", [b"a", b"b"], queue_ids=[0, 0], transaction_id="w:1")
        conn = Connection(config)
        with pytest.raises(EqueueError):
            if point == "stage":
                producer.send_batch("tx", [b"a", b"b"], queue_ids=[0, 0], transaction_id="w:1")
            elif point == "commit-record":
                commit_transactions(conn, [("w:1", 2)], sink="w", batch_id=0)
            else:
                abort_transactions(conn, ["w:1"])
        conn.close()
    dying.kill()
    broker = BrokerProcess(data, *flags, log_path=tmp_path / "broker.log")
    broker.start()
    try:
        with Admin(broker.address) as admin, Producer(broker.address) as producer:
            open_ = {t.transaction_id: t.messages for t in admin.list_transactions().transactions}
            conn = Connection(ClientConfig(broker=broker.address))
            if point == "stage":  # begun, nothing staged: the writer's count check tells
                assert open_ == {"w:1": 0}
                with pytest.raises(PreconditionError, match="holds 0 staged messages"):
                    commit_transactions(conn, [("w:1", 2)], sink="w", batch_id=0)
                producer.send_batch("tx", [b"a", b"b"], queue_ids=[0, 0], transaction_id="w:2")
                commit_transactions(conn, [("w:2", 2)], sink="w", batch_id=0, abort_prefix="w:")
            elif point == "commit-record":  # committed: the retry is a replay
                assert open_ == {}
                replay = commit_transactions(conn, [("w:1", 2)], sink="w", batch_id=0)
                assert replay.already_committed
            else:  # aborted for good
                assert open_ == {}
                with pytest.raises(NotFoundError, match="not open"):
                    commit_transactions(conn, [("w:1", 2)])
            conn.close()
            assert admin.list_transactions().transactions == []
        expected = [b"before"] if point == "abort" else [b"before", b"a", b"b"]
        assert values_of(broker.address, "tx", 0) == expected
    finally:
        broker.kill()


@given(messages, st.integers(min_value=0, max_value=2**40), st.integers(0, 2**40), st.data())
def test_staged_encoding_and_reply_patch_match_the_python_reference(
    rows: list[tuple[bytes, bytes | None, str, list[tuple[str, bytes]], int]],
    position: int,
    first_offset: int,
    data: st.DataObject,
) -> None:
    """The C encoder with TXN, ``patch_committed`` and ``restamp_entries``
    against their pure-Python references (EQUEUE_PURE_PYTHON=1 runs those)."""
    if accel.IMPLEMENTATION != "c":
        pytest.skip("C accelerator not built (EQUEUE_PURE_PYTHON set)")
    batch = MessageBatch(
        values=[r[0] for r in rows],
        keys=[r[1] for r in rows],
        tags=[r[2] for r in rows] if data.draw(st.booleans()) else None,
        headers=[r[3] for r in rows],
        timestamps_ms=[r[4] for r in rows],
    )
    prepared = prepare_batch(batch, b"topic", FORMAT_LIMITS)
    outputs = []
    for encode in (record.encode_records, record.encode_records_py):
        out, entries = bytearray(prepared.total_bytes), bytearray(len(rows) * ENTRY_SIZE)
        encode(
            out, position=position, topic=b"topic", queue_id=3, first_offset=5, store_ms=77,
            prepared=prepared, start=0, stop=len(rows), index_out=entries, flags=FLAG_TXN,
        )  # fmt: skip
        outputs.append((out, entries))
    assert outputs[0] == outputs[1]
    frames, entries = outputs[0]
    stamped = bytearray(entries)
    record.restamp_entries(stamped, 12345)
    assert record.patch_committed(frames, stamped, first_offset) == record.patch_committed_py(
        frames, stamped, first_offset
    )


def test_committing_a_transaction_whose_first_stage_call_failed(
    open_store: OpenStore, make_config: MakeConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It has no begin record: its commit must not name it (recovery would
    look for its records in vain)."""
    config = make_config()
    store = open_store(config)
    store.create_topic(T, 1)

    def disk_full(*_args: Any) -> None:
        raise StorageError("injected: no space left")

    with monkeypatch.context() as patch:
        patch.setattr(store, "stage_records", disk_full)
        with pytest.raises(StorageError, match="injected"):  # created, nothing written
            store.transactions.stage("empty", T, [(0, batch("e", 1))])
    store.transactions.stage("full", T, [(0, batch("f", 1))])
    store.transactions.commit([("empty", 0), ("full", 1)])
    store.abandon()
    store = open_store(config)
    assert staged_values(store) == [b"f-0"]


@pytest.mark.parametrize("mode", [FlushMode.ASYNC, FlushMode.SYNC], ids=["async", "sync"])
def test_a_stage_call_failing_part_way_keeps_what_reached_the_log(
    open_store: OpenStore, make_config: MakeConfig, mode: FlushMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A staged batch larger than a chunk is written a piece per chunk; if a
    piece fails (disk full), the pieces before it are in the log, so the
    transaction holds them at runtime as recovery will: a commit then agrees
    with what a restart derives."""
    config = make_config(flush_mode=mode)
    store = open_store(config)
    store.create_topic(T, 1)
    big = MessageBatch([b"%04d" % i + b"." * 1020 for i in range(100)])  # ~100 KiB: 2 pieces
    calls = [0]
    original = MessageLog.append

    def fail_second_piece(log: MessageLog, size: int, encode: Any) -> int:
        calls[0] += 1
        if calls[0] == 3:  # the begin record, the first piece, then this one
            raise OSError(errno.ENOSPC, "injected: no space left")
        return original(log, size, encode)

    with monkeypatch.context() as patch:
        patch.setattr(MessageLog, "append", fail_second_piece)
        with pytest.raises(StorageError, match="no space left"):
            store.transactions.stage("t", T, [(0, big)])
    [info] = store.transactions.list_open()
    assert 0 < info.messages < 100
    with pytest.raises(PreconditionFailed, match="the writer staged 100"):
        store.transactions.commit([("t", 100)])
    store.transactions.commit([("t", info.messages)])
    kept = staged_values(store)
    assert kept == big.values[: info.messages]
    store.abandon()
    store = open_store(config)  # the commit record is after the checkpoint: derived again
    assert staged_values(store) == kept


def test_a_damaged_entry_beside_committed_records_is_rebuilt(store: Store) -> None:
    """Committed records lie out of offset order in the log: they never bound
    the scan that rebuilds a neighbour's damaged entry (index_repair.py)."""
    tx = store.transactions
    tx.stage("early", T, [(0, batch("e", 2))])  # records before "n-0" in the log
    store.append(T, 0, batch("n", 1))
    tx.commit([("early", 2)])  # offsets 1, 2 point back before offset 0's record
    store.append(T, 0, batch("m", 1))
    index = store._state.queues[(T, 0)].index
    index.write(0, b"\x01" * ENTRY_SIZE)  # fails its checksum
    assert staged_values(store) == [b"n-0", b"e-0", b"e-1", b"m-0"]
    assert not entry_damaged(index.read_raw(0, 1))
