"""Queue ownership in consumer groups, on a real broker: the broker hands each
queue to one member at a time and refuses pulls and commits by anyone else."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.client import Admin, Consumer, Message, PreconditionError, Producer
from tests.support.waits import wait_for

StartBroker = Callable[..., BrokerProcess]


class Member:
    """A group member speaking the protocol by hand, so the test decides when
    it heartbeats (and when it stops)."""

    def __init__(self, stub: pb_grpc.BrokerStub, name: str, group: str = "g") -> None:
        self.stub, self.name, self.group = stub, name, group
        self.session = 0

    def heartbeat(self, release: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
        """Heartbeat; returns {"owned": [...], "revoked": [...]} for topic "t"."""
        request = pb.HeartbeatRequest(group=self.group, consumer_id=self.name, topics=["t"])
        for topic, queue_ids in (release or {}).items():
            request.released.add(topic=topic, queue_ids=queue_ids)
        reply = self.stub.Heartbeat(request, timeout=10)
        self.session = reply.session
        (queues,) = reply.topics
        return {"owned": list(queues.owned_queue_ids), "revoked": list(queues.revoked_queue_ids)}

    def pull(self, queue_id: int, session: int | None = None) -> pb.PullReply:
        request = pb.PullRequest(
            topic="t", queue_id=queue_id, offset=0, group=self.group,
            consumer_id=self.name, session=self.session if session is None else session,
        )  # fmt: skip
        reply: pb.PullReply = self.stub.Pull(request, timeout=10)
        return reply

    def commit(self, queue_id: int, offset: int) -> None:
        request = pb.CommitOffsetsRequest(
            group=self.group, consumer_id=self.name, session=self.session
        )
        request.offsets.add(topic="t", queue_id=queue_id, offset=offset)
        self.stub.CommitOffsets(request, timeout=10)


@pytest.fixture
def stub(broker: BrokerProcess) -> Iterator[pb_grpc.BrokerStub]:
    with grpc.insecure_channel(broker.address) as channel:
        yield pb_grpc.BrokerStub(channel)


def refused(call: Callable[[], object], *words: str) -> None:
    """``call`` fails with FAILED_PRECONDITION and a message naming ``words``."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error: Any = caught.value  # a failed call is both an RpcError and a grpc.Call
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    for word in words:
        assert word in error.details(), error.details()


def test_a_non_owners_pull_and_commit_are_refused(
    broker: BrokerProcess, stub: pb_grpc.BrokerStub
) -> None:
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("t", queues=2)
        producer.send_batch("t", [b"a", b"b"], queue_ids=[0, 1])
        a, b = Member(stub, "a"), Member(stub, "b")
        assert a.heartbeat() == {"owned": [0, 1], "revoked": []}
        # b joins: the allocation gives it queue 1, but a holds that until it lets go.
        assert b.heartbeat() == {"owned": [], "revoked": []}
        refused(lambda: b.pull(1), "'g'", "'b'", "t/1")
        refused(lambda: b.commit(1, 1), "'g'", "'b'", "t/1")
        with pytest.raises(PreconditionError, match="'a' holds queue t/1"):
            admin.commit_offsets("g", {("t", 1): 1})  # not under a's feet
        refused(lambda: a.pull(0, session=a.session + 1), "session")  # a stale membership
        # a is told to give queue 1 up; it still holds it, so it can commit its progress.
        assert a.heartbeat() == {"owned": [0], "revoked": [1]}
        assert a.pull(1).count == 1
        a.commit(1, 1)
        assert a.heartbeat(release={"t": [1]}) == {"owned": [0], "revoked": []}
        refused(lambda: a.pull(1), "'a'", "t/1")
        refused(lambda: a.commit(1, 1), "'a'", "t/1")
        assert b.heartbeat() == {"owned": [1], "revoked": []}
        assert b.pull(1).count == 1
        b.commit(1, 1)
        # A reset is a commit from outside the group too.
        with pytest.raises(PreconditionError, match="t/0"):
            admin.reset_offsets("g", "t", to="earliest")


def test_a_commit_from_outside_the_group_works_once_its_members_are_gone(
    broker: BrokerProcess, stub: pb_grpc.BrokerStub
) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("t", queues=2)
        admin.commit_offsets("g", {("t", 0): 0})  # no members: accepted
        with Consumer(broker.address, group="g", topics=["t"], consumer_id="c") as consumer:
            assert consumer.assignment() == [("t", 0), ("t", 1)]
            with pytest.raises(PreconditionError, match="'c' holds queue t/0"):
                admin.commit_offsets("g", {("t", 0): 0})
        admin.commit_offsets("g", {("t", 0): 0, ("t", 1): 0})  # it left: accepted again
        assert admin.reset_offsets("g", "t", to="latest").total_lag == 0


