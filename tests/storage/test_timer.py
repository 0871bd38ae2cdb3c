"""Delayed delivery at the storage level (storage/timer/): real stores, real files.

Deliveries are driven by ``Store.deliver_due(now_ms)`` (what the timer thread
runs every tick), so "not before its time" is checked against a given clock.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from crc32c import crc32c

from equeue_broker.storage import (
    FlushMode,
    InvalidArgument,
    MessageBatch,
    NotFound,
    RetentionConfig,
    Store,
)
from equeue_broker.storage.config import TimerConfig
from equeue_broker.storage.producers.table import Idempotence
from equeue_broker.storage.timer.timer_records import (
    Cancel,
    Deliver,
    decode_value,
    encode_value,
)
from equeue_broker.storage.timer.wheel import CANCEL_BIT, ENTRY, ENTRY_SIZE, Wheel, topic_id
from equeue_broker.storage.txn.txn_recovery import TxnScan
from equeue_proto.accel import CODEC
from tests.conftest import MakeConfig
from tests.support.faults import simulate_machine_crash

OpenStore = Callable[..., Store]


def now_ms() -> int:
    return int(time.time() * 1000)


def values(store: Store, topic: str = "t", queue_id: int = 0) -> list[bytes]:
    return [m.value for m in store.read(topic, queue_id, 0, max_messages=10_000).messages]


def wait_for(store: Store, done: Callable[[], bool], timeout_s: float) -> bool:
    """Wait until ``done()``, checked whenever the store makes records readable
    (its listener: what a delivery does), for at most ``timeout_s``."""
    changed = threading.Condition()

    def listener(topic: str, queue_id: int, end: int) -> None:
        with changed:
            changed.notify_all()

    store.add_listener(listener)
    with changed:
        return changed.wait_for(done, timeout_s)


def deliver_all(store: Store, at_ms: int) -> int:
    total = 0
    while n := store.delivery.deliver_due(at_ms):
        total += n
    return total


def test_control_records_round_trip() -> None:
    deliver = Deliver((10, 20), ((("t", 1), 5, 2),), (1_000, 20), (900, 3))
    cancel = Cancel(42, 123_456)
    for control in (deliver, cancel):
        assert decode_value(*encode_value(control)) == control


def test_delivered_in_due_order_never_before(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    now = now_ms()
    late = store.append("t", 0, MessageBatch([b"c"]), deliver_at_ms=[now + 3000])
    store.append("t", 0, MessageBatch([b"a", b"b"]), deliver_at_ms=[now + 1000, now + 2000])
    store.append("t", 0, MessageBatch([b"plain"]))
    assert late.first_offset == -1 and late.deliver_at_ms == (now + 3000,)
    assert store.delivery.deliver_due(now + 999) == 0
    assert values(store) == [b"plain"]
    assert store.delayed_summary() == (3, now + 1000)
    assert store.delivery.deliver_due(now + 1000) == 1
    assert values(store) == [b"plain", b"a"]
    assert deliver_all(store, now + 2999) == 1
    assert store.delayed_summary("t") == (1, now + 3000)
    assert deliver_all(store, now + 60_000) == 1
    assert values(store) == [b"plain", b"a", b"b", b"c"]
    assert store.delayed_summary() == (0, None)
    # The message id (log position) still resolves, now with its offset.
    found = store.reads.read_at_position(late.positions()[0])
    assert (found.value, found.queue_offset) == (b"c", 3)


def test_a_time_in_the_past_is_due_at_once(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    now = now_ms()
    store.append("t", 0, MessageBatch([b"x"]), deliver_at_ms=[now + 500])
    assert store.delivery.deliver_due(now + 600) == 1
    past = store.append("t", 0, MessageBatch([b"y"]), deliver_at_ms=[now - 60_000])
    assert past.deliver_at_ms[0] >= now - 60_000  # raised to the watermark
    assert store.delivery.deliver_due(now + 700) == 1
    assert values(store) == [b"x", b"y"]


def test_bad_times_are_refused_naming_the_value(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    now = now_ms()
    far = now + 8 * 24 * 3600 * 1000
    with pytest.raises(InvalidArgument, match=f"{far}.*max_delay_ms"):
        store.append("t", 0, MessageBatch([b"x"]), deliver_at_ms=[far])
    old = now - 24 * 3600 * 1000
    with pytest.raises(InvalidArgument, match=f"{old}.*past_tolerance_ms"):
        store.append("t", 0, MessageBatch([b"x"]), deliver_at_ms=[old])
    with pytest.raises(InvalidArgument, match="2 delivery times for 3 messages"):
        store.append("t", 0, MessageBatch([b"x", b"y", b"z"]), deliver_at_ms=[now, now])
    assert store.delayed_summary() == (0, None)


def test_cancel(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 2)
    now = now_ms()
    result = store.append("t", 1, MessageBatch([b"a", b"b"]), deliver_at_ms=[now + 1000])
    gone = store.cancel_delayed(result.positions()[0])
    assert (gone.topic, gone.queue_id, gone.deliver_at_ms) == ("t", 1, now + 1000)
    with pytest.raises(NotFound, match="no pending delayed message"):
        store.cancel_delayed(result.positions()[0])
    with pytest.raises(NotFound):
        store.cancel_delayed(result.positions()[0] + 3)  # not a record boundary
    assert store.delayed_summary("t") == (1, now + 1000)
    assert deliver_all(store, now + 2000) == 1
    assert values(store, "t", 1) == [b"b"]
    with pytest.raises(NotFound):
        store.cancel_delayed(result.positions()[1])  # delivered already


def test_idempotent_repeat_returns_the_original_positions(open_store: OpenStore) -> None:
    store = open_store()
    store.create_topic("t", 1)
    pid, epoch = store.init_producer(0)
    now = now_ms()
    batch = MessageBatch([b"a", b"b"])
    first = store.append("t", 0, batch, Idempotence(pid, epoch, 0), deliver_at_ms=[now + 100])
    again = store.append("t", 0, batch, Idempotence(pid, epoch, 0), deliver_at_ms=[now + 100])
    assert again.duplicate and again.positions() == first.positions()
    assert again.deliver_at_ms == first.deliver_at_ms
    assert store.delayed_summary() == (2, now + 100)
    assert deliver_all(store, now + 1000) == 2
    assert values(store) == [b"a", b"b"]


def _spread(store: Store, now: int, count: int, name: str = "m") -> dict[bytes, int]:
    """``count`` delayed messages due over 0..count/10 s; value -> due."""
    due: dict[bytes, int] = {}
    for i in range(0, count, 10):
        batch = [f"{name}{j}".encode() for j in range(i, i + 10)]
        times = [now + 1000 + (j * 7919 % count) * 100 for j in range(i, i + 10)]
        store.append("t", i // 10 % 2, MessageBatch(batch), deliver_at_ms=times)
        due.update(zip(batch, times, strict=True))
    return due


def _check_exactly_once(store: Store, due: dict[bytes, int], ordered: bool = True) -> None:
    seen = values(store, "t", 0) + values(store, "t", 1)
    assert sorted(seen) == sorted(due)
    for queue_id in (0, 1) if ordered else ():  # in due order within a queue
        times = [due[v] for v in values(store, "t", queue_id)]
        assert times == sorted(times)


def test_survives_close_and_reopen(open_store: OpenStore, make_config: MakeConfig) -> None:
    config = make_config()
    store = open_store(config)
    store.create_topic("t", 2)
    now = now_ms()
    due = _spread(store, now, 300)
    deliver_all(store, now + 10_000)
    delivered = len(values(store, "t", 0) + values(store, "t", 1))
    assert 0 < delivered < 300
    store.close()
    store = open_store(config)
    assert store.delayed_summary()[0] == 300 - delivered
    assert store.delivery.deliver_due(now + 10_000) == 0  # nothing twice
    deliver_all(store, now + 100_000)
    _check_exactly_once(store, due)
    assert store.delayed_summary() == (0, None)


@pytest.mark.parametrize("mode", [FlushMode.ASYNC, FlushMode.SYNC])
def test_crash_without_checkpoint_delivers_each_once(
    open_store: OpenStore, make_config: MakeConfig, mode: FlushMode
) -> None:
    config = make_config(flush_mode=mode)
    store = open_store(config)
    store.create_topic("t", 2)
    now = now_ms()
    due = _spread(store, now, 200)
    deliver_all(store, now + 5_000)
    store.flush()  # a checkpoint in the middle
    due.update(_spread(store, now, 200, "n"))
    deliver_all(store, now + 12_000)
    doomed = store.append("t", 0, MessageBatch([b"x"]), deliver_at_ms=[now + 50_000])
    store.cancel_delayed(doomed.positions()[0])
    if mode is FlushMode.SYNC:
        simulate_machine_crash(store)
    else:
        store.abandon()
    store = open_store(config)
    deliver_all(store, now + 100_000)
    # Not in due order: records added after a delivery past their time are
    # due at once (raised to the watermark).
    _check_exactly_once(store, due, ordered=False)
    assert store.delayed_summary() == (0, None)


def _replica(make_config: MakeConfig, name: str) -> Store:
    config = make_config(data_dir=make_config().data_dir.parent / name)
    replica = Store(config, background=False, delivering=False)
    replica.create_topic("t", 2)
    return replica


def _copy(master: Store, replica: Store, scan: TxnScan, until: int | None = None) -> None:
    """What replication does: the master's log bytes, appended at their positions."""
    stop = master.log_end if until is None else until
    while replica.log_end < stop:
        piece = master.read_log(replica.log_end, stop - replica.log_end)
        assert piece.data and piece.position == replica.log_end
        replica.append_at(piece.position, piece.data, scan)


