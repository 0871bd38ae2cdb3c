"""Staged transactions in the store: stage, commit, abort, sinks, restart, roll-forward.

Real files in a tmp dir; crashes are simulated with ``Store.abandon`` (nothing
flushed, as a killed process) and by failing an append part-way.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from equeue_broker.storage import (
    FlushMode,
    InvalidName,
    LimitExceeded,
    MessageBatch,
    NotFound,
    PreconditionFailed,
    StorageError,
    Store,
    record,
)
from equeue_broker.storage.config import MessageLimits, TransactionConfig
from equeue_broker.storage.queue_index import ENTRY_SIZE
from equeue_broker.storage.record import prepare_batch, rebase_records
from equeue_broker.storage.staging import (
    StageFile,
    decode_body,
    encode_entry,
    file_name,
)
from equeue_broker.testing import BrokerProcess
from equeue_proto.record import decode_record
from equeue_spark.client import (
    Admin,
    ClientConfig,
    InvalidRequest,
    NotFoundError,
    PreconditionError,
    Producer,
    read_range,
)
from equeue_spark.client.connection import Connection
from equeue_spark.client.transactions import commit_transactions
from tests.conftest import MakeConfig
from tests.support.records import encode_prepared
from tests.support.waits import wait_for
from tests.test_store import read_all

OpenStore = Callable[..., Store]
T = "orders"


def batch(prefix: str, n: int, keys: bool = False) -> MessageBatch:
    return MessageBatch(
        [f"{prefix}-{i}".encode() for i in range(n)],
        keys=[f"k{i}".encode() for i in range(n)] if keys else None,
    )


def staged_values(store: Store, queue_id: int = 0) -> list[bytes]:
    return read_all(store, T, queue_id)


# -- the stage file format ---------------------------------------------------------


def test_stage_entry_round_trips_and_rebases_to_appended_bytes(open_store: OpenStore) -> None:
    b = MessageBatch(
        [b"v0", b"", b"v2" * 100],
        keys=[b"k0", None, b""],
        tags=["a", "", "ccc"],
        headers=[[("h", b"1")], [], [("x", b""), ("y", b"yy")]],
        timestamps_ms=[1, 2, 3],
    )
    store = open_store()
    store.create_topic(T, 8)
    prepared = store.prepare(T, 7, b)
    entry = encode_entry(T, 7, prepared, staged_ms=5)
    staged = decode_body(memoryview(entry)[8:])
    assert (staged.topic, staged.queue_id, staged.records.count) == (T, 7, 3)
    # Rebased at a position and offset, the records equal what a plain append encodes there.
    direct, direct_index = encode_prepared(
        prepared, topic=T.encode(), queue_id=7, position=4096, first_offset=40, store_ms=99
    )
    rebased_index = bytearray(3 * ENTRY_SIZE)
    rebased = bytearray(prepared.total_bytes)
    written = rebase_records(
        rebased, staged.records, position=4096, first_offset=40, store_ms=99,
        index_out=rebased_index,
    )  # fmt: skip
    assert written == len(direct) and rebased == direct and rebased_index == direct_index
    python = bytearray(prepared.total_bytes)
    python_index = bytearray(3 * ENTRY_SIZE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(record, "_rebase_c", None)  # the pure-Python reference
        rebase_records(
            python, staged.records, position=4096, first_offset=40, store_ms=99,
            index_out=python_index,
        )  # fmt: skip
    assert python == direct and python_index == direct_index
    starts = [0, *itertools.accumulate(staged.records.frame_sizes())][:3]
    messages = [decode_record(rebased, pos) for pos in starts]
    assert [(m.queue_offset, m.value, m.key, m.tag) for m in messages] == [
        (40, b"v0", b"k0", "a"), (41, b"", None, ""), (42, b"v2" * 100, b"", "ccc"),
    ]  # fmt: skip


def test_stage_file_cuts_a_torn_last_entry(tmp_path: Path) -> None:
    limits = MessageLimits()
    stage = StageFile.create(tmp_path, "txn-1", 123)
    entries = [
        encode_entry(T, 0, prepare_batch(batch(str(i), 3), T.encode(), limits), 1) for i in range(3)
    ]
    stage.append(entries)
    stage.close()
    path = tmp_path / file_name("txn-1")
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 5)  # the last entry loses its tail
    reopened, counts = StageFile.open(path)
    assert reopened.txn_id == "txn-1" and reopened.created_ms == 123
    assert counts == [(T, 0, 3), (T, 0, 3)]
    assert path.stat().st_size == size - len(entries[-1])
    assert [s.records.count for s in reopened.batches()] == [3, 3]
    reopened.close()


# -- behaviour ---------------------------------------------------------------------


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


class _Boom(Exception):
    pass


def _failing_after(store: Store, appends: int) -> Iterator[None]:
    """Make the store's appends of committed records raise after ``appends`` pieces."""
    original = store._write_rebased
    calls = [0]

    def write(*args: Any) -> None:
        calls[0] += 1
        if calls[0] > appends:
            raise StorageError("injected I/O error")
        original(*args)

    store._write_rebased = write  # type: ignore[method-assign,assignment]
    yield
    store._write_rebased = original  # type: ignore[method-assign]


