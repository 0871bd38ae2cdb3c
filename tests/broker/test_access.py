"""Access control across scopes (issue 15), on real broker processes with a tokens file.

A token limited to some topics (``topics = [...]``) must not reach what
belongs to other topics through calls that do not name them: a consumer
group reading other topics, an admin call, a message id, a listing. And the
tokens file itself: names are unique, free text the broker echoes is bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from equeue_broker.server.auth import TokenTable
from equeue_broker.server.errors import BadRequest
from equeue_broker.testing import BrokerProcess
from equeue_proto.protocol import MAX_CONSUMER_ID, consumer_id_problem, default_consumer_id
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from equeue_spark.cli import main as cli_main
from equeue_spark.client import Admin, ClientConfig, Consumer, PermissionDeniedError, Producer
from tests.broker.test_startup import one_line, run_broker

StartBroker = Callable[..., BrokerProcess]

OPS, ETL, ORDERS, TEAM_A = (
    "ops-secret-0123456789ab",
    "etl-secret-0123456789ab",
    "orders-secret-012345678",
    "team-a-secret-012345678",
)
TOKENS = f"""
[[tokens]]
name = "ops"
secret = "{OPS}"
roles = ["admin"]

[[tokens]]
name = "etl"
secret = "{ETL}"
roles = ["produce", "consume"]

[[tokens]]
name = "orders"
secret = "{ORDERS}"
roles = ["produce", "consume"]
topics = ["orders*"]