def _scan(replica: Store) -> TxnScan:
    return TxnScan(1, {}, False, replica.epochs, replica.producers)


def test_replica_holds_the_same_pending_and_deliveries(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    master = open_store()
    master.create_topic("t", 2)
    now = now_ms()
    due = _spread(master, now, 100)
    deliver_all(master, now + 4_000)
    cancelled = master.append("t", 1, MessageBatch([b"c"]), deliver_at_ms=[now + 9_000])
    master.cancel_delayed(cancelled.positions()[0])
    replica = _replica(make_config, "replica")
    try:
        scan = _scan(replica)
        _copy(master, replica, scan)
        assert replica.delayed_summary() == master.delayed_summary()
        assert replica.delayed_summary("t") == master.delayed_summary("t")
        assert replica.delivery.deliver_due(now + 100_000) == 0  # a replica never delivers
        for queue_id in (0, 1):
            assert values(replica, "t", queue_id) == values(master, "t", queue_id)
        deliver_all(master, now + 100_000)
        _copy(master, replica, scan)
        for queue_id in (0, 1):
            assert values(replica, "t", queue_id) == values(master, "t", queue_id)
        _check_exactly_once(replica, due)
        assert replica.delayed_summary() == (0, None)
    finally:
        replica.close()


def test_truncate_undoes_a_delivery(open_store: OpenStore, make_config: MakeConfig) -> None:
    master = open_store()
    master.create_topic("t", 2)
    now = now_ms()
    due = _spread(master, now, 100)
    cut = master.log_end
    before = master.delayed_summary()
    deliver_all(master, now + 6_000)
    replica = _replica(make_config, "replica")
    try:
        scan = _scan(replica)
        _copy(master, replica, scan)
        assert replica.delayed_summary() == master.delayed_summary() != before
        replica.truncate(cut, scan)
        assert replica.delayed_summary() == before
        assert values(replica, "t", 0) == values(replica, "t", 1) == []
        # Promoted: it delivers everything once itself, and again after a restart.
        replica.set_delivering(True)
        deliver_all(replica, now + 100_000)
        _check_exactly_once(replica, due)
        config = replica.config
        replica.close()
        replica = Store(config, background=False)
        assert replica.delayed_summary() == (0, None)
        assert replica.delivery.deliver_due(now + 200_000) == 0
        _check_exactly_once(replica, due)
    finally:
        replica.close()


def test_retention_keeps_a_chunk_with_a_pending_record(make_config: MakeConfig) -> None:
    config = make_config(retention=RetentionConfig(max_chunks=1, max_age_ms=None))
    store = Store(config, background=False)
    try:
        store.create_topic("t", 1)
        now = now_ms()
        store.append("t", 0, MessageBatch([b"later"]), deliver_at_ms=[now + 1000])
        for _ in range(20):
            store.append("t", 0, MessageBatch([b"x" * 500] * 40))
        store.apply_retention()
        assert store.log_start == 0
        assert deliver_all(store, now + 2000) == 1
        assert store.read("t", 0, 800).messages[0].value == b"later"
        for _ in range(20):  # the split of its queue's offsets moves past the old chunks
            store.append("t", 0, MessageBatch([b"x" * 500] * 40))
        store.apply_retention()
        assert store.log_start > 0
    finally:
        store.close()


def test_the_timer_thread_delivers(open_store: OpenStore, make_config: MakeConfig) -> None:
    store = open_store(make_config(), background=True)
    store.create_topic("t", 1)
    store.append("t", 0, MessageBatch([b"soon"]), deliver_at_ms=[now_ms() + 200])
    assert wait_for(store, lambda: store.queue_info("t", 0).end == 1, 30)
    assert values(store) == [b"soon"]


@pytest.mark.parametrize("damage", ["lost", "torn tail"])
def test_a_damaged_timer_index_is_rebuilt(
    open_store: OpenStore, make_config: MakeConfig, damage: str
) -> None:
    config = make_config()
    store = open_store(config)
    store.create_topic("t", 2)
    now = now_ms()
    due = _spread(store, now, 100)
    deliver_all(store, now + 4_000)
    store.close()
    directory = config.data_dir / "timer"
    if damage == "lost":
        for path in directory.iterdir():
            path.unlink()
    else:  # garbage past what the checkpoint counts, as a power loss may leave
        (segment,) = directory.glob("*.tlog")
        with segment.open("ab") as f:
            f.write(b"\xff" * 100)
    store = open_store(config)
    assert store.delayed_summary()[0] == 100 - len(values(store, "t", 0) + values(store, "t", 1))
    deliver_all(store, now + 100_000)
    _check_exactly_once(store, due)
    assert store.delayed_summary() == (0, None)


def test_timer_index_format_round_trip(tmp_path: Path) -> None:
    """Entries written, made durable at a checkpoint, read back after a reopen
    (the chain of a slot, newest first; a cancel kills older adds)."""
    directory = tmp_path / "timer"
    wheel = Wheel(directory, None)
    second = 1_800_000_000
    wheel.add([(second * 1000 + 5, 100, topic_id("t")), (second * 1000 + 7, 200, 1)])
    wheel.add([(second * 1000 + 5, 100, topic_id("t"))], cancel=True)
    count, dirty = wheel.take_dirty()
    wheel.write_heads(dirty)
    wheel.written(dirty)
    wheel.close()
    raw = (directory / "000000000.tlog").read_bytes()
    assert len(raw) == 3 * ENTRY_SIZE
    due, target, prev, topic, crc = ENTRY.unpack_from(raw, 2 * ENTRY_SIZE)
    assert (due, target, prev, topic) == (second * 1000 + 5, 100 | CANCEL_BIT, 2, topic_id("t"))
    assert crc == crc32c(raw[2 * ENTRY_SIZE : 2 * ENTRY_SIZE + 28])
    wheel = Wheel(directory, count, {}, 0)
    try:
        assert wheel.intact and wheel.count == 3
        chain = [(e.due_ms, e.target, e.cancel) for e in wheel.chain(second)]
        assert chain == [(second * 1000 + 5, 100, True), (second * 1000 + 7, 200, False),
                         (second * 1000 + 5, 100, False)]  # fmt: skip
        assert list(wheel.busy_seconds(second - 5, second + 5)) == [second]
    finally:
        wheel.close()


def test_a_restarted_replica_cuts_below_its_checkpoint(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """The cut undoes records the checkpoint's counts hold, and what is copied
    again after the cut is applied again."""
    master = open_store()
    master.create_topic("t", 2)
    now = now_ms()
    due = _spread(master, now, 60)
    cut = master.log_end
    deliver_all(master, now + 3_000)
    replica = _replica(make_config, "replica")
    config = replica.config
    try:
        _copy(master, replica, _scan(replica))
        replica.close()
        replica = Store(config, background=False, delivering=False)  # checkpoint past the cut
        scan = _scan(replica)
        replica.truncate(cut, scan)
        assert replica.delayed_summary()[0] == 60
        _copy(master, replica, scan)  # the same bytes again
        assert replica.delayed_summary() == master.delayed_summary()
        deliver_all(master, now + 100_000)
        _copy(master, replica, scan)
        _check_exactly_once(replica, due)
        assert replica.delayed_summary() == (0, None)
    finally:
        replica.close()


@pytest.mark.timeout(120)
def test_appends_racing_the_timer_thread(open_store: OpenStore, make_config: MakeConfig) -> None:
    """Writers append delayed records (some due at once) while the timer thread
    delivers and a cancel runs: each delivered once, cancelled ones never."""
    store = open_store(make_config(timer=TimerConfig(tick_ms=5, max_deliver_batch=7)), True)
    store.create_topic("t", 2)
    now = now_ms()
    cancelled: set[bytes] = set()

    def write(queue_id: int) -> None:
        for i in range(150):
            value = f"{queue_id}-{i}".encode()
            due = now - 1000 if i % 3 == 0 else now_ms() + i % 7 * 40
            result = store.append("t", queue_id, MessageBatch([value]), deliver_at_ms=[due])
            if i % 25 == 1:
                with contextlib.suppress(NotFound):  # delivered already: fine
                    store.cancel_delayed(result.positions()[0])
                    cancelled.add(value)

    writers = [threading.Thread(target=write, args=(q,)) for q in (0, 1)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert wait_for(store, lambda: store.delayed_summary()[0] == 0, 60)
    assert store.delayed_summary() == (0, None)
    seen = values(store, "t", 0) + values(store, "t", 1)
    expected = {f"{q}-{i}".encode() for q in (0, 1) for i in range(150)} - cancelled
    assert sorted(seen) == sorted(expected)


def test_timer_log_is_compacted_past_a_far_future_record(
    open_store: OpenStore, make_config: MakeConfig
) -> None:
    """A record due in 6 days would keep its timer log segment, and every later
    one, until then: its entry is copied forward and old segments go."""
    config = make_config(timer=TimerConfig(segment_entries=64))
    store = open_store(config)
    store.create_topic("t", 1)
    now = now_ms()
    far = now + 6 * 24 * 3600 * 1000
    kept = store.append("t", 0, MessageBatch([b"far"]), deliver_at_ms=[far])
    for i in range(40):
        store.append("t", 0, MessageBatch([b"x"] * 50), deliver_at_ms=[now + 1000 + i])
        deliver_all(store, now + 2000)
        store.flush()
    segments = sorted((config.data_dir / "timer").glob("*.tlog"))
    assert len(segments) <= 8  # of 2,001 entries in 64-entry segments
    assert segments[0].name != "000000000.tlog"
    store.close()
    store = open_store(config)
    assert store.delayed_summary() == (1, far)
    assert store.cancel_delayed(kept.positions()[0]).deliver_at_ms == far
    assert store.delayed_summary() == (0, None)
    assert values(store) == [b"x"] * 2000


@pytest.mark.skipif(CODEC is None, reason="the C codec is not built")
def test_c_timer_entries_are_the_reference_ones(tmp_path: Path) -> None:
    dues = [1_800_000_000_123, 1_800_000_000_999, 1_800_000_001_000, 1_800_000_000_500]
    targets = [64, 128, 4096, 1 << 40]
    built: list[object] = []
    for name in ("c", "python"):
        wheel = Wheel(tmp_path / name, None)
        try:
            wheel.add([(dues[0], 7, 5)])  # a head to chain to
            if name == "c":
                wheel.add_topic(dues, targets, 99)
            else:
                wheel.add([(d, t, 99) for d, t in zip(dues, targets, strict=True)])
            chains = [wheel.chain(second) for second in (1_800_000_000, 1_800_000_001)]
            built.append((wheel.count, wheel.take_dirty()[1], chains))
        finally:
            wheel.close()
        built.append((tmp_path / name / "000000000.tlog").read_bytes())
    assert built[:2] == built[2:]


@pytest.mark.parametrize("stop", ["close", "crash"])
def test_hidden_and_deleted_queues(
    open_store: OpenStore, make_config: MakeConfig, stop: str
) -> None:
    """A queue hidden from producers still gets its delayed records; a deleted
    topic's are dropped at their time (counted no more), also after a reopen."""
    config = make_config()
    store = open_store(config)
    store.create_topic("t", 1)
    store.create_topic("gone", 1)
    now = now_ms()
    store.append("t", 0, MessageBatch([b"h"]), deliver_at_ms=[now + 100])
    store.append("gone", 0, MessageBatch([b"g"]), deliver_at_ms=[now + 100])
    store.topic_admin.set_queue_visibility("t", 0, producer=False)
    store.topic_admin.delete_topic("gone")
    assert store.delayed_summary() == (2, now + 100)
    assert deliver_all(store, now + 1000) == 2
    assert values(store) == [b"h"]
    assert store.delayed_summary() == (0, None)
    if stop == "close":
        store.close()
    else:
        store.abandon()  # the deliver record is after the checkpoint
    store = open_store(config)
    assert store.delayed_summary() == (0, None)
    assert values(store) == [b"h"]


@pytest.mark.parametrize("stop", ["close", "abandon"])
def test_a_topic_created_again_gets_none_of_its_predecessors_records(
    open_store: OpenStore, make_config: MakeConfig, stop: str
) -> None:
    """Records sent to a topic that was deleted and created again while they
    waited are dropped at their time (not delivered into the new topic),
    while the new topic's own are delivered, in the same deliver record;
    a reopen derives the same."""
    config = make_config()
    store = open_store(config)
    store.create_topic("t", 1)
    now = now_ms()
    store.append("t", 0, MessageBatch([b"old"]), deliver_at_ms=[now + 100])
    store.topic_admin.delete_topic("t")
    store.create_topic("t", 1)
    store.append("t", 0, MessageBatch([b"new"]), deliver_at_ms=[now + 100])
    assert deliver_all(store, now + 1000) == 2
    assert values(store) == [b"new"]
    assert store.delayed_summary() == (0, None)
    if stop == "close":
        store.close()
    else:
        store.abandon()  # the deliver record is after the checkpoint: derived again
    store = open_store(config)
    assert values(store) == [b"new"]
    assert store.delayed_summary() == (0, None)


def test_next_due_of_a_crowded_second_is_its_start(open_store: OpenStore) -> None:
    """Stats must not walk a second holding millions (they run under the
    engine lock): past a budget of entries the next due time is the start of
    its second, a lower bound within the timer's one-second precision."""
    store = open_store()
    store.create_topic("t", 1)
    store.create_topic("u", 1)
    due = now_ms() + 3_600_000 // 1000 * 1000 + 700  # 700 ms into its second
    for _ in range(5):
        store.append("t", 0, MessageBatch([b"x"] * 1000), deliver_at_ms=[due])
    store.append("u", 0, MessageBatch([b"y"]), deliver_at_ms=[due + 5])
    start = due // 1000 * 1000
    assert store.delayed_summary() == (5001, start)
    assert store.delayed_summary("u") == (1, start)
    store.create_topic("few", 1)
    store.append("few", 0, MessageBatch([b"z"]), deliver_at_ms=[due - 600_000])
    assert store.delayed_summary("few") == (1, due - 600_000)  # exact when cheap
