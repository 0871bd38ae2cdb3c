"""Client side of topic schemas: encoding, checking and the Admin calls.

The pure paths (a schema version compiled, values checked and encoded, the
refusal's parts) need no broker; the rest run a real broker (and a cluster
of two broker groups)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest

from equeue_broker.testing import BrokerProcess, LocalCluster
from equeue_proto.schema_rules import KEY_SCHEMA_HEADER, SCHEMA_HEADER, guess_type
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.cli import main
from equeue_spark.client import Admin, Producer
from equeue_spark.client.errors import (
    InvalidRequest,
    NotFoundError,
    SchemaConflictError,
    SchemaIncompatibleError,
    SchemaValidationError,
    problem_lines,
)
from equeue_spark.client.schema_admin import (
    rule_name,
    rule_value,
    schema_text,
    schema_type,
)
from equeue_spark.client.schemas import Compiled, SchemaCache, Serializer, send_one
from tests.support.waits import wait_for

ORDER_V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}
ORDER_V2: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
ORDER_V3_BAD: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "fields": [*ORDER_V2["fields"], {"name": "qty", "type": "int"}],
}
ORDER_JSON: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
    "required": ["id"],
}


def normalized(doc: object) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def compiled(doc: object, kind: pb.SchemaType = pb.SCHEMA_TYPE_AVRO, version: int = 1) -> Compiled:
    return Compiled.of(
        pb.SchemaVersion(version=version, type=kind, schema=normalized(doc), fingerprint="f")
    )


def avro_bytes(doc: dict[str, Any], datum: object) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(doc), datum)
    return out.getvalue()


# -- pure: no broker ------------------------------------------------------------------------


def test_avro_value_checked_by_decoding_all_of_it() -> None:
    schema = compiled(ORDER_V1)
    good = avro_bytes(ORDER_V1, {"id": 7, "name": "seven"})
    assert schema.problem(good) == ""
    assert "left over" in schema.problem(good + b"\x00")
    assert "not Avro" in schema.problem(good[:-2])
    assert "not Avro" in schema.problem(b"")


def test_avro_encode_and_refusal() -> None:
    schema = compiled(ORDER_V1)
    data, problem = schema.encode({"id": 1, "name": "one"})
    assert problem == "" and data == avro_bytes(ORDER_V1, {"id": 1, "name": "one"})
    data, problem = schema.encode({"id": "x", "name": "one"})
    assert data == b"" and "cannot be written" in problem
    assert "more fields" in schema.encode({"id": 1, "name": "one", "extra": 2})[1]  # not dropped
    assert "missing" in schema.encode({"id": 1})[1]
    defaulted = compiled(ORDER_V2).encode({"id": 1, "name": "one"})  # note has a default
    assert defaulted == (avro_bytes(ORDER_V2, {"id": 1, "name": "one", "note": None}), "")


def test_avro_encode_refuses_numbers_out_of_range() -> None:
    """fastavro writes an int field's 2**40 unchecked; readers would refuse the record."""
    schema = compiled({"type": "record", "name": "r", "fields": [{"name": "n", "type": "int"}]})
    data, problem = schema.encode({"n": 2**40})
    assert data == b"" and "cannot be written" in problem
    assert schema.encode({"n": 2**31 - 1})[1] == ""


def test_json_value_checked_and_encoded() -> None:
    schema = compiled(ORDER_JSON, pb.SCHEMA_TYPE_JSON, version=3)
    assert schema.type == "JSON"
    assert schema.problem(b'{"id": 1, "name": "a"}') == ""
    assert "integer" in schema.problem(b'{"id": "x"}')
    assert "not JSON" in schema.problem(b"{")
    assert "id" in schema.problem(b"{}")
    data, problem = schema.encode({"id": 2})
    assert (data, problem) == (b'{"id":2}', "")
    assert schema.encode({"name": "no id"})[1]


