"""Retry and dead-letter topics on a real broker: Nack, the '%' names,
ResendDeadLetters (once, across a restart), PurgeDeadLetters, DeleteGroup.

Raw gRPC (the broker's wire behaviour); the client's Consumer.nack has its own tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from equeue_broker.server.retry import ensure_topic
from equeue_broker.storage import Store
from equeue_broker.storage.errors import LimitExceeded
from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from tests.broker.delayed_support import (
    error_of,
    header,
    nack,
    now_ms,
    produce,
    pull,
    pull_until,
)
from tests.conftest import MakeConfig
from tests.support.raw_client import RawClient
from tests.support.waits import wait_for

pytestmark = pytest.mark.timeout(120)

GROUP = "billing"
RETRY, DLQ = f"%RETRY%{GROUP}", f"%DLQ%{GROUP}"


@pytest.fixture
def client(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> Iterator[RawClient]:
    config = tmp_path / "broker.toml"
    config.write_text('retry-backoff = ["1s", "2s"]\nretry-backoff-groups = {audit = ["5m"]}\n')
    broker = broker_factory("--max-reconsume-times", "3", "--config", str(config))
    raw = RawClient(broker.address)
    yield raw
    raw.close()


def test_three_retries_then_a_dead_letter_with_its_history(client: RawClient) -> None:
    client.admin.CreateTopic(pb.CreateTopicRequest(name="orders", queue_count=1), timeout=10)
    sent = produce(client, "orders", [b"order-1"], headers=[("trace", b"t1")], key=b"k", tag="t")
    original_id = f"{sent.broker_id}-{sent.positions[0]:016x}"
    (first,), _ = pull(client, "orders", 0)
    deliveries = [first]
    topic, offset = "orders", 0
    for attempt in range(1, 4):
        outcome = nack(client, topic, offset, error=f"boom {attempt}")
        assert (outcome.action, outcome.deliveries) == ("retry", attempt)
        (copy,) = pull_until(client, RETRY, attempt - 1, 1)
        assert copy.store_timestamp_ms >= outcome.deliver_at_ms  # not before its time
        assert copy.message_id == outcome.message_id  # the id Nack gave resolves
        assert header(copy, "equeue.deliveries") == str(attempt).encode()
        assert header(copy, "equeue.error") == f"boom {attempt}".encode()
        deliveries.append(copy)
        topic, offset = RETRY, copy.offset
    last = nack(client, topic, offset, error="boom 4")
    assert (last.action, last.deliveries, last.deliver_at_ms) == ("dlq", 4, 0)
    assert len(deliveries) == 4  # delivered exactly 4 times: the original and 3 retries
    (letter,) = pull_until(client, DLQ, 0, 1)
    assert letter.message_id == last.message_id
    assert (letter.value, letter.key, letter.tag) == (b"order-1", b"k", "t")
    assert header(letter, "trace") == b"t1"  # the producer's own headers stay
    assert header(letter, "equeue.origin.topic") == b"orders"
    assert header(letter, "equeue.origin.queue") == b"0"
    assert header(letter, "equeue.origin.offset") == b"0"
    assert header(letter, "equeue.origin.id") == original_id.encode()
    assert header(letter, "equeue.deliveries") == b"4"
    assert header(letter, "equeue.error") == b"boom 4"
    assert b"max_reconsume_times 3" in (header(letter, "equeue.dlq.reason") or b"")
    assert letter.timestamp_ms == first.timestamp_ms  # the producer's time travels along
    # Nothing more reaches the retry topic.
    assert pull(client, RETRY, 3)[0] == []


def test_backoff_steps_and_a_request_limit(client: RawClient) -> None:
    produce(client, "orders", [b"a", b"b"])
    before = now_ms()
    outcome = nack(client, "orders", 0, delay_ms=-1)  # the first step of retry-backoff: 1s
    assert before + 1_000 <= outcome.deliver_at_ms <= now_ms() + 1_000
    (copy,) = pull_until(client, RETRY, 0, 1)
    outcome = nack(client, RETRY, copy.offset, delay_ms=-1)  # the second: 2s
    assert outcome.deliveries == 2
    assert outcome.deliver_at_ms >= before + 2_000
    # A request may lower the limit: one retry, then the dead-letter topic.
    first = nack(client, "orders", 1, max_=1, delay_ms=0)
    assert (first.action, first.deliveries) == ("retry", 1)
    (copy,) = pull_until(client, RETRY, 1, 1)
    assert nack(client, RETRY, copy.offset, max_=1).action == "dlq"
    # A group with its own steps (retry-backoff-groups).
    entry = pb.NackEntry(topic="orders", queue_id=0, offset=0, delay_ms=-1)
    before = now_ms()
    reply = client.broker.Nack(pb.NackRequest(group="audit", entries=[entry]), timeout=10)
    assert before + 300_000 <= reply.outcomes[0].deliver_at_ms <= now_ms() + 300_000


def test_nack_refuses_what_it_cannot_do(client: RawClient) -> None:
    produce(client, "orders", [b"a"])
    error = error_of(lambda: nack(client, "orders", 5))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "orders/0 has no message at offset 5" in str(error.details())
    error = error_of(lambda: nack(client, "orders", 0, delay_ms=400 * 86_400_000))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "delay_ms 34560000000" in str(error.details())
    error = error_of(lambda: nack(client, "%DLQ%other", 0))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    request = pb.NackRequest(group="%x", entries=[pb.NackEntry(topic="orders")])
    error = error_of(lambda: client.broker.Nack(request, timeout=10))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'%x' is reserved" in str(error.details())
    entries = [pb.NackEntry(topic="orders", offset=0)] * 1_001
    error = error_of(lambda: client.broker.Nack(pb.NackRequest(group=GROUP, entries=entries)))
    assert "1001 entries; the limit is 1000" in str(error.details())


def test_reserved_names_are_refused_to_users(client: RawClient) -> None:
    for name in ("%RETRY%billing", "%mine"):
        error = error_of(lambda n=name: client.admin.CreateTopic(pb.CreateTopicRequest(name=n)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"topic name {name!r} is reserved" in str(error.details())
        assert "retry and dead-letter topics" in str(error.details())
    error = error_of(lambda: produce(client, DLQ, [b"x"]))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    heartbeat = pb.HeartbeatRequest(group="%g", consumer_id="c1", topics=[])
    error = error_of(lambda: client.broker.Heartbeat(heartbeat, timeout=10))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "group name '%g' is reserved" in str(error.details())


def test_a_group_topic_keeps_its_shape(client: RawClient) -> None:
    """A retry topic keeps its one queue, visible, and goes with its group:
    users cannot add queues, hide, delete it or its queue."""
    produce(client, "orders", [b"x"])
    nack(client, "orders", 0)
    retry = f"%RETRY%{GROUP}"
    calls = (
        lambda: client.admin.AddQueues(pb.AddQueuesRequest(name=retry, count=1)),
        lambda: client.admin.SetQueueVisibility(
            pb.SetQueueVisibilityRequest(name=retry, queue_id=0, consumer_visible=False)
        ),
        lambda: client.admin.DeleteTopic(pb.DeleteTopicRequest(name=retry)),
        lambda: client.admin.DeleteQueue(pb.DeleteQueueRequest(name=retry, queue_id=0)),
    )
    for call in calls:
        error = error_of(call)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "equeue groups delete GROUP" in str(error.details())
    info = client.admin.DescribeTopic(pb.DescribeTopicRequest(name=retry), timeout=10)
    assert [(q.queue_id, q.consumer_visible) for q in info.queues] == [(0, True)]


def test_resend_puts_a_dead_letter_back_once(
    client: RawClient, broker_factory: Callable[..., BrokerProcess]
) -> None:
    client.admin.CreateTopic(pb.CreateTopicRequest(name="orders", queue_count=1), timeout=10)
    produce(client, "orders", [b"first", b"second"])
    ids = []
    for offset in (0, 1):
        nack(client, "orders", offset, max_=1, delay_ms=0)
        (copy,) = pull_until(client, RETRY, offset, 1)
        ids.append(nack(client, RETRY, copy.offset, max_=1).message_id)
    resend = pb.ResendDeadLettersRequest(group=GROUP, message_ids=[ids[0], "ffff-0000000000000001"])
    reply = client.admin.ResendDeadLetters(resend, timeout=30)
    assert (reply.resent, reply.already_resent) == (1, 0)
    assert list(reply.not_found) == ["ffff-0000000000000001"]
    (back,) = pull_until(client, "orders", 2, 1)
    assert back.value == b"first"
    assert back.message_id == reply.new_message_ids[0]
    assert header(back, "equeue.dlq.id") == ids[0].encode()
    again = client.admin.ResendDeadLetters(resend, timeout=30)
    assert (again.resent, again.already_resent) == (0, 1)
    every = client.admin.ResendDeadLetters(
        pb.ResendDeadLettersRequest(group=GROUP, all=True), timeout=30
    )
    assert every.resent == 1  # only the second: the first was resent already
    (second,) = pull_until(client, "orders", 3, 1)
    assert second.value == b"second"
    again = client.admin.ResendDeadLetters(
        pb.ResendDeadLettersRequest(group=GROUP, all=True), timeout=30
    )
    assert again.resent == 0
    assert pull(client, "orders", 4)[0] == []
    bad = pb.ResendDeadLettersRequest(group=GROUP, message_ids=[ids[0]], all=True)
    error = error_of(lambda: client.admin.ResendDeadLetters(bad, timeout=10))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_resent_ids_are_remembered_across_a_restart(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "b", "--max-reconsume-times", "0")
    broker.start()
    try:
        client = RawClient(broker.address)
        produce(client, "orders", [b"x"])
        (letter_id,) = [nack(client, "orders", 0).message_id]  # 0 retries: dead at once
        request = pb.ResendDeadLettersRequest(group=GROUP, message_ids=[letter_id])
        assert client.admin.ResendDeadLetters(request, timeout=30).resent == 1
        client.close()
        broker.kill()  # SIGKILL: what was acknowledged is in the log
        broker.start()
        client = RawClient(broker.address)
        reply = client.admin.ResendDeadLetters(request, timeout=30)
        assert (reply.resent, reply.already_resent) == (0, 1)
        client.close()
    finally:
        broker.kill()


def test_purge_and_delete_group_remove_the_group_topics(client: RawClient) -> None:
    produce(client, "orders", [b"a", b"b"])
    assert nack(client, "orders", 0, max_=1, delay_ms=0).action == "retry"
    (copy,) = pull_until(client, RETRY, 0, 1)
    assert nack(client, RETRY, copy.offset, max_=1).action == "dlq"
    info = client.admin.DescribeTopic(pb.DescribeTopicRequest(name=DLQ), timeout=10)
    assert [q.end_offset for q in info.queues] == [1]
    # The group's topics read like any other: offsets, streams, subscriptions, commits.
    offsets = client.broker.ListOffsets(pb.ListOffsetsRequest(topic=DLQ), timeout=10)
    assert [(q.earliest_offset, q.end_offset) for q in offsets.queues] == [(0, 1)]
    stream = client.broker.PullStream(pb.PullStreamRequest(topic=DLQ, queue_id=0), timeout=10)
    assert sum(reply.count for reply in stream) == 1
    joined = client.broker.Heartbeat(
        pb.HeartbeatRequest(group=GROUP, consumer_id="c1", topics=["orders", RETRY]), timeout=10
    )
    assert {t.topic for t in joined.topics} == {"orders", RETRY}
    client.broker.Heartbeat(pb.HeartbeatRequest(group=GROUP, consumer_id="c1", leave=True))
    retry_commit = [pb.QueueOffset(topic=RETRY, queue_id=0, offset=1)]
    client.broker.CommitOffsets(pb.CommitOffsetsRequest(group=GROUP, offsets=retry_commit))
    purged = client.admin.PurgeDeadLetters(pb.PurgeDeadLettersRequest(group=GROUP), timeout=30)
    assert purged.purged == 1
    error = error_of(lambda: client.admin.DescribeTopic(pb.DescribeTopicRequest(name=DLQ)))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    commit = pb.CommitOffsetsRequest(
        group=GROUP, offsets=[pb.QueueOffset(topic="orders", queue_id=0, offset=1)]
    )
    client.broker.CommitOffsets(commit, timeout=10)
    nack(client, "orders", 1, delay_ms=1_000)  # pending in the retry topic
    client.admin.DeleteGroup(pb.DeleteGroupRequest(group=GROUP), timeout=30)
    names = [t.name for t in client.admin.ListTopics(pb.ListTopicsRequest(), timeout=10).topics]
    assert names == ["orders"]
    # Its due time passes with its topic gone: dropped, not delivered anywhere.
    wait_for("the pending retry to go", lambda: client.stats().delayed_pending == 0, 30)
    names = [t.name for t in client.admin.ListTopics(pb.ListTopicsRequest(), timeout=10).topics]
    assert names == ["orders"]
    orders = client.admin.DescribeTopic(pb.DescribeTopicRequest(name="orders"), timeout=10)
    assert sum(q.end_offset for q in orders.queues) == 2


SCOPED_TOKENS = """
[[tokens]]
name = "ops"
secret = "ops-secret-0123456789ab"
roles = ["admin", "produce", "consume"]