[[tokens]]
name = "team-a"
secret = "{TEAM_A}"
roles = ["admin"]
topics = ["team-a*"]
"""
DENIED = grpc.StatusCode.PERMISSION_DENIED


@pytest.fixture
def broker(broker_factory: StartBroker, tmp_path: Path) -> BrokerProcess:
    path = tmp_path / "tokens.toml"
    path.write_text(TOKENS)
    path.chmod(0o600)
    return broker_factory("--tokens-file", str(path))


def fast(broker: BrokerProcess, token: str) -> ClientConfig:
    return ClientConfig(broker=broker.address, timeout_s=5, retries=0, token=token)


class Raw:
    """Bare stubs calling with one token: the requests a hostile client can build."""

    def __init__(self, channel: grpc.Channel, token: str) -> None:
        self.broker = pb_grpc.BrokerStub(channel)
        self.admin = pb_grpc.AdminStub(channel)
        self.metadata = (("authorization", f"Bearer {token}"),)

    def __call__(self, method: Callable[..., object], request: object) -> object:
        return method(request, metadata=self.metadata, timeout=5)

    def refused(self, method: Callable[..., object], request: object) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as failure:
            self(method, request)
        return failure.value


def heartbeat(group: str, consumer_id: str, *topics: str, leave: bool = False) -> object:
    return pb.HeartbeatRequest(group=group, consumer_id=consumer_id, topics=topics, leave=leave)


def test_a_scoped_token_cannot_reach_a_group_that_reads_other_topics(
    broker: BrokerProcess,
) -> None:
    with Admin(config=fast(broker, OPS)) as ops:
        ops.create_topic("other", queues=2)
        ops.create_topic("orders", queues=1)
        ops.create_topic("team-a1", queues=1)
    with grpc.insecure_channel(broker.address) as channel:
        etl, orders, team_a = Raw(channel, ETL), Raw(channel, ORDERS), Raw(channel, TEAM_A)
        joined = etl(etl.broker.Heartbeat, heartbeat("billing", "real", "other"))
        assert isinstance(joined, pb.HeartbeatReply)
        assert list(joined.topics[0].owned_queue_ids) == [0, 1]
        # A group with committed offsets only (no live member) is the group's too.
        commit = pb.CommitOffsetsRequest(
            group="ledger", offsets=[pb.QueueOffset(topic="other", queue_id=0, offset=0)]
        )
        etl(etl.broker.CommitOffsets, commit)

        for request, where in [
            (heartbeat("billing", "evil"), "'billing'"),  # no topics: joins, sees members
            (heartbeat("billing", "evil", "orders"), "'billing'"),
            (heartbeat("billing", "real", leave=True), "'billing'"),  # kicks the real one
            (heartbeat("ledger", "evil"), "'ledger'"),
            (pb.CommitOffsetsRequest(group="billing", offsets=[
                pb.QueueOffset(topic="orders", queue_id=0, offset=0)]), "'billing'"),
            (pb.FetchOffsetsRequest(group="ledger", topic="orders"), "'ledger'"),
        ]:  # fmt: skip
            method = getattr(orders.broker, type(request).__name__.removesuffix("Request"))
            error = orders.refused(method, request)
            assert error.code() == DENIED, (request, error.details())
            assert f"group {where}" in str(error.details()) and "'other'" in str(error.details())
        # A topic-scoped admin token neither.
        for request in [
            pb.DescribeGroupRequest(group="billing"),
            pb.DeleteGroupRequest(group="ledger"),
            pb.ResetOffsetsRequest(group="ledger", topic="team-a1", earliest=True),
        ]:
            method = getattr(team_a.admin, type(request).__name__.removesuffix("Request"))
            error = team_a.refused(method, request)
            assert error.code() == DENIED and "'other'" in str(error.details()), request
        assert team_a(team_a.admin.ListGroups, pb.ListGroupsRequest()) == pb.ListGroupsReply()

        # The real member kept its membership and both queues; ledger its offsets.
        again = etl(etl.broker.Heartbeat, heartbeat("billing", "real", "other"))
        assert isinstance(again, pb.HeartbeatReply)
        assert list(again.consumer_ids) == ["real"] and again.session == joined.session
        assert list(again.topics[0].owned_queue_ids) == [0, 1]
        fetched = etl(etl.broker.FetchOffsets, pb.FetchOffsetsRequest(group="ledger"))
        assert isinstance(fetched, pb.FetchOffsetsReply) and len(fetched.offsets) == 1

    # Groups wholly inside a token's topics work as before, for both kinds of token.
    with Producer(config=fast(broker, ORDERS)) as producer:
        producer.send_batch("orders", [b"o1"], queue_ids=[0])
    with Consumer(config=fast(broker, ORDERS), group="shop", topics=["orders"],
                  start="earliest") as consumer:  # fmt: skip
        assert [m.value for m in consumer.poll(timeout_s=5)] == [b"o1"]
        consumer.commit()
    with Admin(config=fast(broker, TEAM_A)) as team:
        team.commit_offsets("team-group", {("team-a1", 0): 0})
        assert team.describe_group("team-group").queues[0].topic == "team-a1"
        assert team.list_groups() == ["team-group"]
        team.delete_group("team-group")


def test_an_admin_tokens_topic_patterns_bind_every_admin_call(broker: BrokerProcess) -> None:
    with Producer(config=fast(broker, ETL)) as producer:
        theirs = producer.send_batch("team-b1", [b"b"], queue_ids=[0])[0]
    with Admin(config=fast(broker, TEAM_A)) as team:
        team.create_topic("team-a1", queues=1)
        refused: list[Callable[[], object]] = [
            lambda: team.create_topic("team-b2"),
            lambda: team.delete_topic("team-b1"),
            lambda: team.describe_topic("team-b1"),
            lambda: team.add_queues("team-b1"),
            lambda: team.set_queue_visibility("team-b1", 0, consumer=False),
            lambda: team.delete_queue("team-b1", 0, force=True),
            lambda: team.get_message(theirs.message_id),  # the id names no topic
            lambda: team.get_message_at("team-b1", 0, 0),
            lambda: team.list_offsets("team-b1"),
        ]
        for call in refused:
            with pytest.raises(PermissionDeniedError, match="may not use topic 'team-b"):
                call()
        with Producer(config=fast(broker, TEAM_A)) as producer:
            mine = producer.send_batch("team-a1", [b"a"], queue_ids=[0])[0]
            producer.send_batch("team-a1", [b"staged"], queue_ids=[0], transaction_id="t1")
        assert team.get_message(mine.message_id).value == b"a"
        assert [t.name for t in team.list_topics()] == ["team-a1"]
        stats = team.stats()
        assert (stats.topics, stats.queues) == (1, 1)
        assert [c.topic for c in stats.queue_counters] == ["team-a1"]
        # A scoped admin works in its own transaction namespace, like any scoped token.
        assert [t.transaction_id for t in team.list_transactions().transactions] == ["team-a@t1"]
    with Admin(config=fast(broker, OPS)) as ops:
        assert sorted(t.name for t in ops.list_topics()) == ["team-a1", "team-b1"]
        assert ops.describe_topic("team-b1").queues[0].end_offset == 1
        assert [t.transaction_id for t in ops.list_transactions().transactions] == ["team-a@t1"]
        assert ops.stats().topics == 2


def test_two_tokens_with_one_name_stop_the_broker_from_starting(tmp_path: Path) -> None:
    twice = TOKENS + f'\n[[tokens]]\nname = "etl"\nsecret = "{ETL}-other"\nroles = ["consume"]\n'
    with pytest.raises(BadRequest, match=r"tokens.toml: token 5: the name 'etl' is already taken"):
        TokenTable.parse(twice, "tokens.toml")
    path = tmp_path / "tokens.toml"
    path.write_text(twice)
    done = run_broker(tmp_path, "--port", "0", "--tokens-file", str(path))
    assert done.returncode == 2, done.stderr
    line = one_line(done)
    assert str(path) in line and "'etl' is already taken" in line, line


def test_consumer_ids_are_short_and_printable(
    broker: BrokerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    default = default_consumer_id("host name/with\tévil\nchars" * 9, 123, "abcdef")
    assert consumer_id_problem(default) is None and default.endswith("-123-abcdef")
    with Admin(config=fast(broker, OPS)) as ops:  # heartbeats name existing topics only
        ops.create_topic("t", queues=1)
    with grpc.insecure_channel(broker.address) as channel:
        etl = Raw(channel, ETL)
        for bad in ["a" * (MAX_CONSUMER_ID + 1), "evil\n[admin] forged log line", "x y", "ü"]:
            for request in [
                heartbeat("g", bad, "t"),
                pb.PullRequest(topic="t", group="g", consumer_id=bad, session=1),
                pb.CommitOffsetsRequest(group="g", consumer_id=bad, session=1,
                                        offsets=[pb.QueueOffset(topic="t")]),
            ]:  # fmt: skip
                method = getattr(etl.broker, type(request).__name__.removesuffix("Request"))
                error = etl.refused(method, request)
                assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (bad, request)
                assert f"consumer_id {bad[:64]!r}" in str(error.details()), error.details()
        ok = etl(etl.broker.Heartbeat, heartbeat("g", "a" * MAX_CONSUMER_ID, "t"))
        assert isinstance(ok, pb.HeartbeatReply) and ok.consumer_ids == ["a" * MAX_CONSUMER_ID]
    with pytest.raises(ValueError, match="consumer_id 'x y'"):
        Consumer(config=fast(broker, ETL), group="g", topics=["t"], consumer_id="x y")
    command = ["--broker", broker.address, "consume", "t", "--group", "g", "--consumer-id"]
    assert cli_main([*command, "x y"]) == 2  # refused before connecting
    assert "--consumer-id: consumer_id 'x y'" in capsys.readouterr().err
    with Consumer(config=fast(broker, ETL), group="g2", topics=["t"]) as consumer:
        consumer.poll(timeout_s=0.1)  # joins with the default id
        with Admin(config=fast(broker, OPS)) as ops:
            assert ops.describe_group("g2").consumer_ids == [consumer.consumer_id]
