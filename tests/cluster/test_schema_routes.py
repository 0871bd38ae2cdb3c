"""Schema versions and fetch addresses in name-server routes (namesrv/routes.py):
every registration carries each topic's latest value/key schema version and the
value's fingerprint, routes show them per broker group; ``fetch_addresses`` is
the master's fetch port first ("" when none), then the replicas' in
``replica_addresses`` order."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from equeue_broker.namesrv.routes import RouteTable
from equeue_broker.testing import BrokerProcess, LocalCluster
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc
from tests.support.raw_client import RawClient
from tests.support.waits import wait_for

TOPIC = "orders"
V1 = json.dumps({"type": "record", "name": "O", "fields": [{"name": "id", "type": "long"}]})
V2 = json.dumps({
    "type": "record", "name": "O",
    "fields": [{"name": "id", "type": "long"}, {"name": "n", "type": "int", "default": 0}],
})  # fmt: skip


def member(
    address: str, role: str, fetch: str = "", version: int = 0, fingerprint: str = ""
) -> pb.RegisterBrokerRequest:
    request = pb.RegisterBrokerRequest(
        cluster="c1", broker_name="g", address=address, role=role, epoch=1,
        instance_id=address, fetch_address=fetch,
    )  # fmt: skip
    request.topics.add(
        name=TOPIC, queues=[pb.RouteQueue(queue_id=0, writable=True)],
        value_schema_version=version, value_schema_fingerprint=fingerprint, key_schema_version=1,
    )  # fmt: skip
    return request


def test_route_fields_from_registrations() -> None:
    table = RouteTable(expiry_s=60)
    table.register(member("127.0.0.1:1", "master", "127.0.0.1:11", 3, "abcd"))
    table.register(member("127.0.0.1:3", "replica", ""))
    table.register(member("127.0.0.1:2", "replica", "127.0.0.1:12"))
    (entry,) = table.route(TOPIC).brokers
    assert list(entry.replica_addresses) == ["127.0.0.1:2", "127.0.0.1:3"]
    assert list(entry.fetch_addresses) == ["127.0.0.1:11", "127.0.0.1:12", ""]
    assert (entry.value_schema_version, entry.value_schema_fingerprint) == (3, "abcd")
    assert entry.key_schema_version == 1


def test_route_without_a_master_has_an_empty_first_fetch_address() -> None:
    table = RouteTable(expiry_s=60)
    table.register(member("127.0.0.1:2", "replica", "127.0.0.1:12", 2, "ef"))
    (entry,) = table.route(TOPIC).brokers
    assert entry.address == ""
    assert list(entry.fetch_addresses) == ["", "127.0.0.1:12"]
    assert entry.value_schema_version == 2  # a replica describes the group then


def test_a_bad_fetch_address_is_refused() -> None:
    table = RouteTable(expiry_s=60)
    with pytest.raises(Exception, match="fetch address 'nowhere' is not one HOST:PORT"):
        table.register(member("127.0.0.1:1", "master", "nowhere"))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    started = LocalCluster(tmp_path, broker_flags=("--register-interval-ms", "300"))
    try:
        yield started.start(1, ("a", "b"))
    finally:
        started.kill()


@pytest.mark.timeout(120)
def test_routes_show_each_groups_schema_versions(cluster: LocalCluster, tmp_path: Path) -> None:
    a, b = (RawClient(cluster.brokers[name].address) for name in ("a", "b"))
    replica = BrokerProcess(
        tmp_path / "broker-a-replica", "--broker-name", "a", "--namesrv", cluster.namesrv,
        "--register-interval-ms", "300", "--role", "replica", "--master", a.address,
    )  # fmt: skip
    try:
        replica.start()
        for client in (a, b):
            client.admin.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=1), timeout=10)
        a.admin.SetSchema(pb.SetSchemaRequest(topic=TOPIC, schema=V1), timeout=10)
        for schema in (V1, V2):
            b.admin.SetSchema(pb.SetSchemaRequest(topic=TOPIC, schema=schema), timeout=10)
        b.admin.SetSchema(pb.SetSchemaRequest(topic=TOPIC, schema='"string"', key=True), timeout=10)
        latest_b = b.admin.GetSchema(pb.GetSchemaRequest(topic=TOPIC), timeout=10).versions[0]
        with grpc.insecure_channel(cluster.namesrvs[0].address) as channel:
            names = pb_grpc.NameServerStub(channel)

            def routes() -> dict[str, pb.BrokerRoute]:
                route = names.GetRoute(pb.GetRouteRequest(topic=TOPIC), timeout=10)
                return {entry.broker_name: entry for entry in route.brokers}

            def shown() -> bool:
                got = routes()
                return (
                    set(got) == {"a", "b"}
                    and len(got["a"].replica_addresses) == 1
                    and got["a"].value_schema_version == 1
                    and got["b"].value_schema_version == 2
                    and got["b"].key_schema_version == 1
                )

            wait_for("the routes to show the versions", shown, 30)
            got = routes()
            assert got["b"].value_schema_fingerprint == latest_b.fingerprint
            assert got["a"].key_schema_version == 0
            # No fetch port here: the shape holds, every address empty.
            assert list(got["a"].fetch_addresses) == ["", ""]
            assert list(got["b"].fetch_addresses) == [""]
    finally:
        replica.kill()
        a.close()
        b.close()
