"""Topic schemas travel with replication (docs/replication.md): with sync replication
SetSchema returns once the in-sync replica has the schema; a replica serves GetSchema
and refuses the writes; a promoted replica has the history and extends it; the old
master rejoining as a replica receives what was set while it was away; a replica
started later gets the whole document on its first reply."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from equeue_broker.testing import BrokerProcess
from equeue_proto.protocol import NOT_MASTER
from equeue_proto.v1 import broker_pb2 as pb
from tests.support.raw_client import RawClient, error_kind
from tests.support.waits import wait_for

TOPIC = "orders"
GROUP = "g"
ID = {"name": "id", "type": "long"}
NOTE = {"name": "note", "type": ["null", "string"], "default": None}
SIZE = {"name": "size", "type": "int", "default": 0}


def avro(*fields: dict[str, Any]) -> str:
    return json.dumps({"type": "record", "name": "Order", "fields": list(fields)})


def set_schema(client: RawClient, schema: str) -> pb.SchemaInfo:
    request = pb.SetSchemaRequest(topic=TOPIC, schema=schema)
    reply: pb.SchemaInfo = client.admin.SetSchema(request, timeout=10)
    return reply


def history(client: RawClient) -> list[tuple[int, str]]:
    request = pb.GetSchemaRequest(topic=TOPIC, history=True)
    reply = client.admin.GetSchema(request, timeout=10)
    return [(v.version, v.fingerprint) for v in reply.versions]


def try_history(client: RawClient) -> list[tuple[int, str]]:
    try:
        return history(client)
    except grpc.RpcError:
        return []


@contextmanager
def master_and_replica(
    tmp_path: Path, *master_flags: str
) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    common = ("--broker-name", GROUP, "--replica-lag-max-ms", "2000")
    master = BrokerProcess(tmp_path / "master", *common, *master_flags)
    replica: BrokerProcess | None = None
    try:
        address = master.start()
        replica = BrokerProcess(tmp_path / "replica", *common, "--role", "replica",
                                "--master", address)  # fmt: skip
        replica.start()
        yield master, replica
    finally:
        master.kill()
        if replica is not None:
            replica.kill()


@pytest.mark.timeout(180)
def test_sync_set_is_on_the_replica_and_survives_promotion(tmp_path: Path) -> None:
    with master_and_replica(tmp_path, "--replication", "sync") as (master, replica):
        m, r = RawClient(master.address), RawClient(replica.address)
        m.admin.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=1), timeout=10)
        wait_for("the replica in sync", lambda: len(m.stats().in_sync) == 2, 30)
        assert set_schema(m, avro(ID)).latest_version == 1
        # Sync replication: the replica applied it before SetSchema answered.
        assert history(r) == history(m)
        assert set_schema(m, avro(ID, NOTE)).latest_version == 2
        assert history(r) == history(m) and len(history(r)) == 2
        assert r.stats().schema_subjects == 1
        # A replica refuses the writes, naming its master.
        writes: list[tuple[str, Any]] = [
            ("SetSchema", pb.SetSchemaRequest(topic=TOPIC, schema=avro(ID, NOTE, SIZE))),
            ("SetCompatibility",
             pb.SetCompatibilityRequest(topic=TOPIC, compatibility=pb.COMPATIBILITY_NONE)),
            ("DeleteSchemas", pb.DeleteSchemasRequest(topic=TOPIC)),
        ]  # fmt: skip
        for method, request in writes:
            with pytest.raises(grpc.RpcError) as refused:
                getattr(r.admin, method)(request, timeout=10)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, method
            assert error_kind(refused.value) == NOT_MASTER
        before = history(m)
        master.kill()
        m.close()
        r.admin.SetRole(pb.SetRoleRequest(role="master", epoch=1), timeout=10)
        assert history(r) == before
        third = set_schema(r, avro(ID, NOTE, SIZE))
        assert (third.created, third.latest_version) == (True, 3)
        # The old master rejoins as a replica of the new one: it receives version 3.
        rejoined = BrokerProcess(master.data_dir, "--broker-name", GROUP, "--role", "replica",
                                 "--master", replica.address)  # fmt: skip
        try:
            old = RawClient(rejoined.start())
            wait_for("version 3 on the old master", lambda: try_history(old) == history(r), 30)
            old.close()
        finally:
            rejoined.kill()
        r.close()


@pytest.mark.timeout(120)
def test_a_replica_started_later_gets_every_schema(tmp_path: Path) -> None:
    with master_and_replica(tmp_path) as (master, replica):
        m = RawClient(master.address)
        m.admin.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=1), timeout=10)
        set_schema(m, avro(ID))
        key = pb.SetSchemaRequest(topic=TOPIC, key=True, schema='{"type": "string"}',
                                  type=pb.SCHEMA_TYPE_AVRO)  # fmt: skip
        m.admin.SetSchema(key, timeout=10)
        replica.kill()
        set_schema(m, avro(ID, NOTE))  # while the replica is away
        r = RawClient(replica.start())
        wait_for("the replica's schemas", lambda: try_history(r) == history(m), 30)
        got = r.admin.GetSchema(pb.GetSchemaRequest(topic=TOPIC, key=True), timeout=10)
        assert got.latest_version == 1
        # A deleted topic's schemas go on the replica too.
        m.admin.DeleteTopic(pb.DeleteTopicRequest(name=TOPIC), timeout=10)
        wait_for("the replica forgets them", lambda: r.stats().schema_subjects == 0, 30)
        m.close()
        r.close()
