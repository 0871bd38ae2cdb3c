"""Client side of topic schemas: encoding, checking and the Admin calls.

The pure paths (a schema version compiled, values checked and encoded, the
refusal's parts) need no broker; the rest run a real broker (and a cluster
of two broker groups)."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest

from equeue_proto.schema_rules import guess_type
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client.errors import (
    InvalidRequest,
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
from equeue_spark.client.schemas import Compiled, send_one

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
