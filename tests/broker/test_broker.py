"""The broker as a real process, driven through the Python client."""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client import (
    Admin,
    AlreadyExistsError,
    ClientConfig,
    Consumer,
    InvalidRequest,
    LimitError,
    Message,
    NotFoundError,
    PreconditionError,
    Producer,
    SendResult,
    read_range,
)
from equeue_spark.client.records import decode_records
from tests.support.waits import wait_for

StartBroker = Callable[..., BrokerProcess]


@pytest.fixture
def stub(broker: BrokerProcess) -> Iterator[pb_grpc.BrokerStub]:
    with grpc.insecure_channel(broker.address) as channel:
        yield pb_grpc.BrokerStub(channel)


def pull_all(stub: pb_grpc.BrokerStub, topic: str, queue_id: int, start: int = 0) -> list[Message]:
    out: list[Message] = []
    offset = start
    for _ in range(10_000):
        reply = stub.Pull(
            pb.PullRequest(topic=topic, queue_id=queue_id, offset=offset, max_messages=500),
            timeout=10,
        )
        out += decode_records(reply.records, reply.broker_id)
        if reply.next_offset >= reply.end_offset:
            return out
        offset = reply.next_offset
    raise AssertionError("pull loop did not reach the end")


def test_produce_pull_round_trip_over_many_queues(
    broker: BrokerProcess, stub: pb_grpc.BrokerStub
) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("wide", queues=16)
        sent: list[SendResult] = []
        for round_ in range(5):
            values = [f"r{round_}-m{i}".encode() for i in range(64)]
            sent += producer.send_batch("wide", values, queue_ids=[i % 16 for i in range(64)])
        for queue_id in range(16):
            got = pull_all(stub, "wide", queue_id)
            expected = [r for r in sent if r.queue_id == queue_id]
            assert (
                [m.offset for m in got]
                == list(range(len(expected)))
                == [r.offset for r in expected]
            )
            assert [m.message_id for m in got] == [r.message_id for r in expected]
            assert all(m.value.startswith(b"r") for m in got)
        assert sum(q.end_offset for q in admin.describe_topic("wide").queues) == 5 * 64


def test_key_routing_is_stable(broker: BrokerProcess) -> None:
    with Producer(broker.address) as producer:
        keys = [f"customer-{i % 10}".encode() for i in range(200)]
        first = producer.send_batch("routed", [b"x"] * 200, keys=keys)
        second = producer.send_batch("routed", [b"y"] * 200, keys=keys)
    by_key: dict[bytes, set[int]] = {}
    for key, result in zip(keys + keys, [*first, *second], strict=True):
        by_key.setdefault(key, set()).add(result.queue_id)
    assert all(len(queues) == 1 for queues in by_key.values())
    assert len({q for queues in by_key.values() for q in queues}) > 1  # spread over queues


def test_long_poll_is_answered_right_after_a_produce(
    broker: BrokerProcess, stub: pb_grpc.BrokerStub
) -> None:
    """A parked pull returns within 50 ms of the produce that feeds it (best of 3,
    so one scheduling hiccup on a loaded machine does not fail the suite)."""
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("poll", queues=1)
        delays = []
        for attempt in range(3):
            request = pb.PullRequest(topic="poll", queue_id=0, offset=attempt, max_wait_ms=10_000)
            future = stub.Pull.future(request, timeout=20)
            arrived = threading.Event()
            future.add_done_callback(functools.partial(_set, arrived))
            assert not arrived.wait(0.2), "the pull should be parked: nothing to read yet"
            producer.send_batch("poll", [b"wake up %d" % attempt])
            acked = time.monotonic()
            assert arrived.wait(10), "the parked pull was never answered"
            delays.append(time.monotonic() - acked)
            reply = future.result()
            assert [m.value for m in decode_records(reply.records, reply.broker_id)] == [
                b"wake up %d" % attempt
            ]
        assert min(delays) < 0.05, f"parked pulls answered {delays} s after the produce"


def _set(event: threading.Event, _future: object) -> None:
    event.set()


