"""Master -> replica log replication with real broker processes on 127.0.0.1
(docs/replication.md): same log end, same records at the same offsets and
positions, restarts resume, an empty replica catches up, writes to a replica
are refused naming the master, offsets follow, a master's SIGKILL loses
nothing the replica had."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from equeue_broker.replication.replica_log import Metadata, decode_metadata, encode_metadata
from equeue_broker.storage.meta.topics import QueueMeta, TopicMeta
from equeue_broker.testing import BrokerProcess
from equeue_proto.protocol import NOT_MASTER
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.cli import main
from equeue_spark.client.errors import NotMasterError, from_rpc_error
from tests.support.raw_client import RawClient, error_kind
from tests.support.waits import wait_for

CHUNK = str(4 << 20)  # small chunks: replication must roll them where the master did
TOPICS = ("orders", "events", "audit")


class Client(RawClient):
    def snapshot(self) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
        """Every queue's records as pulled (raw bytes, with offsets)."""
        out: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
        for topic in self.admin.ListTopics(pb.ListTopicsRequest(), timeout=10).topics:
            for queue in topic.queues:
                offset, pieces = 0, []
                while True:
                    reply = self.broker.Pull(
                        pb.PullRequest(topic=topic.name, queue_id=queue.queue_id, offset=offset,
                                       max_messages=10_000, max_bytes=8 << 20),
                        timeout=30,
                    )  # fmt: skip
                    if reply.count == 0:
                        break
                    pieces.append((offset, reply.records))
                    offset = reply.next_offset
                out[(topic.name, queue.queue_id)] = pieces
        return out


@pytest.fixture
def master(tmp_path: Path) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(
        tmp_path / "master",
        "--broker-name",
        "g",
        "--chunk-size",
        CHUNK,
        "--max-message-bytes",
        "65536",
    )
    broker.start()
    yield broker
    broker.kill()


def start_replica(tmp_path: Path, master: BrokerProcess, name: str = "replica") -> BrokerProcess:
    replica = BrokerProcess(
        tmp_path / name, "--broker-name", "g", "--chunk-size", CHUNK,
        "--max-message-bytes", "65536", "--role", "replica", "--master", master.address,
    )  # fmt: skip
    replica.start()
    return replica


def caught_up(master: Client, replica: Client) -> bool:
    end = master.stats().log_end_position
    return replica.stats().log_end_position == end


def produce_mix(client: Client, rounds: int, tag: str) -> None:
    for i in range(rounds):
        for topic in TOPICS:
            client.produce(topic, [b"%s-%s-%d-%d" % (tag.encode(), topic.encode(), i, j) * 20
                                   for j in range(50)])  # fmt: skip
        txn = f"{tag}-txn-{i}"
        client.produce("orders", [b"txn-%d" % j for j in range(10)], txn=txn)
        client.produce("events", [b"txn-e-%d" % j for j in range(5)], txn=txn)
        client.broker.CommitTransactions(
            pb.CommitTransactionsRequest(
                transactions=[pb.TransactionRef(transaction_id=txn, expected_messages=15)]
            ),
            timeout=30,
        )