def poll_until(consumer: Consumer, count: int) -> list[Message]:
    got: list[Message] = []

    def more() -> bool:
        got.extend(consumer.poll(0.2))
        return len(got) >= count

    wait_for(f"{count} messages", more)
    return got


def test_a_consumer_drops_queues_it_lost_without_an_error(broker_factory: StartBroker) -> None:
    """A member whose locks expired (it stopped heartbeating) finds its commits
    and pulls refused: it drops the queues, and the user sees no error."""
    broker = broker_factory("--consumer-timeout-ms", "2000")
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("t", queues=2)
        producer.send_batch("t", [b"x"] * 4, queue_ids=[0, 1, 0, 1])
        # A heartbeat interval far beyond the timeout: it expires after joining.
        consumer = Consumer(
            broker.address, group="g", topics=["t"], start="earliest",
            heartbeat_interval_s=3600, consumer_id="sleepy",
        )  # fmt: skip
        with consumer, grpc.insecure_channel(broker.address) as channel:
            assert consumer.assignment() == [("t", 0), ("t", 1)]
            assert len(poll_until(consumer, 4)) == 4
            other = Member(pb_grpc.BrokerStub(channel), "other")
            wait_for("the other member taking over", lambda: other.heartbeat()["owned"] == [0, 1])
            consumer.commit()  # refused queue by queue: dropped, nothing raised
            assert consumer.assignment() == []
            assert consumer.poll(0.2) == []
        assert admin.fetch_offsets("g") == {}  # nothing committed by the expired member


def test_locks_expire_when_a_member_stops_heartbeating(broker_factory: StartBroker) -> None:
    timeout_s = 3.0
    broker = broker_factory("--consumer-timeout-ms", str(int(timeout_s * 1000)))
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("t", queues=4)
        producer.send_batch("t", [b"m"] * 8, queue_ids=[i % 4 for i in range(8)])
        with grpc.insecure_channel(broker.address) as channel:
            dying = Member(pb_grpc.BrokerStub(channel), "dying")
            assert dying.heartbeat()["owned"] == [0, 1, 2, 3]
            for queue_id in range(4):
                dying.commit(queue_id, 1)  # it got one message of each queue through
            dying.heartbeat()  # its last one
            with Consumer(
                broker.address, group="g", topics=["t"], heartbeat_interval_s=0.1,
                consumer_id="survivor",
            ) as survivor:  # fmt: skip
                # The survivor is allocated half the queues but gets none while
                # "dying" still holds them.
                assert survivor.assignment() == []
                joined = time.monotonic()
                wait_for(
                    "the survivor taking over every queue",
                    lambda: len(survivor.assignment()) == 4,
                    timeout_s=timeout_s + 5,
                )
                took = time.monotonic() - joined
                assert took < timeout_s + 2, took
                got = poll_until(survivor, 4)
                assert sorted((m.queue_id, m.offset) for m in got) == [(q, 1) for q in range(4)]
            refused(lambda: dying.pull(0), "'dying'")  # its membership is gone
            assert dying.heartbeat()["owned"] == [0, 1, 2, 3]  # joins again; the other left


def test_a_member_that_joins_again_forgets_what_it_read_before(
    broker_factory: StartBroker,
) -> None:
    """The session fence: a member that expired and joins again must not go on
    from its old positions, even when the broker grants it the same queues,
    or it would read again what another member consumed meanwhile."""
    broker = broker_factory("--consumer-timeout-ms", "1000")
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic("t", queues=2)
        producer.send_batch("t", [b"x"] * 4, queue_ids=[0, 1, 0, 1])
        consumer = Consumer(
            broker.address, group="g", topics=["t"], start="earliest",
            heartbeat_interval_s=3600, consumer_id="sleepy",
        )  # fmt: skip
        with consumer, grpc.insecure_channel(broker.address) as channel:
            assert [consumer.position("t", q) for q in (0, 1)] == [0, 0]
            other = Member(pb_grpc.BrokerStub(channel), "other")
            wait_for("the other member taking over", lambda: other.heartbeat()["owned"] == [0, 1])
            for queue_id in (0, 1):
                assert other.pull(queue_id).count == 2
                other.commit(queue_id, 2)
            other.stub.Heartbeat(
                pb.HeartbeatRequest(group="g", consumer_id="other", leave=True), timeout=10
            )
            # Its heartbeat thread sleeps for an hour: beat once by hand, as it
            # would on waking. The queues are free, so it gets them both back...
            consumer._heartbeat()
            assert consumer.assignment() == [("t", 0), ("t", 1)]
            # ...but starts at the group's offsets, not at its old positions.
            assert [consumer.position("t", q) for q in (0, 1)] == [2, 2]
            assert consumer.poll(0.2) == []
