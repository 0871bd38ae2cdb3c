"""Delayed delivery on a real broker: Produce with deliver_at_ms, CancelDelayed,
pending counts in GetStats and DescribeTopic, and the errors for bad input.

Raw gRPC (the broker's wire behaviour); the client's delay options have their
own tests. Delays are a second or two: the store's timer has about a second
of precision, and every wait is a long poll bounded by its test's timeout.
"""

from __future__ import annotations

import grpc
import pytest

from equeue_broker.testing import BrokerProcess
from equeue_proto.record import decode_record
from equeue_proto.v1 import broker_pb2 as pb
from tests.broker.delayed_support import error_of, now_ms, produce, pull, pull_until
from tests.support.raw_client import RawClient

pytestmark = pytest.mark.timeout(120)
DAY_MS = 86_400_000


@pytest.fixture
def client(broker: BrokerProcess) -> RawClient:
    raw = RawClient(broker.address)
    raw.admin.CreateTopic(pb.CreateTopicRequest(name="orders", queue_count=1), timeout=10)
    return raw


def test_a_delayed_message_appears_at_its_time_with_a_fresh_offset(client: RawClient) -> None:
    produce(client, "orders", [b"now"])
    due = now_ms() + 1_500
    reply = produce(client, "orders", [b"later-1", b"later-2"], deliver_at_ms=[due])
    assert list(reply.offsets) == [-1, -1]
    assert list(reply.deliver_at_ms) == [due, due]
    ids = [f"{reply.broker_id}-{p:016x}" for p in reply.positions]
    stats = client.stats()
    assert stats.delayed_pending == 2
    assert stats.delayed_next_due_ms == due
    info = client.admin.DescribeTopic(pb.DescribeTopicRequest(name="orders"), timeout=10)
    assert (info.delayed_pending, info.delayed_next_due_ms) == (2, due)
    # Invisible to every reader until due: the queue ends after the plain message.
    messages, pulled = pull(client, "orders", 0)
    assert [m.value for m in messages] == [b"now"]
    assert pulled.end_offset == 1
    later = pull_until(client, "orders", 1, 2)
    assert [(m.value, m.offset) for m in later] == [(b"later-1", 1), (b"later-2", 2)]
    for message, message_id in zip(later, ids, strict=True):
        assert message.store_timestamp_ms >= due  # the broker's own clock: not early
        assert message.message_id == message_id  # the id Produce gave still names it
        got = client.admin.GetMessage(pb.GetMessageRequest(message_id=message_id), timeout=10)
        assert decode_record(got.record, 0).value == message.value
    stats = client.stats()
    assert (stats.delayed_pending, stats.delayed_next_due_ms) == (0, 0)


def test_one_time_per_message(client: RawClient) -> None:
    start = now_ms()
    times = [start + 2_000, start + 500, start + 1_000]
    reply = produce(client, "orders", [b"c", b"a", b"b"], deliver_at_ms=times)
    assert list(reply.deliver_at_ms) == times
    got = pull_until(client, "orders", 0, 3)
    assert [m.value for m in got] == [b"a", b"b", b"c"]  # in order of their times


def test_cancel(client: RawClient) -> None:
    due = now_ms() + 1_000
    reply = produce(client, "orders", [b"kept", b"cancelled"], deliver_at_ms=[due])
    cancelled_id = f"{reply.broker_id}-{reply.positions[1]:016x}"
    request = pb.CancelDelayedRequest(message_id=cancelled_id)
    done = client.broker.CancelDelayed(request, timeout=10)
    assert (done.topic, done.queue_id, done.deliver_at_ms) == ("orders", 0, due)
    error = error_of(lambda: client.broker.CancelDelayed(request, timeout=10))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "no pending delayed message" in str(error.details())
    (kept,) = pull_until(client, "orders", 0, 1)
    assert kept.value == b"kept"
    # Both were due at once: had the cancelled one been delivered, it would be here.
    assert pull(client, "orders", 1)[0] == []
    assert client.stats().delayed_pending == 0


def test_bad_delivery_times_and_ids_are_clear_errors(client: RawClient) -> None:
    far = now_ms() + 8 * DAY_MS
    error = error_of(lambda: produce(client, "orders", [b"x"], deliver_at_ms=[far]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(far) in str(error.details())
    error = error_of(lambda: produce(client, "orders", [b"x"], deliver_at_ms=[1_000]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "1000" in str(error.details())
    error = error_of(lambda: produce(client, "orders", [b"x"] * 3, deliver_at_ms=[1, 2]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "deliver_at_ms has 2 entries for 3 messages" in str(error.details())
    soon = [now_ms() + 1_000]
    error = error_of(lambda: produce(client, "orders", [b"x"], deliver_at_ms=soon, txn="t1"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "transaction_id 't1'" in str(error.details())
    assert client.stats().delayed_pending == 0  # nothing of them was written
    for bad in ("nonsense", "x-zz"):
        request = pb.CancelDelayedRequest(message_id=bad)
        error = error_of(lambda r=request: client.broker.CancelDelayed(r, timeout=10))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert repr(bad) in str(error.details())
    unknown = f"{client.stats().broker_id}-{123456:016x}"
    error = error_of(
        lambda: client.broker.CancelDelayed(pb.CancelDelayedRequest(message_id=unknown))
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert unknown in str(error.details())


def test_produce_stream_takes_delivery_times(client: RawClient) -> None:
    due = now_ms() + 500
    columns = pb.MessageColumns(count=1, values=b"s", value_lengths=[1])
    requests = [pb.ProduceRequest(topic="orders", messages=columns, deliver_at_ms=[due])] * 3
    replies = list(client.broker.ProduceStream(iter(requests), timeout=30))
    assert [(list(r.offsets), list(r.deliver_at_ms)) for r in replies] == [([-1], [due])] * 3
    assert [m.value for m in pull_until(client, "orders", 0, 3)] == [b"s"] * 3