def test_long_poll_times_out_empty(broker: BrokerProcess, stub: pb_grpc.BrokerStub) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("quiet", queues=1)
    started = time.monotonic()
    reply = stub.Pull(
        pb.PullRequest(topic="quiet", queue_id=0, offset=0, max_wait_ms=300), timeout=10
    )
    assert reply.count == 0 and reply.next_offset == 0
    assert time.monotonic() - started >= 0.29


def test_tag_filter_skips_a_long_run_and_advances(
    broker: BrokerProcess, stub: pb_grpc.BrokerStub
) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("tagged", queues=1)
        producer.send_batch("tagged", [b"noise"] * 5000, tags=["noise"] * 5000)
        producer.send_batch("tagged", [b"signal"], tags=["wanted"])
    reply = stub.Pull(
        pb.PullRequest(topic="tagged", queue_id=0, offset=0, tags=["wanted", "other"]), timeout=10
    )
    assert [(m.offset, m.value) for m in decode_records(reply.records, reply.broker_id)] == [
        (5000, b"signal")
    ]
    assert reply.next_offset == 5001
    none = stub.Pull(pb.PullRequest(topic="tagged", queue_id=0, offset=0, tags=["x"]), timeout=10)
    assert none.count == 0 and none.next_offset == 5001  # skipped, not stuck at 0