def test_json_values_are_strict_rfc8259() -> None:
    """Review finding 10: NaN/Infinity, UTF-16, a BOM, duplicate keys and deep
    nesting are not "valid" JSON values; encoding never writes NaN."""
    schema = compiled(
        {"type": "object", "properties": {"n": {"type": "number"}}}, pb.SCHEMA_TYPE_JSON
    )
    assert schema.problem(b'{"n": 1}') == ""
    assert "NaN is not JSON" in schema.problem(b'{"n":NaN}')
    assert "Infinity is not JSON" in schema.problem(b'{"n":Infinity}')
    assert "-Infinity is not JSON" in schema.problem(b'{"n":-Infinity}')
    assert "not UTF-8" in schema.problem('{"n":1}'.encode("utf-16"))
    assert "byte order mark" in schema.problem(b'\xef\xbb\xbf{"n":1}')
    assert "appears twice" in schema.problem(b'{"n":"x","n":1}')
    assert "nested too deeply" in schema.problem(b'{"d":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert schema.problem(bytearray(b'{"n": 1}')) == ""
    assert "send_batch takes encoded values" in schema.problem({"n": 1})
    data, problem = schema.encode({"n": float("nan")})
    assert data == b"" and "not JSON-serializable" in problem


def test_unusable_versions_from_a_broker_are_refused_not_crashed() -> None:
    """Review findings 1, 8, 9: a version an older broker accepted (no finite value,
    a default of the wrong type, a $ref cycle) is an error naming it, not a SIGSEGV
    or a RecursionError on the first value."""
    endless = {"type": "record", "name": "N", "fields": [{"name": "n", "type": "N"}]}
    with pytest.raises(InvalidRequest, match=r"version 4 .* record N can never end"):
        compiled(endless, version=4)
    bad_default = {
        "type": "record",
        "name": "A",
        "fields": [{"name": "a", "type": "int", "default": "x"}],
    }
    with pytest.raises(InvalidRequest, match="cannot be used"):
        compiled(bad_default)
    with pytest.raises(InvalidRequest, match=r"\$ref cycle"):
        compiled({"$ref": "#"}, pb.SCHEMA_TYPE_JSON)


def test_validation_error_names_topic_index_and_version() -> None:
    exc = SchemaValidationError("orders", 4, 2, "bad field")
    assert (exc.topic, exc.index, exc.version, exc.reason) == ("orders", 4, 2, "bad field")
    assert "orders" in str(exc) and "message 4" in str(exc) and "version 2" in str(exc)
    assert "key schema" in str(SchemaValidationError("orders", 0, 1, "x", key=True))


def test_send_without_validation_takes_bytes_only() -> None:
    assert send_one(None, "t", b"v", None, ()) == (b"v", None, ())
    with pytest.raises(TypeError, match="validate=True"):
        send_one(None, "t", {"id": 1}, None, ())


def test_type_guess_and_names() -> None:
    assert guess_type(json.dumps(ORDER_V1)) == "AVRO"
    assert guess_type('"string"') == "AVRO"
    assert guess_type(json.dumps(ORDER_JSON)) == "JSON"
    ambiguous = '{"type": "string"}'  # both an Avro and a JSON Schema
    with pytest.raises(ValueError):
        guess_type(ambiguous)
    with pytest.raises(InvalidRequest, match="give the type"):
        schema_type(ambiguous, "")
    with pytest.raises(InvalidRequest, match="avro or json"):
        schema_type("{}", "protobuf")
    assert schema_type("{}", "json") == pb.SCHEMA_TYPE_JSON
    assert schema_text({"type": "string"}) == '{"type": "string"}'
    assert rule_name(rule_value("backward_transitive")) == "BACKWARD_TRANSITIVE"
    with pytest.raises(InvalidRequest, match="FULL_TRANSITIVE"):
        rule_value("sideways")


def test_incompatible_refusal_lists_problems() -> None:
    text = "schema for orders (value) is not BACKWARD compatible:\n  a\n  b"
    assert problem_lines(text) == ["a", "b"]
    assert SchemaIncompatibleError(text).problems == ["a", "b"]
    assert problem_lines("one line") == ["one line"]
    assert problem_lines(text + " (FAILED_PRECONDITION)") == ["a", "b"]


# -- a real broker ------------------------------------------------------------------------


def end_offset(admin: Admin, topic: str) -> int:
    return sum(q.end_offset for q in admin.describe_topic(topic).queues)


def test_set_and_get_on_one_broker(broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("orders", queues=1)
        first = admin.set_schema("orders", ORDER_V1)
        assert first.created and first.versions[0].version == 1
        assert rule_name(first.compatibility) == "BACKWARD"
        second = admin.set_schema("orders", json.dumps(ORDER_V2, indent=4), type="avro")
        assert second.created and second.versions[0].version == 2
        again = admin.set_schema("orders", ORDER_V2)  # same schema: that version, nothing new
        assert not again.created and again.versions[0].version == 2
        check = admin.set_schema("orders", ORDER_V3_BAD, dry_run=True)
        assert check.problems and any("qty" in p for p in check.problems)
        with pytest.raises(SchemaIncompatibleError) as refused:
            admin.set_schema("orders", ORDER_V3_BAD)
        assert any("qty" in p and "version 2" in p for p in refused.value.problems)
        history = admin.get_schema("orders", history=True)
        assert [v.version for v in history.versions] == [1, 2]
        assert history.versions[1].schema == normalized(ORDER_V2)
        assert admin.get_schema("orders", 1).versions[0].schema == normalized(ORDER_V1)
        assert admin.get_schema("orders").versions[0].version == 2
        with pytest.raises(NotFoundError):
            admin.get_schema("orders", key=True)
        loose = admin.set_schema("orders", ORDER_V3_BAD, compatibility="NONE")
        assert loose.versions[0].version == 3 and rule_name(loose.compatibility) == "NONE"
        assert admin.set_compatibility("orders", "full").compatibility == pb.COMPATIBILITY_FULL
        assert admin.delete_schemas("orders") == []
        with pytest.raises(NotFoundError):
            admin.get_schema("orders")


def test_validating_producer_stamps_versions_and_refuses_bad_values(
    broker: BrokerProcess,
) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("orders", queues=1)
        admin.create_topic("plain", queues=1)
        admin.set_schema("orders", ORDER_V1)
        admin.set_schema("orders", ORDER_V2)
        admin.set_schema("orders", {"type": "string"}, type="avro", key=True)
        with Producer(broker.address, validate=True) as producer:
            good = [
                avro_bytes(ORDER_V2, {"id": i, "name": f"n{i}", "note": None}) for i in range(3)
            ]
            keys = [avro_bytes({"type": "string"}, f"k{i}") for i in range(3)]
            results = producer.send_batch("orders", good, keys=keys)
            message = admin.get_message_at("orders", 0, results[1].offset)
            assert message.header(SCHEMA_HEADER) == b"2"
            assert message.header(KEY_SCHEMA_HEADER) == b"1"
            before = end_offset(admin, "orders")
            bad = [good[0], good[1] + b"\x00", good[2]]
            with pytest.raises(SchemaValidationError) as refused:
                producer.send_batch("orders", bad, keys=keys)
            assert (refused.value.index, refused.value.version) == (1, 2)
            assert "message 1" in str(refused.value) and "version 2" in str(refused.value)
            with pytest.raises(SchemaValidationError) as bad_key:
                producer.send_batch("orders", good, keys=[keys[0], b"\xff", keys[2]])
            assert bad_key.value.key and bad_key.value.index == 1
            assert end_offset(admin, "orders") == before  # nothing of either batch stored
            sent = producer.send("orders", {"id": 9, "name": "nine", "note": "x"}).result()
            stored = admin.get_message_at("orders", 0, sent.offset)
            assert stored.header(SCHEMA_HEADER) == b"2"
            reader = Serializer(admin.routes, "orders", version=1)
            assert reader.decode(stored.value, 2) == {"id": 9, "name": "nine"}
            with pytest.raises(SchemaValidationError):
                producer.send("orders", {"id": "nine"})
            plain = producer.send_batch("plain", [b"anything"])  # no schema: no check, no header
            assert admin.get_message_at("plain", 0, plain[0].offset).header(SCHEMA_HEADER) is None
        with Producer(broker.address) as unchecked, pytest.raises(TypeError):
            unchecked.send("orders", {"id": 1, "name": "x"})


def test_cache_reads_again_after_the_topic_is_recreated(broker: BrokerProcess) -> None:
    """Review finding 2 (client): a recreated topic numbers from 1 again, so a
    long-lived cache must not decode its version 1 with the old topic's."""
    with Admin(broker.address) as admin:
        admin.create_topic("again", queues=1)
        admin.set_schema("again", ORDER_V1)
        admin.set_schema("again", {"type": "string"}, type="avro", key=True)
        cache = SchemaCache(admin.routes, refresh_s=0)
        assert cache.latest("again") is not None
        assert "string" in cache.get("again", 1, key=True).text
        admin.delete_topic("again")
        admin.create_topic("again", queues=1)
        other = {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "string"}]}
        admin.set_schema("again", other)
        admin.set_schema("again", {"type": "long"}, type="avro", key=True)
        # The value's refresh shows the new incarnation: the key's version 1 goes too.
        latest = cache.latest("again")
        assert latest is not None and latest.version == 1 and "Other" in latest.text
        assert "long" in cache.get("again", 1, key=True).text