@pytest.mark.parametrize("mode", [FlushMode.ASYNC, FlushMode.SYNC], ids=["async", "sync"])
def test_commit_interrupted_part_way_rolls_forward_at_restart(
    open_store: OpenStore, make_config: MakeConfig, mode: FlushMode
) -> None:
    config = make_config(flush_mode=mode)
    store = open_store(config)
    store.create_topic(T, 2)
    tx = store.transactions
    tx.stage("t", T, [(0, batch("a", 2))])
    tx.stage("t", T, [(1, batch("b", 2))])
    tx.stage("t", T, [(0, batch("c", 2))])
    fault = _failing_after(store, 1)
    next(fault)
    with pytest.raises(StorageError, match="injected"):
        tx.commit([("t", 6)], sink="s", batch_id=0)
    # Half applied: the queues refuse other appends until the rest is in.
    assert staged_values(store, 0) == [b"a-0", b"a-1"]
    with pytest.raises(StorageError, match="interrupted transaction commit"):
        store.append(T, 0, batch("late", 1))
    store.abandon()
    store = open_store(config)  # recovery rolls the decision forward
    assert staged_values(store, 0) == [b"a-0", b"a-1", b"c-0", b"c-1"]
    assert staged_values(store, 1) == [b"b-0", b"b-1"]
    assert store.transactions.list_open() == []
    assert [(s.sink, s.batch_id) for s in store.transactions.sinks()] == [("s", 0)]
    store.append(T, 0, batch("late", 1))
    assert store.queue_info(T, 0).end == 5


def test_commit_interrupted_part_way_rolls_forward_at_runtime(store: Store) -> None:
    tx = store.transactions
    tx.stage("t", T, [(0, batch("a", 2)), (1, batch("b", 2))])
    fault = _failing_after(store, 1)
    next(fault)
    with pytest.raises(StorageError, match="injected"):
        tx.commit([("t", 4)])
    next(fault, None)  # the disk is back
    assert tx.expire() == 0  # the maintenance pass completes the commit
    assert staged_values(store, 0) == [b"a-0", b"a-1"]
    assert staged_values(store, 1) == [b"b-0", b"b-1"]
    store.append(T, 1, batch("after", 1))
    assert staged_values(store, 1)[-1] == b"after-0"


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


def test_a_stage_file_torn_at_creation_is_removed_at_open(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    config = make_config()
    store = open_store(config)
    store.create_topic(T, 1)
    store.transactions.stage("kept", T, [(0, batch("k", 2))])
    store.abandon()
    torn = config.data_dir / "txn" / file_name("torn")
    torn.write_bytes(b"EQ")  # killed between creating the file and writing its header
    store = open_store(config)
    assert [t.txn_id for t in store.transactions.list_open()] == ["kept"]
    assert not torn.exists()