[[tokens]]
name = "narrow"
secret = "narrow-secret-01234567"
roles = ["produce", "consume"]
topics = ["orders"]

[[tokens]]
name = "payments"
secret = "payments-secret-012345"
roles = ["produce"]
topics = ["payments"]

[[tokens]]
name = "billing"
secret = "billing-secret-0123456"
roles = ["consume"]
topics = ["orders", "%RETRY%billing", "%DLQ%billing"]
"""


def test_roles_and_topics_of_the_new_calls(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(SCOPED_TOKENS)
    tokens.chmod(0o600)
    broker = broker_factory("--tokens-file", str(tokens))
    channel = grpc.insecure_channel(broker.address)
    stub, admin = pb_grpc.BrokerStub(channel), pb_grpc.AdminStub(channel)

    def as_(secret: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {secret}"),)

    ops, narrow = as_("ops-secret-0123456789ab"), as_("narrow-secret-01234567")
    billing = as_("billing-secret-0123456")
    admin.CreateTopic(pb.CreateTopicRequest(name="orders", queue_count=1), metadata=ops)
    columns = pb.MessageColumns(count=1, values=b"x", value_lengths=[1])
    delayed = pb.ProduceRequest(topic="orders", messages=columns, deliver_at_ms=[now_ms() + 60_000])
    reply = stub.Produce(delayed, metadata=ops, timeout=10)
    nack_ = pb.NackRequest(group=GROUP, entries=[pb.NackEntry(topic="orders", offset=0)])
    stub.Produce(pb.ProduceRequest(topic="orders", messages=columns), metadata=ops, timeout=10)
    # Nack writes the group's retry topic: a token must cover it.
    error = error_of(lambda: stub.Nack(nack_, metadata=narrow, timeout=10))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "%RETRY%billing" in str(error.details())
    assert stub.Nack(nack_, metadata=billing, timeout=10).outcomes[0].action == "retry"
    # CancelDelayed: the produce role, and a token covering the message's topic
    # (the broker finds it from the pending record before cancelling anything).
    cancel = pb.CancelDelayedRequest(message_id=f"{reply.broker_id}-{reply.positions[0]:016x}")
    error = error_of(lambda: stub.CancelDelayed(cancel, metadata=billing, timeout=10))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "lacks role 'produce'" in str(error.details())
    payments = as_("payments-secret-012345")
    error = error_of(lambda: stub.CancelDelayed(cancel, metadata=payments, timeout=10))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "orders" in str(error.details())
    # Still pending (the refusal cancelled nothing): a token covering it cancels it.
    assert stub.CancelDelayed(cancel, metadata=narrow, timeout=10).topic == "orders"
    # The dead-letter calls are Admin calls.
    purge = pb.PurgeDeadLettersRequest(group=GROUP)
    error = error_of(lambda: admin.PurgeDeadLetters(purge, metadata=billing, timeout=10))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert admin.PurgeDeadLetters(purge, metadata=ops, timeout=10).purged == 0
    channel.close()


def test_a_deleted_groups_pending_retries_stay_out_of_its_next_retry_topic(
    client: RawClient,
) -> None:
    """A group deleted with retries pending, then nacking again (its retry
    topic created anew): the old retries are dropped at their time, only the
    new one is delivered there."""
    produce(client, "orders", [b"old", b"new"])
    nack(client, "orders", 0, delay_ms=1_000)
    client.admin.DeleteGroup(pb.DeleteGroupRequest(group=GROUP), timeout=30)
    nack(client, "orders", 1, delay_ms=1_000)  # %RETRY% of the group again, a new one
    wait_for("both due", lambda: client.stats().delayed_pending == 0, 30)
    (copy,) = pull_until(client, RETRY, 0, 1)
    assert copy.value == b"new"
    messages, _ = pull(client, RETRY, 0)
    assert [m.value for m in messages] == [b"new"]


def test_the_brokers_own_topics_take_at_most_half_of_its_topics(
    make_config: MakeConfig,
) -> None:
    """Nack names any group: past half the topic limit it refuses to make
    another group's topics, and users' topics still fit."""
    store = Store(dataclasses.replace(make_config(), max_topics=6), background=False)
    try:
        for group in ("a", "b", "c"):
            ensure_topic(store, f"%RETRY%{group}", lambda: None)
        with pytest.raises(LimitExceeded, match="at most half the broker's topics"):
            ensure_topic(store, "%RETRY%d", lambda: None)
        ensure_topic(store, "%RETRY%a", lambda: None)  # one that exists is fine
        for name in ("x", "y", "z"):
            store.create_topic(name, 1)
    finally:
        store.close()


def test_one_nack_of_runs_of_offsets_keeps_request_order(client: RawClient) -> None:
    """A Nack's messages are read a run of consecutive offsets at a time; the
    copies still follow the request's order, each naming its own origin."""
    produce(client, "orders", [b"m0", b"m1", b"m2", b"m3", b"m4"])
    order = [3, 0, 1, 4]
    entries = [pb.NackEntry(topic="orders", queue_id=0, offset=o, delay_ms=0) for o in order]
    reply = client.broker.Nack(pb.NackRequest(group=GROUP, entries=entries), timeout=30)
    assert [o.action for o in reply.outcomes] == ["retry"] * 4
    copies = pull_until(client, RETRY, 0, 4)
    assert [m.value for m in copies] == [b"m3", b"m0", b"m1", b"m4"]
    assert [header(m, "equeue.origin.offset") for m in copies] == [b"3", b"0", b"1", b"4"]