@pytest.mark.timeout(180)
def test_replica_follows_restarts_refuses_writes_and_survives_the_master(
    tmp_path: Path, master: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    m = Client(master.address)
    produce_mix(m, 5, "before")  # topics and records before the replica exists
    replica = start_replica(tmp_path, master)
    r = Client(replica.address)
    try:
        produce_mix(m, 60, "during")  # > 4 MiB: chunks roll while it follows
        m.broker.CommitOffsets(
            pb.CommitOffsetsRequest(
                group="billing", offsets=[pb.QueueOffset(topic="orders", queue_id=0, offset=7)]
            ),
            timeout=10,
        )
        wait_for("the replica to reach the master's log end", lambda: caught_up(m, r), 60)
        assert m.stats().chunk_count > 1
        assert r.snapshot() == m.snapshot()

        def offsets_replicated() -> bool:
            got = r.broker.FetchOffsets(
                pb.FetchOffsetsRequest(group="billing", topic="orders"), timeout=10
            )
            return any(o.queue_id == 0 and o.offset == 7 for o in got.offsets)

        wait_for("the group's offsets on the replica", offsets_replicated, 30)

        # Topic changes while it follows reach it (the master encodes its
        # metadata only when the topics or offsets changed: this checks that).
        m.admin.CreateTopic(pb.CreateTopicRequest(name="late", queue_count=2), timeout=10)
        m.admin.AddQueues(pb.AddQueuesRequest(name="orders", count=1), timeout=10)
        m.admin.SetQueueVisibility(
            pb.SetQueueVisibilityRequest(name="events", queue_id=0, producer_visible=False),
            timeout=10,
        )
        m.produce("late", [b"late-%d" % i for i in range(10)])

        def topics(client: Client) -> list[pb.TopicInfo]:
            return list(client.admin.ListTopics(pb.ListTopicsRequest(), timeout=10).topics)

        wait_for("the topic changes on the replica", lambda: topics(r) == topics(m), 30)
        wait_for("the late topic's records", lambda: r.snapshot() == m.snapshot(), 30)

        # The master knows where its replica stands.
        def tracked() -> bool:
            stats = m.stats()
            return any(x.lag_bytes == 0 and x.connected for x in stats.replicas)

        wait_for("the master to see its replica at its end", tracked, 30)
        assert r.stats().role == "replica"
        assert r.stats().master == master.address
        # `equeue stats` says the same, on each side.
        assert main(["--broker", master.address, "--timeout-s", "10", "stats"]) == 0
        said = capsys.readouterr().out
        assert re.search(r"^role +master$", said, re.M), said
        assert f"replica {replica.address}: at " in said and "0 B behind, connected" in said
        assert main(["--broker", replica.address, "--timeout-s", "10", "stats"]) == 0
        assert f"following {master.address}" in capsys.readouterr().out

        # Writes to a replica are refused, naming the master.
        for call in (
            lambda: r.produce("orders", [b"no"]),
            lambda: r.admin.CreateTopic(pb.CreateTopicRequest(name="nope"), timeout=10),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert master.address in (refused.value.details() or "")
            # Its kind, for clients to act on (protocol.ERROR_KIND_KEY).
            assert error_kind(refused.value) == NOT_MASTER
            assert isinstance(from_rpc_error(refused.value), NotMasterError)

        # A replica killed and restarted resumes from its own log end.
        replica.kill()
        produce_mix(m, 5, "while-down")
        replica.start()
        r.close()
        r = Client(replica.address)
        wait_for("the restarted replica to catch up", lambda: caught_up(m, r), 60)
        assert r.snapshot() == m.snapshot()

        # The master SIGKILLed: the replica serves everything it had.
        before = m.snapshot()
        master.kill()
        assert r.snapshot() == before
    finally:
        r.close()
        m.close()
        replica.kill()


@pytest.mark.timeout(240)
def test_an_empty_replica_catches_up_with_10_mb(tmp_path: Path, master: BrokerProcess) -> None:
    m = Client(master.address)
    payload = [bytes([i % 251]) * 1000 for i in range(1000)]  # 1 MB a batch
    for i in range(12):
        m.produce(TOPICS[i % 3], payload)
    end = m.stats().log_end_position
    assert end >= 12_000_000
    started = time.monotonic()
    replica = start_replica(tmp_path, master)
    r = Client(replica.address)
    try:
        wait_for("the empty replica to catch up", lambda: caught_up(m, r), 120)
        seconds = time.monotonic() - started
        print(f"catch-up: {end / seconds / 1e6:.1f} MB/s ({end} bytes in {seconds:.2f} s)")
        assert r.snapshot() == m.snapshot()
    finally:
        r.close()
        m.close()
        replica.kill()


def test_a_pipelined_request_counts_only_what_the_replica_applied(master: BrokerProcess) -> None:
    """A replica catching up asks for the next bytes before applying the last
    (``unapplied``): the master's view of it (and so the in-sync set) counts
    only what it applied. Replies are read with protobuf's own decoder."""
    m = Client(master.address)
    try:
        for i in range(3):
            m.produce(TOPICS[i], [bytes([i]) * 1000] * 100)
        end = m.stats().log_end_position
        stub = pb_grpc.ReplicationStub(m.channel)

        def ask(position: int, unapplied: int) -> pb.ReplicateReply:
            request = pb.ReplicateRequest(
                position=position, unapplied=unapplied, max_bytes=100_000, wait_ms=0,
                chunk_capacity=int(CHUNK), replica_address="raw:1", replica_id="raw",
            )  # fmt: skip
            reply: pb.ReplicateReply = next(iter(stub.Replicate(iter([request]), timeout=10)))
            return reply

        def seen() -> int:
            (view,) = (r for r in m.stats().replicas if r.replica_id == "raw")
            return view.position

        first = ask(0, 0)
        after = first.position + len(first.data)
        assert first.position == 0 and 0 < after < end and first.master_end == end
        assert seen() == 0
        second = ask(after, after)  # the first reply received, not applied
        assert second.position == after and len(second.data) > 0
        assert seen() == 0
        ask(after, 0)  # now applied
        assert seen() == after
    finally:
        m.close()


def test_metadata_document_round_trips() -> None:
    meta = Metadata(
        "g",
        (TopicMeta("t", (QueueMeta(0), QueueMeta(2, False, True)), 1234, incarnation=99),),
        {"grp": {"t": {0: 5, 2: 9}}},
    )
    assert decode_metadata(encode_metadata(meta)) == meta


def test_a_replica_needs_its_master_address() -> None:
    from equeue_broker.server.config import BrokerConfig
    from equeue_broker.storage.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="--master"):
        BrokerConfig(role="replica")
    with pytest.raises(InvalidArgument, match="not one HOST:PORT"):
        BrokerConfig(role="replica", master="nohost")
