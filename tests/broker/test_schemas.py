"""Topic schemas on a real broker process: SetSchema, GetSchema, SetCompatibility,
DeleteSchemas (server/service_schemas.py), their errors, limits, restarts and auth."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from equeue_broker.server.stats import Counters, fill_stats
from equeue_broker.testing import BrokerProcess
from equeue_proto.protocol import ERROR_KIND_KEY
from equeue_proto.schema_rules import SCHEMA_INCOMPATIBLE, SCHEMA_INVALID, SCHEMA_VERSION_CONFLICT
from equeue_proto.v1 import broker_pb2 as pb
from equeue_proto.v1 import broker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(120)

StartBroker = Callable[..., BrokerProcess]
TOPIC = "orders"
ID = {"name": "id", "type": "long"}
NOTE = {"name": "note", "type": ["null", "string"], "default": None}
QTY = {"name": "qty", "type": "int"}


def avro(*fields: dict[str, Any]) -> str:
    return json.dumps({"type": "record", "name": "Order", "fields": list(fields)}, indent=2)


class Admin:
    """The Admin stub with one token (or none)."""

    def __init__(self, address: str, token: str = "") -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.AdminStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else None

    def __getattr__(self, method: str) -> Callable[..., Any]:
        call = getattr(self.stub, method)
        return lambda request: call(request, timeout=10, metadata=self.metadata)

    def refused(self, method: str, request: object) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as failure:
            getattr(self, method)(request)
        return failure.value

    def set(self, schema: str, **fields: Any) -> pb.SchemaInfo:
        reply: pb.SchemaInfo = self.SetSchema(
            pb.SetSchemaRequest(topic=fields.pop("topic", TOPIC), schema=schema, **fields)
        )
        return reply


def kind(error: grpc.RpcError) -> str:
    trailers: Any = error.trailing_metadata() or ()
    return next((str(value) for key, value in trailers if key == ERROR_KIND_KEY), "")


@pytest.fixture
def admin(broker: BrokerProcess) -> Iterator[Admin]:
    client = Admin(broker.address)
    client.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=2))
    yield client
    client.channel.close()


def test_versions_rules_and_equal_schemas(admin: Admin) -> None:
    first = admin.set(avro(ID), type=pb.SCHEMA_TYPE_AVRO)
    assert (first.created, first.latest_version, first.versions[0].version) == (True, 1, 1)
    assert first.compatibility == pb.COMPATIBILITY_BACKWARD
    assert first.versions[0].type == pb.SCHEMA_TYPE_AVRO
    assert first.versions[0].schema == json.dumps(
        json.loads(avro(ID)), sort_keys=True, separators=(",", ":")
    )
    second = admin.set(avro(ID, NOTE))  # the type guessed: a record is Avro
    assert (second.created, second.latest_version) == (True, 2)
    again = admin.set(avro(ID, NOTE))
    assert (again.created, again.versions[0].version) == (False, 2)
    # Incompatible: refused, naming the rule, the version and the field.
    error = admin.refused("SetSchema", pb.SetSchemaRequest(topic=TOPIC, schema=avro(ID, NOTE, QTY)))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert kind(error) == SCHEMA_INCOMPATIBLE
    details = str(error.details())
    assert "not BACKWARD compatible with version 2: /fields/2 (qty)" in details
    # Dry run: the problems in the reply, nothing registered.
    dry = admin.set(avro(ID, NOTE, QTY), dry_run=True)
    assert not dry.created and len(dry.problems) == 1 and "qty" in dry.problems[0]
    history = admin.GetSchema(pb.GetSchemaRequest(topic=TOPIC, history=True))
    assert [v.version for v in history.versions] == [1, 2]
    assert history.latest_version == 2 and history.broker_id
    # The rule NONE given with the schema lets it in.
    third = admin.set(avro(ID, NOTE, QTY), compatibility=pb.COMPATIBILITY_NONE)
    assert (third.created, third.latest_version, third.compatibility) == (
        True, 3, pb.COMPATIBILITY_NONE,
    )  # fmt: skip
    one = admin.GetSchema(pb.GetSchemaRequest(topic=TOPIC, version=1))
    assert [v.version for v in one.versions] == [1]
    latest = admin.GetSchema(pb.GetSchemaRequest(topic=TOPIC))
    assert [v.version for v in latest.versions] == [3]


def test_explicit_versions(admin: Admin) -> None:
    admin.set(avro(ID))
    same = admin.set(avro(ID), version=1)
    assert (same.created, same.versions[0].version) == (False, 1)
    error = admin.refused(
        "SetSchema", pb.SetSchemaRequest(topic=TOPIC, schema=avro(ID, NOTE), version=3)
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert kind(error) == SCHEMA_VERSION_CONFLICT
    assert "the next version is 2" in str(error.details())
    assert admin.set(avro(ID, NOTE), version=2).created


def test_json_schema_topic_and_key_subject(admin: Admin) -> None:
    # Closed: adding a property to an open writer is not BACKWARD (it may hold anything).
    closed = {"type": "object", "additionalProperties": False}
    v1 = json.dumps(closed | {"properties": {"id": {"type": "integer"}}})
    v2 = json.dumps(closed | {"properties": {"id": {"type": "integer"}, "n": {"type": "string"}}})
    assert admin.set(v1, key=True).versions[0].type == pb.SCHEMA_TYPE_JSON
    assert admin.set(v2, key=True, type=pb.SCHEMA_TYPE_JSON).latest_version == 2
    narrowed = json.dumps({"type": "object", "properties": {"id": {"type": "string"}}})
    error = admin.refused("SetSchema", pb.SetSchemaRequest(topic=TOPIC, key=True, schema=narrowed))
    assert kind(error) == SCHEMA_INCOMPATIBLE and "/properties/id" in str(error.details())
    # The value subject is apart.
    missing = admin.refused("GetSchema", pb.GetSchemaRequest(topic=TOPIC))
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    assert "topic orders has no value schema" in str(missing.details())


@pytest.mark.parametrize(
    ("request_fields", "code", "text"),
    [
        ({"schema": "{not json"}, grpc.StatusCode.INVALID_ARGUMENT, "not JSON"),
        ({"schema": ""}, grpc.StatusCode.INVALID_ARGUMENT, "empty"),
        (
            {"schema": '{"$schema": "https://json-schema.org/draft/2020-12/schema"}'},
            grpc.StatusCode.INVALID_ARGUMENT, "2020-12",
        ),
        ({"schema": "{}", "type": pb.SCHEMA_TYPE_PROTOBUF}, grpc.StatusCode.INVALID_ARGUMENT,
         "not supported yet"),
        ({"schema": '{"type": "record"}', "type": pb.SCHEMA_TYPE_AVRO},
         grpc.StatusCode.INVALID_ARGUMENT, "invalid Avro schema"),
        ({"schema": avro(ID), "topic": "nope"}, grpc.StatusCode.NOT_FOUND, "'nope' does not exist"),
    ],
)  # fmt: skip
def test_bad_requests(
    admin: Admin, request_fields: dict[str, Any], code: grpc.StatusCode, text: str
) -> None:
    fields = {"topic": TOPIC, **request_fields}
    error = admin.refused("SetSchema", pb.SetSchemaRequest(**fields))
    assert error.code() == code, error.details()
    assert text in str(error.details())
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        assert kind(error) == SCHEMA_INVALID


def test_get_errors(admin: Admin) -> None:
    error = admin.refused("GetSchema", pb.GetSchemaRequest(topic="nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    admin.set(avro(ID))
    error = admin.refused("GetSchema", pb.GetSchemaRequest(topic=TOPIC, version=7))
    assert error.code() == grpc.StatusCode.NOT_FOUND and "versions are 1 to 1" in str(
        error.details()
    )


def test_compatibility_and_delete(admin: Admin) -> None:
    admin.set(avro(ID))
    info = admin.SetCompatibility(
        pb.SetCompatibilityRequest(topic=TOPIC, compatibility=pb.COMPATIBILITY_FORWARD)
    )
    assert info.compatibility == pb.COMPATIBILITY_FORWARD and info.latest_version == 1
    # FORWARD: version 1 must read the new data; a new required field is fine.
    assert admin.set(avro(ID, QTY)).created
    error = admin.refused("SetCompatibility", pb.SetCompatibilityRequest(topic=TOPIC))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    admin.DeleteSchemas(pb.DeleteSchemasRequest(topic=TOPIC))
    assert admin.refused("GetSchema", pb.GetSchemaRequest(topic=TOPIC)).code() == (
        grpc.StatusCode.NOT_FOUND
    )
    error = admin.refused("DeleteSchemas", pb.DeleteSchemasRequest(topic=TOPIC, both=True))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    # Numbers are never given twice (records keep their headers): the history goes on.
    again = admin.set(avro(ID, NOTE))
    assert (again.latest_version, again.versions[0].version) == (3, 3)
    error = admin.refused("GetSchema", pb.GetSchemaRequest(topic=TOPIC, version=1))
    assert error.code() == grpc.StatusCode.NOT_FOUND and "versions are 3 to 3" in str(
        error.details()
    )


def test_dangerous_schemas_refused_before_anything_parses(admin: Admin) -> None:
    """Review findings 1, 4, 7, 8, 9: schemas clients could not use (or that cost the
    broker unbounded work) are refused INVALID_ARGUMENT / RESOURCE_EXHAUSTED, never
    INTERNAL."""
    endless = json.dumps({"type": "record", "name": "N", "fields": [{"name": "n", "type": "N"}]})
    bad_default = avro({"name": "a", "type": "int", "default": "x"})
    cycle = json.dumps({"definitions": {"a": {"$ref": "#/definitions/b"},
                        "b": {"$ref": "#/definitions/a"}}, "$ref": "#/definitions/a"})  # fmt: skip
    deep = "[" * 100_000 + "]" * 100_000
    cases = [
        (endless, pb.SCHEMA_TYPE_AVRO, "record N can never end"),
        (bad_default, pb.SCHEMA_TYPE_AVRO, "must match schema type"),
        (cycle, pb.SCHEMA_TYPE_JSON, "$ref cycle"),
        (json.dumps({"allOf": [{"$ref": "#"}]}), pb.SCHEMA_TYPE_JSON, "refers to itself"),
        (deep, pb.SCHEMA_TYPE_UNSPECIFIED, "nested too deeply"),
        (deep, pb.SCHEMA_TYPE_AVRO, "nested too deeply"),
        (deep, pb.SCHEMA_TYPE_JSON, "nested too deeply"),
    ]
    for text, type_, message in cases:
        error = admin.refused(
            "SetSchema", pb.SetSchemaRequest(topic=TOPIC, schema=text, type=type_)
        )
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (message, error.details())
        assert kind(error) == SCHEMA_INVALID and message in str(error.details())
    # Nullable recursion ends: a linked list is fine.
    linked = {"name": "next", "type": ["null", "N"], "default": None}
    assert admin.set(json.dumps({"type": "record", "name": "N", "fields": [linked]})).created
    # The size is held before compiling: 20,000 properties are refused at once.
    props = {f"p{i}": {"type": "string", "pattern": "^a+$"} for i in range(20_000)}
    big = json.dumps({"type": "object", "properties": props}, separators=(",", ":"))
    error = admin.refused("SetSchema", pb.SetSchemaRequest(topic=TOPIC, schema=big, key=True))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_schema_bytes" in str(error.details())


def test_explicit_version_above_the_next_only_without_versions(admin: Admin) -> None:
    """A subject without versions takes an explicit higher number (another broker
    group's numbering after a delete, a restore); one with versions does not."""
    done = admin.set(avro(ID), version=5)
    assert (done.created, done.latest_version, done.versions[0].version) == (True, 5, 5)
    error = admin.refused(
        "SetSchema", pb.SetSchemaRequest(topic=TOPIC, schema=avro(ID, NOTE), version=9)
    )
    assert kind(error) == SCHEMA_VERSION_CONFLICT and "the next version is 6" in str(
        error.details()
    )
    admin.DeleteSchemas(pb.DeleteSchemasRequest(topic=TOPIC))
    error = admin.refused(
        "SetSchema", pb.SetSchemaRequest(topic=TOPIC, schema=avro(ID, NOTE), version=3)
    )
    assert kind(error) == SCHEMA_VERSION_CONFLICT and "version 3 was given before" in str(
        error.details()
    )
    assert admin.set(avro(ID, NOTE)).latest_version == 6


def test_a_default_or_alias_is_a_new_version(admin: Admin) -> None:
    """Review finding 3: identity is the normalized text, not the canonical form."""
    assert admin.set(avro(ID)).latest_version == 1
    with_default = admin.set(avro({**ID, "default": 0}))
    assert (with_default.created, with_default.latest_version) == (True, 2)
    aliased = admin.set(avro({**ID, "default": 0, "aliases": ["ident"]}))
    assert (aliased.created, aliased.latest_version) == (True, 3)
    assert '"default":0' in admin.GetSchema(pb.GetSchemaRequest(topic=TOPIC)).versions[0].schema
    # A dry run reports the latest version that exists (review finding 15).
    bad = admin.set(avro(ID, QTY), dry_run=True)
    assert bad.problems and bad.latest_version == 3 and bad.versions[0].version == 4


def test_stats_count_subjects(admin: Admin) -> None:
    admin.set(avro(ID))
    admin.set(avro(ID), key=True)
    stats = admin.GetStats(pb.GetStatsRequest())
    assert stats.schema_subjects == 2
    assert "schemas" in stats.features and "fetch" not in stats.features
    assert stats.fetch_address == ""


def test_fetch_feature_follows_the_fetch_address() -> None:
    assert "fetch" not in fill_stats(pb.BrokerStats(), Counters()).features
    served = fill_stats(pb.BrokerStats(fetch_address="127.0.0.1:7001"), Counters())
    assert {"schemas", "fetch"} <= set(served.features)


def test_limits(broker_factory: StartBroker, tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("max_schema_bytes = 300\nmax_schema_versions = 2\n")
    broker = broker_factory("--config", str(config))
    admin = Admin(broker.address)
    admin.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=1))
    admin.set(avro(ID))
    admin.set(avro(ID, NOTE))
    extra = {"name": "x", "type": "int", "default": 0}
    error = admin.refused(
        "SetSchema", pb.SetSchemaRequest(topic=TOPIC, schema=avro(ID, NOTE, extra))
    )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_schema_versions=2" in str(error.details())
    big = avro(ID, {"name": "y", "type": "int", "doc": "d" * 300})
    error = admin.refused("SetSchema", pb.SetSchemaRequest(topic=TOPIC, key=True, schema=big))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_schema_bytes=300" in str(error.details())


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_restart_keeps_schemas_and_topic_delete_forgets(
    broker_factory: StartBroker, flush: str
) -> None:
    broker = broker_factory("--flush", flush)
    admin = Admin(broker.address)
    admin.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=1))
    admin.set(avro(ID))
    admin.set(avro(ID, NOTE))
    before = admin.GetSchema(pb.GetSchemaRequest(topic=TOPIC, history=True))
    broker.kill()  # SIGKILL: the schemas were saved before SetSchema answered
    broker.start()
    admin = Admin(broker.address)
    after = admin.GetSchema(pb.GetSchemaRequest(topic=TOPIC, history=True))
    assert after.versions == before.versions and after.incarnation == before.incarnation
    admin.DeleteTopic(pb.DeleteTopicRequest(name=TOPIC))
    admin.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=1))
    error = admin.refused("GetSchema", pb.GetSchemaRequest(topic=TOPIC))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "has no value schema" in str(error.details())