def test_json_schema_topic(broker: BrokerProcess) -> None:
    with Admin(broker.address) as admin:
        admin.create_topic("events", queues=1)
        info = admin.set_schema("events", ORDER_JSON)
        assert info.versions[0].type == pb.SCHEMA_TYPE_JSON
        with Producer(broker.address, validate=True) as producer:
            results = producer.send_batch("events", [b'{"id": 1}', b'{"id": 2, "name": "b"}'])
            assert (
                admin.get_message_at("events", 0, results[0].offset).header(SCHEMA_HEADER) == b"1"
            )
            before = end_offset(admin, "events")
            with pytest.raises(SchemaValidationError) as refused:
                producer.send_batch("events", [b'{"id": 3}', b'{"id": "x"}'])
            assert refused.value.index == 1 and refused.value.version == 1
            assert end_offset(admin, "events") == before
            sent = producer.send("events", {"id": 4, "name": "d"}).result()
            stored = admin.get_message_at("events", 0, sent.offset)
            assert json.loads(stored.value) == {"id": 4, "name": "d"}
            # Not RFC 8259 JSON: refused, nothing sent (review finding 10).
            for bad in (b'{"id": NaN}', b'\xef\xbb\xbf{"id": 1}', '{"id": 1}'.encode("utf-16")):
                with pytest.raises(SchemaValidationError):
                    producer.send_batch("events", [bad])
            with pytest.raises(SchemaValidationError, match="not JSON-serializable"):
                producer.send("events", {"id": 5, "score": float("inf")})
            assert end_offset(admin, "events") == before + 1
        serializer = Serializer(admin.routes, "events")
        assert serializer.validate(b'{"id": 5}') == 1
        with pytest.raises(SchemaValidationError):
            serializer.validate(b"[]")


