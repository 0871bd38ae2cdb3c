"""The Routes methods that stand where callers once asked "one broker or a
cluster?" (tests/project/test_one_shape.py holds the rule): each has one
meaning, and its two implementations differ as one broker and a cluster do.

No call here reaches a name server: a ``NameServerRoutes`` dials lazily, and
the methods tested answer from what the routes are. The one-broker cases
that call a broker use a real one, or a port where none listens.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pytest

from equeue_broker.testing import BrokerProcess
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin
from equeue_spark.client.cluster import NameServerRoutes, connect, routes_type
from equeue_spark.client.connection import NAMESRV_ENV, ClientConfig, Connection
from equeue_spark.client.errors import BrokerUnavailable, InvalidRequest
from equeue_spark.client.routing import Brokers, Routed, StaticRoutes
from equeue_spark.spark.write_task import QUEUE_COLUMN_NEEDS_BROKER, check_schema
from tests.support.observability import free_port


def _nowhere() -> str:
    """An address where nothing listens (the port was free a moment ago)."""
    return f"127.0.0.1:{free_port()}"


def test_the_kind_of_routes_is_known_before_connecting(monkeypatch: pytest.MonkeyPatch) -> None:
    """``routes_type`` is ``connect``'s choice, made from the settings alone,
    so a question asked before connecting (Spark's filter pushdown) gets the
    answer the routes will give; ``$EQUEUE_NAMESRV`` counts as ``connect`` counts it."""
    monkeypatch.delenv(NAMESRV_ENV, raising=False)
    one = ClientConfig(broker="127.0.0.1:5000")
    cluster = ClientConfig(namesrv="127.0.0.1:9876")
    assert routes_type(one) is StaticRoutes and not routes_type(one).names_groups()
    assert routes_type(cluster) is NameServerRoutes and routes_type(cluster).names_groups()
    monkeypatch.setenv(NAMESRV_ENV, "127.0.0.1:9876")
    assert routes_type(ClientConfig()).names_groups()
    routes = connect(ClientConfig())
    try:
        assert isinstance(routes, NameServerRoutes)
    finally:
        routes.close()


def test_misnamed_is_a_queue_name_of_the_other_kind() -> None:
    """One broker names a queue by its id alone (group ""), a cluster by
    (group, id): a name of the other shape can never be one of its queues."""
    assert not StaticRoutes.misnamed("") and StaticRoutes.misnamed("a")
    assert NameServerRoutes.misnamed("") and not NameServerRoutes.misnamed("a")


def test_leave_out_keeps_a_clusters_view_and_raises_one_brokers_error() -> None:
    error = BrokerUnavailable("no answer")
    cluster = NameServerRoutes(ClientConfig(namesrv=_nowhere()))
    one = StaticRoutes(ClientConfig(broker=_nowhere()))
    try:
        assert cluster.leave_out("b", error) == "not answering: no answer"
        with pytest.raises(BrokerUnavailable) as raised:
            one.leave_out("", error)
        assert raised.value is error
    finally:
        cluster.close()
        one.close()


@pytest.mark.timeout(60)  # three calls, each refused at once (2 s deadline, no retry)
def test_one_broker_that_does_not_answer_fails_a_spanning_view_with_its_own_error() -> None:
    """``list_topics``, ``list_groups`` and ``describe_group`` over one broker:
    no partial view of a cluster of one, the broker's own error (not a
    cluster's "no broker answers", nor "group ... is on no live broker")."""
    config = ClientConfig(broker=_nowhere(), timeout_s=2, retries=0)
    with Admin(config=config) as admin:
        assert admin.down_brokers() == {}
        for call in (admin.list_topics, admin.list_groups, lambda: admin.describe_group("g")):
            with pytest.raises(BrokerUnavailable) as raised:
                call()
            assert "no broker answers" not in str(raised.value)


def test_one_broker_views_are_whole(broker: BrokerProcess) -> None:
    """The same calls against a live broker: nothing left out, nothing down."""
    with Admin(broker.address) as admin:
        admin.create_topic("shape", queues=2)
        listed = [t for t in admin.list_topics() if t.name == "shape"]
        assert [len(t.queues) for t in listed] == [2]
        assert not listed[0].unreachable_brokers
        assert admin.down_brokers() == {}


def test_the_sinks_queue_column_asks_the_routes_which_group() -> None:
    """A queue column without a broker column: one broker's routes take the
    id alone; a cluster's refuse it, saying the broker column is needed."""
    fields = {"value": "binary", "queue": "int"}
    one = StaticRoutes(ClientConfig(broker=_nowhere()))
    cluster = NameServerRoutes(ClientConfig(namesrv=_nowhere()))
    try:
        check_schema(fields, "t", one.group)
        check_schema({**fields, "broker": "string"}, "t", cluster.group)
        with pytest.raises(InvalidRequest, match="needs a broker column") as raised:
            check_schema(fields, "t", cluster.group)
        assert str(raised.value) == QUEUE_COLUMN_NEEDS_BROKER
    finally:
        one.close()
        cluster.close()


def test_send_requests_pipelines_only_where_there_is_one_member() -> None:
    """``send_requests``' ``pipeline``: one broker's routes hand it every
    request and the broker's connection; a cluster's route and send each on
    its own (``send``, which fails over) and never pipeline."""
    requests: list[Routed] = [(pb.ProduceRequest(topic="t"), None) for _ in range(3)]
    sent: list[pb.ProduceRequest] = []

    def send(request: pb.ProduceRequest, brokers: Brokers) -> str:
        sent.append(request)
        return "sent"

    def pipeline(conn: Connection, given: Iterable[Routed]) -> Iterator[str]:
        yield from (f"{conn.config.target} piped" for _ in given)

    address = _nowhere()
    one = StaticRoutes(ClientConfig(broker=address))
    cluster = NameServerRoutes(ClientConfig(namesrv=_nowhere()))
    try:
        assert list(one.send_requests(requests, send, pipeline)) == [f"{address} piped"] * 3
        assert not sent
        assert list(cluster.send_requests(requests, send, pipeline)) == ["sent"] * 3
        assert sent == [r for r, _ in requests]
    finally:
        one.close()
        cluster.close()
