"""Check-back state in the log: the begin record's group, check records, the
schedule derived from them (storage/txn/check_policy.py), across a crash and on
a replica, and un-counted when a replica's tail is cut."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from equeue_broker.replication.replica_log import ReplicaLog
from equeue_broker.storage import FlushMode, MessageBatch, PreconditionFailed, Store
from equeue_broker.storage.config import TransactionConfig
from equeue_broker.storage.errors import InvalidArgument, NotFound
from equeue_broker.storage.txn.check_policy import CheckPolicy
from equeue_broker.storage.txn.txn_records import (
    Begin,
    Check,
    decode_value,
    encode_value,
)
from equeue_broker.storage.txn.txn_recovery import _CHECK_LOG, StagedTxn
from tests.conftest import MakeConfig

OpenStore = Callable[..., Store]
T = "orders"
POLICY = CheckPolicy(after_ms=1_000, interval_ms=2_000, max_checks=3, on_exhausted="rollback")


def _batch(n: int) -> MessageBatch:
    return MessageBatch([f"m{i}".encode() for i in range(n)])


def test_begin_with_group_and_check_records_round_trip() -> None:
    for control in (
        Begin(1, "t", 5, "orders-svc"),
        Begin(2, "u", 6),
        Check(1, 3, 1_700_000_000_000, "none"),
        Check(9, 1, 7, "unknown"),
    ):
        assert decode_value(*encode_value(control)) == control
    # A begin record of an older broker (no "group") reads as no group.
    assert decode_value("begin", b'{"serial":1,"txn":"t","created_ms":5}') == Begin(1, "t", 5)
    assert b"group" not in encode_value(Begin(2, "u", 6))[1]


def _store(open_store: OpenStore, make_config: MakeConfig, **overrides: object) -> Store:
    store = open_store(make_config(flush_mode=FlushMode.SYNC, **overrides))
    if T not in {t.name for t in store.topic_admin.listing()}:
        store.create_topic(T, 2)
    return store


def test_the_schedule_of_checks_and_exhaustion(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    txns = _store(open_store, make_config).transactions
    txns.stage("plain", T, [(0, _batch(1))])  # no group: never checked
    txns.stage("t", T, [(0, _batch(2)), (1, _batch(1))], group="orders-svc")
    [info] = [i for i in txns.list_open() if i.txn_id == "t"]
    start = info.next_check_ms - txns.config.check_after_ms
    assert (info.group, info.checks) == ("orders-svc", 0)
    assert txns.due_checks(start + 999, POLICY) == []
    [due] = txns.due_checks(start + 1_000, POLICY)
    assert (due.txn_id, due.group, due.checks, due.queues) == (
        "t",
        "orders-svc",
        0,
        {(T, 0): 2, (T, 1): 1},
    )
    now = start + 1_000
    for n in (1, 2, 3):
        assert txns.record_check("t", n, "none", now)
        assert txns.due_checks(now + 1_999, POLICY) == []
        now += 2_000
    assert txns.due_checks(now, POLICY) == []  # exhausted: no fourth check
    assert [d.txn_id for d in txns.exhausted(now, POLICY)] == ["t"]
    keep = CheckPolicy(1_000, 2_000, 3, "keep")
    assert txns.exhausted(now, keep) == []
    assert not txns.record_check("nope", 1, "none", now)


def test_a_transaction_group_is_fixed_by_its_first_stage(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    txns = _store(open_store, make_config).transactions
    txns.stage("t", T, [(0, _batch(1))], group="a")
    txns.stage("t", T, [(0, _batch(1))])  # no group named: fine
    with pytest.raises(PreconditionFailed, match="belongs to group 'a', not to group 'b'"):
        txns.stage("t", T, [(0, _batch(1))], group="b")


def test_the_count_survives_a_crash(open_store: OpenStore, make_config: MakeConfig) -> None:
    config = make_config(flush_mode=FlushMode.SYNC)
    store = open_store(config)
    store.create_topic(T, 1)
    store.transactions.stage("t", T, [(0, _batch(3))], group="g")
    first = store.transactions.list_open()[0].next_check_ms
    store.transactions.record_check("t", 1, "none", first)
    store.transactions.record_check("t", 2, "unknown", first + 30_000)
    store.flush()
    store.abandon()
    store = open_store(config)
    [info] = store.transactions.list_open()
    assert (info.group, info.checks, info.last_check_ms) == ("g", 2, first + 30_000)
    # the next check is the interval after the last one (the config's 30 s)
    assert info.next_check_ms == first + 60_000


def test_a_replica_counts_checks_and_uncounts_cut_ones(
    open_store: OpenStore, make_config: MakeConfig, tmp_path: Path
) -> None:
    master = _store(open_store, make_config)
    master.transactions.stage("t", T, [(0, _batch(2))], group="g")
    master.transactions.record_check("t", 1, "none", 10_000)
    middle = master.log_end
    master.transactions.record_check("t", 2, "none", 12_000)
    master.flush()  # a replica copies what is durable
    replica_store = open_store(make_config(data_dir=tmp_path / "replica"))
    replica = ReplicaLog(replica_store)
    assert replica.append(0, master.read_log(0, 1 << 20).data) == master.log_end
    [info] = replica_store.transactions.list_open()
    assert (info.txn_id, info.group, info.checks, info.last_check_ms) == ("t", "g", 2, 12_000)
    replica.truncate(middle)  # the second check record is gone
    [info] = replica_store.transactions.list_open()
    assert (info.checks, info.last_check_ms) == (1, 10_000)


def test_check_settings_are_validated() -> None:
    with pytest.raises(InvalidArgument, match="check_exhausted"):
        TransactionConfig(check_exhausted="maybe")


def test_a_check_answer_ends_only_a_checked_transaction_of_its_group(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    txns = _store(open_store, make_config).transactions
    txns.stage("plain", T, [(0, _batch(1))])
    txns.stage("mine", T, [(0, _batch(2))], group="g")
    txns.stage("theirs", T, [(1, _batch(1))], group="h")
    for txn_id, group, why in (
        ("plain", "g", "no producer group"),
        ("theirs", "g", "belongs to group 'h'"),
        ("mine", "g", "never checked"),
        ("gone", "g", "not open"),
    ):
        for commit in (True, False):
            with pytest.raises(NotFound, match=why):
                txns.resolve_checked(txn_id, group, commit)
    txns.record_check("mine", 1, "unknown")
    txns.record_check("theirs", 1, "unknown")
    with pytest.raises(NotFound, match="belongs to group 'g'"):
        txns.resolve_checked("mine", "h", True)
    result = txns.resolve_checked("mine", "g", True)
    assert [(q.queue_id, q.count) for q in result.queues] == [(0, 2)]
    assert txns.resolve_checked("theirs", "h", False).aborted == 1
    with pytest.raises(NotFound, match="it was committed"):
        txns.resolve_checked("mine", "g", False)
    assert [i.txn_id for i in txns.list_open()] == ["plain"]
    # The producer's own commit after the check's: done already, not an error.
    assert txns.commit([("mine", 2)]).already_committed
    with pytest.raises(NotFound, match="it was aborted"):
        txns.commit([("theirs", 1)])
    assert txns.abort(["theirs"]) == 0


def test_a_cut_of_every_remembered_check_keeps_the_older_ones() -> None:
    staged = StagedTxn(1, "t", 0, 0, group="g")
    for n in range(1, _CHECK_LOG + 11):  # more checks than are remembered
        staged.checked(n * 100, n, n * 1_000)
    staged.cut(0)  # every remembered record is cut; the 10 before them are not
    assert (staged.checks, staged.last_check_ms) == (10, 11_000)
    staged = StagedTxn(2, "u", 0, 0, group="g")
    staged.checked(100, 1, 1_000)
    staged.cut(50)
    assert (staged.checks, staged.last_check_ms) == (0, 0)