# -- a cluster of two broker groups -------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    started = LocalCluster(tmp_path, broker_flags=("--register-interval-ms", "300"))
    try:
        yield started.start(1, ("a", "b"))
    finally:
        started.kill()


def group_versions(cluster: LocalCluster, group: str) -> list[str]:
    """The fingerprints of the value schema history of one group, asked directly."""
    with Admin(cluster.brokers[group].address) as admin:
        try:
            return [v.fingerprint for v in admin.get_schema("orders", history=True).versions]
        except NotFoundError:
            return []


def route_versions(admin: Admin) -> dict[str, int]:
    route = admin.route("orders")
    return {b.broker_name: b.value_schema_version for b in route.brokers}


@pytest.mark.timeout(180)
def test_set_schema_over_two_groups_one_stopped_then_sync(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    with Admin(namesrv=cluster.namesrv) as admin:
        admin.create_topic("orders", queues=1)
        wait_for("both groups in the route", lambda: len(admin.route("orders").brokers) == 2)
        first = admin.set_schema("orders", ORDER_V1)
        assert first.created and first.versions[0].version == 1
        assert not first.unreachable_brokers
        assert group_versions(cluster, "a") == group_versions(cluster, "b") != []
        wait_for("routes to show v1", lambda: route_versions(admin) == {"a": 1, "b": 1})
        cache = SchemaCache(admin.routes)  # its own: trusts a latest version for 30 s ...
        assert (latest := cache.latest("orders")) is not None and latest.version == 1
        cluster.brokers["b"].kill()  # still registered (a clean stop unregisters)
        second = admin.set_schema("orders", ORDER_V2)
        assert second.created and second.versions[0].version == 2
        assert list(second.unreachable_brokers) == ["b"]
        assert admin.get_schema("orders").versions[0].version == 2  # from a, the newest
        wait_for("a's route to show v2", lambda: route_versions(admin)["a"] == 2)
        # ... unless the route shows a newer one: read again at once.
        assert (latest := cache.latest("orders")) is not None and latest.version == 2
        cluster.brokers["b"].start()  # ready: it answers (same address, same data)
        cluster.brokers["a"].kill()  # a holds v2 (its route says so), b only v1:
        with pytest.raises(SchemaConflictError, match="a holds version 2"):
            memo = {"name": "memo", "type": ["null", "string"], "default": None}
            other_v2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"], memo]}
            admin.set_schema("orders", other_v2)  # would be b's version 2, unlike a's
        cluster.brokers["a"].start()
        assert len(group_versions(cluster, "b")) == 1
        copied = admin.sync_schemas("orders")
        assert copied == {"value": {"b": [2]}, "key": {}, "value_rule": {}, "key_rule": {}}
        assert group_versions(cluster, "a") == group_versions(cluster, "b")
        assert len(group_versions(cluster, "a")) == 2
        assert not any(admin.sync_schemas("orders").values())
        wait_for("routes to show v2", lambda: route_versions(admin) == {"a": 2, "b": 2})
        assert main(["--namesrv", cluster.namesrv, "cluster", "routes", "orders"]) == 0
        shown = capsys.readouterr().out
        assert re.search(r"^a .* v2$", shown, re.M) and re.search(r"^b .* v2$", shown, re.M), shown
        again = admin.set_schema("orders", ORDER_V2)
        assert not again.created and again.versions[0].version == 2
        with pytest.raises(SchemaIncompatibleError) as refused:  # before anything is written
            admin.set_schema("orders", ORDER_V3_BAD)
        assert all(p.startswith("not BACKWARD compatible") for p in refused.value.problems)
        assert "FAILED_PRECONDITION" not in refused.value.problems[-1]
        assert len(group_versions(cluster, "a")) == len(group_versions(cluster, "b")) == 2
        # Histories that differ (not just lag) are refused, naming the groups.
        with Admin(cluster.brokers["b"].address) as only_b:
            only_b.delete_schemas("orders")
            only_b.set_schema("orders", ORDER_JSON)
        with pytest.raises(SchemaConflictError) as conflict:
            admin.set_schema("orders", ORDER_V2)
        assert set(conflict.value.histories) == {"a", "b"}
        # b's new schema is version 3: numbers are never given twice, even per group.
        assert "a: v1" in str(conflict.value) and "b: v3" in str(conflict.value)


@pytest.mark.timeout(180)
def test_groups_rules_and_numbering_after_delete(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Review finding 6: groups whose rules differ are refused before anything is
    written, naming the rules; sync copies the longest history's rule and versions;
    and after a delete every group continues the numbering (finding 2)."""
    with Admin(namesrv=cluster.namesrv) as admin:
        admin.create_topic("orders", queues=2)
        wait_for("both groups in the route", lambda: len(admin.route("orders").brokers) == 2)
        assert admin.set_schema("orders", ORDER_V1).versions[0].version == 1
        with Admin(cluster.brokers["a"].address) as only_a:
            only_a.set_compatibility("orders", "none")  # as if b was down for this call
        with pytest.raises(SchemaConflictError, match=r"rules differ \(a: NONE, b: BACKWARD\)"):
            admin.set_schema("orders", ORDER_V3_BAD)
        assert len(group_versions(cluster, "a")) == len(group_versions(cluster, "b")) == 1
        with pytest.raises(SchemaIncompatibleError) as refused:  # a rule given: checked
            admin.set_schema("orders", ORDER_V3_BAD, compatibility="backward")
        assert "broker 'a' (127.0.0.1:" in str(refused.value)  # the group and its address
        # The cluster-wide call goes to every group; then the rules agree again.
        info = admin.set_compatibility("orders", "none")
        assert not info.unreachable_brokers
        with Admin(cluster.brokers["b"].address) as only_b:
            assert only_b.get_schema("orders").compatibility == pb.COMPATIBILITY_NONE
            only_b.set_compatibility("orders", "full")
        # sync: a holds a longer history (rule NONE), b lags with rule FULL.
        with Admin(cluster.brokers["a"].address) as only_a:
            only_a.set_schema("orders", ORDER_V3_BAD)  # v2 on a only: NONE accepts it
        copied = admin.sync_schemas("orders")
        assert copied["value"] == {"b": [2]}
        assert copied["value_rule"] == {"b": [pb.COMPATIBILITY_NONE]}
        assert group_versions(cluster, "a") == group_versions(cluster, "b")
        # Delete on every group, then set: version 3 on both (never 1 again).
        admin.delete_schemas("orders")
        again = admin.set_schema("orders", ORDER_V2)
        assert again.versions[0].version == 3 and not again.unreachable_brokers
        for group in ("a", "b"):
            with Admin(cluster.brokers[group].address) as one:
                assert one.get_schema("orders").versions[0].version == 3