TOKENS = """
[[tokens]]
name = "ops"
secret = "ops-secret-0123456789ab"
roles = ["admin"]

[[tokens]]
name = "reader"
secret = "reader-secret-0123456789"
roles = ["consume"]
topics = ["orders*"]

[[tokens]]
name = "writer"
secret = "writer-secret-0123456789"
roles = ["produce"]
topics = ["audit"]
"""


def test_auth_consume_token_gets_but_does_not_set(
    broker_factory: StartBroker, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    broker = broker_factory("--tokens-file", str(tokens))
    ops = Admin(broker.address, "ops-secret-0123456789ab")
    ops.CreateTopic(pb.CreateTopicRequest(name=TOPIC, queue_count=1))
    ops.set(avro(ID))
    reader = Admin(broker.address, "reader-secret-0123456789")
    assert reader.GetSchema(pb.GetSchemaRequest(topic=TOPIC)).latest_version == 1
    for method, request in [
        ("SetSchema", pb.SetSchemaRequest(topic=TOPIC, schema=avro(ID, NOTE))),
        (
            "SetCompatibility",
            pb.SetCompatibilityRequest(topic=TOPIC, compatibility=pb.COMPATIBILITY_NONE),
        ),
        ("DeleteSchemas", pb.DeleteSchemasRequest(topic=TOPIC)),
    ]:
        error = reader.refused(method, request)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED, method
        assert "lacks role 'admin'" in str(error.details())
    # A producer of another topic may not read this one's schema.
    writer = Admin(broker.address, "writer-secret-0123456789")
    error = writer.refused("GetSchema", pb.GetSchemaRequest(topic=TOPIC))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