class _GroupRun:
    """Consumers of one group, each polling and committing in its own thread,
    recording which member got each (queue, offset)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.lock = threading.Lock()
        self.seen: dict[tuple[int, int], str] = {}
        self.doubles: list[str] = []
        self.errors: list[BaseException] = []
        self.workers: dict[str, tuple[Consumer, threading.Event, threading.Thread]] = {}
        self.marks: dict[str, int] = {}

    def join(self, name: str) -> Consumer:
        consumer = Consumer(
            self.address, group="workers", topics=["jobs"], start="earliest",
            heartbeat_interval_s=0.2, consumer_id=name, max_wait_ms=100,
        )  # fmt: skip
        stop = threading.Event()
        thread = threading.Thread(target=self._work, args=(consumer, stop), name=name)
        self.workers[name] = (consumer, stop, thread)
        thread.start()
        return consumer

    def _work(self, consumer: Consumer, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                for m in consumer.poll(0.1):
                    key = (m.queue_id, m.offset)
                    with self.lock:
                        if key in self.seen:
                            self.doubles.append(
                                f"{key}: {self.seen[key]} and {consumer.consumer_id}"
                            )
                        self.seen.setdefault(key, consumer.consumer_id)
                consumer.commit()  # everything polled is committed before leaving
        except BaseException as exc:  # reported by the test thread
            self.errors.append(exc)
        finally:
            consumer.close()

    def leave(self, name: str) -> None:
        _, stop, thread = self.workers.pop(name)
        stop.set()
        thread.join(30)
        assert not thread.is_alive()

    def consumed_by(self, name: str) -> int:
        with self.lock:
            return sum(1 for v in self.seen.values() if v == name)

    def consumed_more(self, name: str, count: int) -> bool:
        """True once ``name`` consumed ``count`` more messages than at the first call."""
        now = self.consumed_by(name)
        start = self.marks.setdefault(name, now)
        return now >= start + count

    def settled(self, queues: int) -> bool:
        """Every queue held by exactly one live member, all members agreeing."""
        consumers = [c for c, _, _ in self.workers.values()]
        owned = [q for c in consumers for q in c.assignment()]
        members = {tuple(c.members()) for c in consumers}
        return len(owned) == queues == len(set(owned)) and members == {tuple(sorted(self.workers))}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_group_rebalances_1_3_2_without_double_consumption(
    broker_factory: StartBroker, seed: int
) -> None:
    """Members join and leave while a producer keeps producing: the broker hands
    each queue to one member at a time, so no message reaches two members."""
    broker = broker_factory()  # default 30 s consumer timeout: leaving must be explicit
    rng = random.Random(seed)
    # The seed orders the members (who sorts first gets the bigger ranges) and the batches.
    names = [f"c{n}" for n in rng.sample(range(1, 10), 3)]
    produced = [0]
    stop_producing = threading.Event()
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("jobs", queues=6)

        def produce() -> None:
            while not stop_producing.wait(0.002):  # a steady trickle, not a backlog
                n = rng.randint(1, 12)
                producer.send_batch("jobs", [b"job"] * n, queue_ids=[i % 6 for i in range(n)])
                produced[0] += n

        writer = threading.Thread(target=produce)
        writer.start()
        run = _GroupRun(broker.address)
        try:
            run.join(names[0])
            wait_for("the first member consuming", lambda: run.consumed_by(names[0]) > 100)
            run.join(names[1])
            run.join(names[2])
            wait_for("three members sharing the queues", lambda: run.settled(6))
            for name in names:
                wait_for(f"{name} consuming", functools.partial(run.consumed_more, name, 20))
            run.leave(names[2])  # leaves the group at once
            wait_for("two members sharing the queues", lambda: run.settled(6))
            mark = len(run.seen)
            wait_for("the pair consuming", lambda: len(run.seen) > mark + 100)
        finally:
            stop_producing.set()
            writer.join(30)
        wait_for("everything consumed", lambda: len(run.seen) >= produced[0])
        for name in list(run.workers):
            run.leave(name)
        assert not run.errors, run.errors
        assert run.doubles == []
        assert len(run.seen) == produced[0]
        assert admin.describe_group("workers").total_lag == 0
        assert set(run.seen.values()) == set(names)


def test_sigkill_mid_produce_in_sync_mode_loses_nothing_acknowledged(
    broker_factory: StartBroker, tmp_path: Path
) -> None:
    data_dir = tmp_path / "durable"
    broker = broker_factory("--flush", "sync", data_dir=data_dir)
    config = ClientConfig(broker=broker.address, retries=0, timeout_s=5)
    acked: list[tuple[int, int, bytes]] = []
    stop = threading.Event()
    errors: list[Exception] = []

    def produce() -> None:
        with Producer(config=config) as producer:
            for batch in range(100_000):
                if stop.is_set():
                    return
                values = [f"b{batch}-m{i}".encode() for i in range(50)]
                try:
                    results = producer.send_batch("durable", values, queue_ids=[batch % 3] * 50)
                except Exception as exc:  # the broker died under us
                    errors.append(exc)
                    return
                acked.extend(
                    (r.queue_id, r.offset, v) for r, v in zip(results, values, strict=True)
                )

    with Admin(broker.address) as admin:
        admin.create_topic("durable", queues=3)
    writer = threading.Thread(target=produce)
    writer.start()
    deadline = time.monotonic() + 30
    while len(acked) < 3000 and time.monotonic() < deadline:
        writer.join(0.01)
    broker.kill()
    stop.set()
    writer.join(30)
    assert len(acked) >= 3000 and errors, "the kill should interrupt a produce"

    restarted = broker_factory("--flush", "sync", data_dir=data_dir)
    with grpc.insecure_channel(restarted.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        stored = {q: pull_all(stub, "durable", q) for q in range(3)}
    for messages in stored.values():
        assert [m.offset for m in messages] == list(range(len(messages)))  # contiguous
        values = [m.value for m in messages]
        assert len(values) == len(set(values))  # nothing duplicated
    for queue_id, offset, value in acked:
        assert stored[queue_id][offset].value == value


def test_every_admin_rpc(broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        info = admin.create_topic("adm", queues=2)
        assert [q.queue_id for q in info.queues] == [0, 1]
        with pytest.raises(AlreadyExistsError, match="'adm'"):
            admin.create_topic("adm")
        assert [t.name for t in admin.list_topics()] == ["adm"]
        assert [q.queue_id for q in admin.add_queues("adm", 2).queues] == [0, 1, 2, 3]
        results = producer.send_batch("adm", [b"a", b"b", b"c"], queue_ids=[3, 3, 3])
        described = admin.describe_topic("adm")
        assert described.queues[3].end_offset == 3 and described.queues[3].backlog == 3

        with Consumer(broker.address, group="g") as consumer:
            consumer.assign("adm", [3])
            got = []
            for _ in range(20):
                got += consumer.poll(0.2)
                if len(got) == 3:
                    break
            consumer.commit()
        assert admin.list_groups() == ["g"]
        group = admin.describe_group("g")
        assert group.total_lag == 0 and group.queues[3].committed_offset == 3
        reset = admin.reset_offsets("g", "adm", to="earliest")
        assert reset.total_lag == 3
        assert admin.reset_offsets("g", "adm", offsets={3: 2}).queues[3].lag == 1
        assert admin.reset_offsets("g", "adm", to="latest").total_lag == 0
        assert admin.reset_offsets("g", "adm", timestamp_ms=0).queues[3].committed_offset == 0

        assert admin.get_message(results[1].message_id).value == b"b"
        assert admin.get_message_at("adm", 3, 2).value == b"c"
        with pytest.raises(NotFoundError):
            admin.get_message_at("adm", 3, 3)

        hidden = admin.set_queue_visibility("adm", 3, producer=False, consumer=False)
        assert not hidden.queues[3].producer_visible
        with pytest.raises(PreconditionError, match="hidden from producers"):
            producer.send_batch("adm", [b"x"], queue_ids=[3])
        with pytest.raises(PreconditionError, match="unconsumed"):
            admin.reset_offsets("g", "adm", to="earliest")
            admin.delete_queue("adm", 3)
        admin.reset_offsets("g", "adm", to="latest")
        assert [q.queue_id for q in admin.delete_queue("adm", 3).queues] == [0, 1, 2]

        stats = admin.stats()
        assert stats.topics == 1 and stats.queues == 3 and stats.produced_total == 3
        assert stats.consumed_total == 3 and stats.flush_mode == "async" and stats.bytes_on_disk > 0
        # Queue 3 is gone, and its counters with it (the totals keep them).
        assert [(c.topic, c.queue_id, c.produced, c.consumed) for c in stats.queue_counters] == []
        admin.delete_group("g")
        assert admin.list_groups() == []
        admin.delete_topic("adm")
        assert admin.list_topics() == []


def test_offset_lookups_and_group_commits(broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("look", queues=2)
        producer.send_batch("look", [b"a" * 10, b"b" * 500, b"c"], queue_ids=[1, 1, 1])
        before = time.time_ns() // 1_000_000
        queues = admin.list_offsets("look")
        assert [(q.queue_id, q.earliest_offset, q.end_offset) for q in queues] == [
            (0, 0, 0),
            (1, 0, 3),
        ]
        assert all(q.timestamp_offset == -1 and q.consumer_visible for q in queues)
        assert [q.timestamp_offset for q in admin.list_offsets("look", 0)] == [0, 0]
        assert [q.timestamp_offset for q in admin.list_offsets("look", before + 60_000)] == [0, 3]

        stop, size = admin.offset_for_bytes("look", 1, 0, 3, 100)
        assert stop == 1 and 10 < size < 100
        assert admin.offset_for_bytes("look", 1, 0, 3, 10**6)[0] == 3
        with pytest.raises(InvalidRequest, match="start offset 7"):
            admin.offset_for_bytes("look", 1, 7, 9, 100)
        with pytest.raises(NotFoundError):
            admin.list_offsets("nope")

        admin.commit_offsets("spark", {("look", 1): 2, ("look", 0): 0})
        assert admin.fetch_offsets("spark") == {("look", 0): 0, ("look", 1): 2}
        assert admin.describe_group("spark").total_lag == 1
        with pytest.raises(InvalidRequest, match="offset 9"):
            admin.commit_offsets("spark", {("look", 1): 9})


@pytest.mark.parametrize(
    ("request_", "code", "fragment"),
    [
        (pb.ProduceRequest(topic="../x", messages=pb.MessageColumns(count=1, values=b"v",
                                                                    value_lengths=[1])),
         grpc.StatusCode.INVALID_ARGUMENT, "'../x'"),
        (pb.ProduceRequest(topic="t", messages=pb.MessageColumns(count=0)),
         grpc.StatusCode.INVALID_ARGUMENT, "at least one message"),
        (pb.ProduceRequest(topic="t", messages=pb.MessageColumns(count=1, values=b"v" * 5_000_000,
                                                                 value_lengths=[5_000_000])),
         grpc.StatusCode.RESOURCE_EXHAUSTED, "max_message_bytes"),
        (pb.ProduceRequest(topic="t", messages=pb.MessageColumns(count=2, values=b"vv",
                                                                 value_lengths=[1, 5])),
         grpc.StatusCode.INVALID_ARGUMENT, "value_lengths sum to 6"),
        (pb.ProduceRequest(topic="t", messages=pb.MessageColumns(count=1, values=b"v",
                                                                 value_lengths=[1]),
                           queue_ids=[9]),
         grpc.StatusCode.NOT_FOUND, "no queue 9"),
        (pb.PullRequest(topic="t", queue_id=0, offset=-5),
         grpc.StatusCode.INVALID_ARGUMENT, "-5"),
        (pb.PullRequest(topic="t", queue_id=7, offset=0),
         grpc.StatusCode.NOT_FOUND, "no queue 7"),
        (pb.PullRequest(topic="nope", queue_id=0, offset=0),
         grpc.StatusCode.NOT_FOUND, "'nope'"),
        (pb.PullRequest(topic="t", queue_id=0, offset=0, max_wait_ms=10**8),
         grpc.StatusCode.INVALID_ARGUMENT, "max_wait_ms 100000000"),
        (pb.PullRequest(topic="t", queue_id=0, offset=0, max_messages=10**7),
         grpc.StatusCode.INVALID_ARGUMENT, "max_messages 10000000"),
        (pb.CommitOffsetsRequest(group="g", offsets=[pb.QueueOffset(topic="t", queue_id=0,
                                                                     offset=2**40)]),
         grpc.StatusCode.INVALID_ARGUMENT, "offset 1099511627776"),
        (pb.CommitOffsetsRequest(group="bad group", offsets=[pb.QueueOffset(topic="t")]),
         grpc.StatusCode.INVALID_ARGUMENT, "'bad group'"),
        (pb.HeartbeatRequest(group="g", consumer_id="", topics=["t"]),
         grpc.StatusCode.INVALID_ARGUMENT, "consumer_id"),
    ],
)  # fmt: skip
def test_invalid_requests_get_the_right_status(
    broker: BrokerProcess,
    stub: pb_grpc.BrokerStub,
    request_: object,
    code: grpc.StatusCode,
    fragment: str,
) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("t", queues=1)
    method = {
        pb.ProduceRequest: stub.Produce,
        pb.PullRequest: stub.Pull,
        pb.CommitOffsetsRequest: stub.CommitOffsets,
        pb.HeartbeatRequest: stub.Heartbeat,
    }[type(request_)]
    with pytest.raises(grpc.RpcError) as caught:
        method(request_, timeout=10)  # type: ignore[operator]
    error: grpc.Call = caught.value  # type: ignore[assignment]
    assert error.code() == code
    assert fragment in (error.details() or "")


def test_client_errors_are_typed(broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin:
        with pytest.raises(InvalidRequest, match=r"'\.\./x'"):
            admin.create_topic("../x")
        with pytest.raises(LimitError, match="max_queues_per_topic"):
            admin.create_topic("many", queues=100_000)
        with pytest.raises(NotFoundError, match="'missing'"):
            admin.describe_topic("missing")
        with pytest.raises(InvalidRequest, match="malformed message id"):
            admin.get_message("not-an-id")


def test_sigterm_shuts_down_cleanly(broker_factory: StartBroker, tmp_path: Path) -> None:
    data_dir = tmp_path / "clean"
    broker = broker_factory(data_dir=data_dir)
    with Producer(broker.address) as producer:
        producer.send_batch("kept", [b"one", b"two"])
    assert broker.stop() == 0
    restarted = broker_factory(data_dir=data_dir)
    with Admin(restarted.address) as admin:
        assert sum(q.end_offset for q in admin.describe_topic("kept").queues) == 2


def test_incarnation_is_kept_across_restarts_and_new_on_recreate(
    broker_factory: StartBroker, tmp_path: Path
) -> None:
    data_dir = tmp_path / "incarnation"
    broker = broker_factory(data_dir=data_dir)
    with Admin(broker.address) as admin:
        created = admin.create_topic("born", queues=2).incarnation
        assert created > 0 and admin.describe_topic("born").incarnation == created
        listed = admin.list_topic_offsets("born")
        assert listed.incarnation == created and len(listed.queues) == 2
    assert broker.stop() == 0
    broker = broker_factory(data_dir=data_dir)
    with Admin(broker.address) as admin:
        assert [t.incarnation for t in admin.list_topics()] == [created]
        admin.delete_topic("born")
        reborn = admin.create_topic("born", queues=2).incarnation
        assert reborn not in (0, created)
        assert admin.list_topic_offsets("born").incarnation == reborn


def test_producer_lingers_and_batches(broker: BrokerProcess) -> None:
    # Pauses in the middle of batches let the 1 ms linger thread cut partial
    # batches while the caller cuts full ones: whichever thread sends, one
    # key's messages must keep their order. (The pauses shape the load; they
    # synchronise nothing.)
    with Producer(broker.address, linger_ms=1, batch_size=50) as producer:
        futures = []
        for i in range(2000):
            futures.append(producer.send("linger", b"m%d" % i, key=b"k"))
            if i % 37 == 0:
                time.sleep(0.001)
        results = [f.result(timeout=30) for f in futures]
    assert [r.offset for r in results] == list(range(2000))  # one key: one queue, in order
    assert len({r.queue_id for r in results}) == 1


def test_consumer_seek_and_assign_without_group(broker: BrokerProcess) -> None:
    with Producer(broker.address) as producer:
        producer.send_batch("seek", [b"v%d" % i for i in range(10)], queue_ids=[0] * 10)
    with Consumer(broker.address) as consumer:
        consumer.assign("seek", [0])
        first = consumer.poll(2.0)
        assert [m.offset for m in first] == list(range(10))
        consumer.seek("seek", 0, 7)
        assert [m.value for m in consumer.poll(2.0)] == [b"v7", b"v8", b"v9"]
        assert consumer.position("seek", 0) == 10
        with pytest.raises(InvalidRequest, match="commit needs a group"):
            consumer.commit()


def test_poll_waits_instead_of_spinning_when_the_broker_is_gone(
    broker_factory: StartBroker,
) -> None:
    broker = broker_factory()
    with Producer(broker.address) as producer:
        producer.send_batch("gone", [b"x"], queue_ids=[0])
    config = ClientConfig(broker=broker.address, timeout_s=2, retries=0)
    with Consumer(config=config) as consumer:
        consumer.assign("gone", [0])
        assert len(consumer.poll(2.0)) == 1
        broker.kill()
        started = time.monotonic()
        assert consumer.poll(0.5) == []
        assert time.monotonic() - started >= 0.45  # waited out its timeout


def test_pull_stream_reads_a_range_in_batches(broker: BrokerProcess) -> None:
    with Producer(broker.address) as producer:
        for round_ in range(5):
            values = [b"r%d-%d" % (round_, i) for i in range(400)]
            producer.send_batch("bulk", values, queue_ids=[0] * 400)
    batches = list(read_range("bulk", 0, 150, broker=broker.address, batch_messages=300))
    offsets = [m.offset for batch in batches for m in batch]
    assert offsets == list(range(150, 2000))
    assert [len(b) for b in batches] == [300] * 6 + [50]
    bounded = [m.offset for b in read_range("bulk", 0, 10, 20, broker=broker.address) for m in b]
    assert bounded == list(range(10, 20))
    with pytest.raises(NotFoundError, match="'nope'"):
        list(read_range("nope", 0, 0, broker=broker.address))


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_produce_stream_pipelines_batches_in_order(broker_factory: StartBroker, flush: str) -> None:
    broker = broker_factory("--flush", flush)
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("piped", queues=1)
        batches = [[b"b%d-m%d" % (b, m) for m in range(100)] for b in range(20)]
        results = list(producer.send_batches("piped", batches))
        assert [len(r) for r in results] == [100] * 20
        assert [o for r in results for o in r.offsets] == list(range(2000))
        assert admin.get_message(results[7][3].message_id).value == b"b7-m3"

        too_big = [[b"ok"], [b"ok"], [b"x" * 5_000_000], [b"never sent"]]
        acked = []
        with pytest.raises(LimitError, match="max_message_bytes"):
            for result in producer.send_batches("piped", too_big):
                acked.append(result)
        assert len(acked) == 2
        assert admin.describe_topic("piped").queues[0].end_offset == 2002
