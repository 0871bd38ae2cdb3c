"""valueFormat/keyFormat without a SparkSession: type mappings, the JSON
decoder's two paths, the decode stage's modes on synthetic batches, the
sink's checks and encoding."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DateType,
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from equeue_spark.client.errors import InvalidRequest
from equeue_spark.spark.arrow import arrow_schema
from equeue_spark.spark.decode import (
    ABSENT,
    MALFORMED,
    Decoder,
    decode_batches,
    header_versions,
)
from equeue_spark.spark.encode import check_struct, encode_batch
from equeue_spark.spark.errors import CorruptRecordError, InvalidOption, SchemaChanged
from equeue_spark.spark.format_options import FormatOptions
from equeue_spark.spark.formats import (
    DecodePlan,
    PartPlan,
    WriterSchema,
    json_spark_type,
    raw_schema,
    read_struct,
    resolve_plan,
)
from equeue_spark.spark.json_arrow import decode_json, decode_rows

# -- JSON Schema -> Spark --------------------------------------------------------

ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": ["string", "null"]},
        "price": {"type": "number"},
        "paid": {"type": "boolean"},
        "at": {"type": "string", "format": "date-time"},
        "day": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
        "addr": {"$ref": "#/definitions/addr"},
        "color": {"enum": ["red", "blue"]},
        "any": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
        "loose": {},
    },
    "definitions": {"addr": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def test_json_schema_types() -> None:
    kind = json_spark_type(ORDER)
    assert [(f.name, f.dataType) for f in kind.fields] == [
        ("id", LongType()),
        ("name", StringType()),
        ("price", DoubleType()),
        ("paid", BooleanType()),
        ("at", TimestampType()),
        ("day", DateType()),
        ("tags", ArrayType(StringType())),
        ("attrs", MapType(StringType(), LongType())),
        ("addr", StructType([StructField("city", StringType())])),
        ("color", StringType()),
        ("any", StringType()),
        ("loose", StringType()),
    ]
    assert all(f.nullable for f in kind.fields)


def test_json_schema_recursive_ref_is_text() -> None:
    node = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "child": {"$ref": "#/$defs/node"}},
    }
    kind = json_spark_type({**node, "$defs": {"node": node}})
    child = kind["child"].dataType
    assert isinstance(child, StructType)
    assert child["child"].dataType == StringType()  # the second level: JSON text


def test_json_schema_not_an_object_is_refused() -> None:
    with pytest.raises(InvalidOption, match="an object with properties"):
        json_spark_type({"type": "integer"})


# -- the JSON decoder ---------------------------------------------------------------

SIMPLE = pa.struct([("id", pa.int64()), ("name", pa.string()), ("tags", pa.list_(pa.int64()))])


def _both(values: list[bytes], kind: pa.StructType = SIMPLE) -> tuple[Any, Any]:
    array = pa.array(values, type=pa.binary())
    fast = decode_json(array, kind)
    slow = decode_rows(array, kind)
    return (fast[0].to_pylist(), fast[1]), (slow[0].to_pylist(), slow[1])


def test_json_fast_path_equals_row_path() -> None:
    values = [b'{"id":1,"name":"a","tags":[1,2]}', b'{"id":2,"extra":{"x":1}}', b"{}"]
    fast, slow = _both(values)
    assert fast == slow
    assert fast[0][0] == {"id": 1, "name": "a", "tags": [1, 2]}
    assert fast[0][1] == {"id": 2, "name": None, "tags": None}
    assert fast[1] == []


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (b'{"id":\n1}', None),  # a newline inside: row path, still good
        (b"", "empty value"),
        (b'{"id":1}{"id":2}', "not JSON: Extra data"),
        (b'{"id":"x"}', "/id: expected an integer, got a string"),
        (b"null", None),
        (b"[1]", "expected a JSON object, got an array"),
        (b'{"id":1.5}', "/id: expected an integer"),
        (b'{"name":5}', None),  # a number into a string field: its JSON text
        (b"\xff", "not UTF-8"),
        # a lone surrogate escape: a bad row, not a failed batch (UnicodeEncodeError)
        (b'{"name":"\\ud800"}', "/name: a string with a lone surrogate \\ud800"),
        (b'{"name":"\\ud83d\\ude00"}', None),  # a pair: one character
    ],
)
def test_json_bad_rows_are_found(bad: bytes, why: str | None) -> None:
    values = [b'{"id":1}', bad, b'{"id":3}']
    fast, slow = _both(values)
    assert fast == slow
    rows, reasons = fast
    assert rows[0] == {"id": 1, "name": None, "tags": None}
    assert rows[2] == {"id": 3, "name": None, "tags": None}
    if why is None:
        assert reasons == []
    else:
        assert len(reasons) == 1 and reasons[0][0] == 1 and why in reasons[0][1]
        assert rows[1] is None


def test_json_map_and_dates() -> None:
    kind = pa.struct(
        [
            ("attrs", pa.map_(pa.string(), pa.int64())),
            ("day", pa.date32()),
            ("at", pa.timestamp("us", tz="UTC")),
        ]
    )
    values = [b'{"attrs":{"a":1},"day":"2024-02-03","at":"2024-01-01T10:00:00+02:00"}']
    fast, slow = _both(values, kind)
    assert fast == slow
    row = fast[0][0]
    assert row["attrs"] == [("a", 1)]
    assert row["day"] == dt.date(2024, 2, 3)
    assert row["at"] == dt.datetime(2024, 1, 1, 8, tzinfo=dt.UTC)
    dates = pa.struct([("day", pa.date32()), ("at", pa.timestamp("us", tz="UTC"))])
    fast, slow = _both([b'{"day":"2024-02-03","at":"2024-01-01T00:00:00Z"}'], dates)
    assert fast == slow and fast[1] == []


# -- the decode stage -------------------------------------------------------------

JSON_V1 = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}})


def _plan(mode: str = "FAILFAST", fmt: str = "json", **kw: Any) -> DecodePlan:
    part = PartPlan("value", fmt, "JSON", JSON_V1, 1) if fmt == "json" else PartPlan("value", fmt)
    return DecodePlan((part,), mode=mode, **kw)


def _raw(
    values: list[bytes], versions: list[bytes | None], topic: str = "orders"
) -> pa.RecordBatch:
    n = len(values)
    schema = raw_schema()
    headers = [[] if v is None else [{"key": "equeue.schema", "value": v}] for v in versions]
    columns: dict[str, pa.Array] = {
        "key": pa.nulls(n, pa.binary()),
        "value": pa.array(values, pa.binary()),
        "topic": pa.array([topic] * n),
        "queue": pa.array([0] * n, pa.int32()),
        "offset": pa.array(range(100, 100 + n), pa.int64()),
        "message_id": pa.array([f"m{i}" for i in range(n)]),
        "broker": pa.array(["b"] * n),
        "timestampType": pa.array([0] * n, pa.int32()),
        "headers": pa.array(headers, schema.field("headers").type),
    }
    arrays = [columns.get(f.name, pa.nulls(n, f.type)) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _known(topic: str, version: int, key: bool) -> WriterSchema | None:
    return WriterSchema(version, "JSON", JSON_V1, "") if version <= 2 else None


def _decode(plan: DecodePlan, raw: pa.RecordBatch) -> list[dict[str, Any]]:
    decoder = Decoder(plan, arrow_schema(read_struct(plan)), "orders/0", _known)
    return [r for b in decode_batches(iter([raw]), decoder) for r in b.to_pylist()]


def test_versions_from_headers() -> None:
    raw = _raw([b"{}"] * 5, [b"1", None, b"x", b"12", b"99999999999"])
    versions = header_versions(raw.column("headers"), "equeue.schema")
    assert versions.tolist() == [1, ABSENT, MALFORMED, 12, MALFORMED]
    sliced = header_versions(raw.column("headers").slice(3), "equeue.schema")
    assert sliced.tolist() == [12, MALFORMED]


def test_failfast_names_the_record() -> None:
    raw = _raw([b'{"id":1}', b'{"id":"x"}'], [b"1", b"1"])
    with pytest.raises(CorruptRecordError) as caught:
        _decode(_plan(), raw)
    text = str(caught.value)
    assert "orders/0 offset 101 (message id m1)" in text
    assert "schema version 1" in text and "does not decode as JSON" in text
    assert "mode=PERMISSIVE keeps such records in _corrupt_record" in text
    with pytest.raises(CorruptRecordError) as caught:
        _decode(_plan(), _raw([b'{"id":1}'], [b"-1"]))
    assert "value written with a malformed schema version header does not decode" in str(
        caught.value
    )  # not "schema version -2" (the internal marker)


def test_permissive_fills_the_corrupt_column() -> None:
    raw = _raw([b'{"id":1}', b'{"id":"x"}', b'{"id":3}', b"{}"], [b"1", b"1", b"2", b"7"])
    rows = _decode(_plan("PERMISSIVE"), raw)
    assert [r["value"] for r in rows] == [{"id": 1}, None, {"id": 3}, None]
    assert [r["valueSchemaVersion"] for r in rows] == [1, 1, 2, 7]
    assert rows[0]["_corrupt_record"] is None
    corrupt = rows[1]["_corrupt_record"]
    assert corrupt["part"] == "value" and corrupt["bytes"] == b'{"id":"x"}'
    assert "expected an integer" in corrupt["error"]
    assert "no value schema version 7" in rows[3]["_corrupt_record"]["error"]


def test_dropmalformed_drops(caplog: pytest.LogCaptureFixture) -> None:
    raw = _raw([b'{"id":1}', b"\x02", b'{"id":3}'], [b"1", b"x", None])
    rows = _decode(_plan("DROPMALFORMED"), raw)
    assert [(r["offset"], r["value"], r["valueSchemaVersion"]) for r in rows] == [
        (100, {"id": 1}, 1),
        (102, {"id": 3}, None),
    ]
    assert "dropped 1 records" in caplog.text and "at offset 101" in caplog.text


def test_unknown_versions_are_asked_once_per_task() -> None:
    asked: list[int] = []

    def known(topic: str, version: int, key: bool) -> WriterSchema | None:
        asked.append(version)
        return _known(topic, version, key)

    plan = _plan("PERMISSIVE")
    decoder = Decoder(plan, arrow_schema(read_struct(plan)), "orders/0", known)
    raw = _raw([b"{}"] * 4, [b"7", b"8", b"7", b"2"])
    for _ in range(3):
        assert decoder.batch(raw).column("value").null_count == 3
    assert sorted(asked) == [2, 2, 2, 7, 8]  # found versions: the process cache's job


def test_restart_mode_stops_at_a_newer_version() -> None:
    raw = _raw([b'{"id":1}', b'{"id":2}'], [b"1", b"2"])
    with pytest.raises(SchemaChanged, match="version 2, newer than the query's version 1"):
        _decode(_plan(evolution_mode="restart"), raw)


def test_string_format_and_invalid_utf8() -> None:
    raw = _raw([b"ok", b"\xff\xfe"], [None, None])
    rows = _decode(_plan("PERMISSIVE", fmt="string"), raw)
    assert rows[0]["value"] == "ok" and rows[1]["value"] is None
    assert "not UTF-8" in rows[1]["_corrupt_record"]["error"]
    assert "valueSchemaVersion" not in rows[0]
    with pytest.raises(CorruptRecordError, match="does not decode as UTF-8"):
        _decode(_plan(fmt="string"), raw)


def test_read_schema_columns() -> None:
    plan = DecodePlan(
        (PartPlan("key", "string"), PartPlan("value", "json", "JSON", JSON_V1, 1)),
        mode="PERMISSIVE",
        corrupt_column="bad",
        include_headers=True,
    )
    names = read_struct(plan).names
    assert names[:11] == [f.name for f in raw_schema()][:11]
    assert names[11:] == ["valueSchemaVersion", "headers", "bad"]
    clash = DecodePlan(plan.parts, mode="PERMISSIVE", corrupt_column="topic")
    with pytest.raises(InvalidOption, match="columnNameOfCorruptRecord=topic"):
        read_struct(clash)


def test_several_topics_need_one_schema() -> None:
    texts = {"a": JSON_V1, "b": json.dumps({"type": "object", "properties": {}})}

    def fetch(topic: str, version: int, key: bool) -> WriterSchema:
        return WriterSchema(1, "JSON", texts[topic], topic)

    formats = FormatOptions(value_format="json")
    with pytest.raises(InvalidOption, match="give the reader schema with option valueSchema"):
        resolve_plan(formats, ("a", "b"), fetch)
    plan = resolve_plan(formats, ("a",), fetch)
    assert plan is not None and plan.parts[0].reader == JSON_V1
    with pytest.raises(InvalidOption, match="is JSON; use valueFormat=json"):
        resolve_plan(FormatOptions(value_format="avro"), ("a",), fetch)
    with pytest.raises(InvalidOption, match="topicPattern"):
        resolve_plan(formats, None, fetch)


# -- the sink ---------------------------------------------------------------------

AVRO_V1 = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "note", "type": ["null", "string"], "default": None},
        ],
    }
)


def test_sink_checks_fields_by_name() -> None:
    writer = WriterSchema(3, "AVRO", AVRO_V1, "")
    ok = pa.struct([("id", pa.int64())])
    check_struct(ok, writer, "value")
    with pytest.raises(InvalidRequest, match="field 'extra' that the topic's value schema v"):
        check_struct(pa.struct([("id", pa.int64()), ("extra", pa.int64())]), writer, "value")
    with pytest.raises(InvalidRequest, match="lacks field 'id', which has no default"):
        check_struct(pa.struct([("note", pa.string())]), writer, "value")
    with pytest.raises(InvalidRequest, match="must be a struct"):
        check_struct(pa.binary(), writer, "value")
    json_writer = WriterSchema(
        1, "JSON", json.dumps({**json.loads(JSON_V1), "required": ["id"]}), ""
    )
    with pytest.raises(InvalidRequest, match="which is required"):
        check_struct(pa.struct([]), json_writer, "value")


def test_sink_encodes_and_stamps_headers() -> None:
    import io

    import fastavro

    value = pa.array([{"id": 1, "note": "x"}, {"id": 2, "note": None}])
    headers = pa.array(
        [[{"key": "h", "value": b"1"}, {"key": "equeue.schema", "value": b"7"}], None],
        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
    )
    batch = pa.RecordBatch.from_arrays([value, headers], names=["value", "headers"])
    formats = FormatOptions(value_format="avro", value_schema=AVRO_V1, value_schema_version=3)
    out = encode_batch(batch, formats)
    parsed = fastavro.parse_schema(json.loads(AVRO_V1))
    decoded = [
        fastavro.schemaless_reader(io.BytesIO(v), parsed, parsed)
        for v in out.column("value").to_pylist()
    ]
    assert decoded == [{"id": 1, "note": "x"}, {"id": 2, "note": None}]
    assert out.column("headers").to_pylist() == [  # the row's stale stamp (7) dropped
        [{"key": "h", "value": b"1"}, {"key": "equeue.schema", "value": b"3"}],
        [{"key": "equeue.schema", "value": b"3"}],
    ]
    bad = pa.RecordBatch.from_arrays([pa.array([{"id": None}], pa.struct([("id", pa.int64())]))],
                                     names=["value"])  # fmt: skip
    with pytest.raises(InvalidRequest, match="row 0 of a batch: column value does not encode"):
        encode_batch(bad, formats)
    as_json = FormatOptions(value_format="json", value_schema=JSON_V1, value_schema_version=1)
    out = encode_batch(batch.select(["value"]), as_json)
    assert out.column("value").to_pylist() == [b'{"id":1,"note":"x"}', b'{"id":2}']


def test_sink_refuses_rows_the_schema_does_not_take() -> None:
    """The sink writes nothing a reader would find corrupt: fastavro's writer does
    not range-check ints, and JSON was not validated at all."""
    avro_int = json.dumps({"type": "record", "name": "R", "fields": [{"name": "n", "type": "int"}]})
    formats = FormatOptions(value_format="avro", value_schema=avro_int, value_schema_version=1)
    big = pa.RecordBatch.from_arrays([pa.array([{"n": 1}, {"n": 2**40}])], names=["value"])
    with pytest.raises(InvalidRequest, match=r"row 1 of a batch: .*R\.n is <1099511627776>"):
        encode_batch(big, formats)
    schema = json.dumps(
        {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "x": {"type": "number"}},
            "required": ["id"],
        }
    )
    as_json = FormatOptions(value_format="json", value_schema=schema, value_schema_version=1)
    rows: dict[str, dict[str, Any]] = {
        "must contain ['id']": {"id": None, "x": 1.0},
        "must be integer": {"id": "abc", "x": 1.0},
        "Out of range float values are not JSON compliant": {"id": 1, "x": float("nan")},
    }
    for why, row in rows.items():
        kind = pa.struct([("id", pa.string() if row["id"] == "abc" else pa.int64()),
                          ("x", pa.float64())])  # fmt: skip
        batch = pa.RecordBatch.from_arrays([pa.array([row], kind)], names=["value"])
        with pytest.raises(InvalidRequest, match=f"row 0 of a batch: .*{re.escape(why)}"):
            encode_batch(batch, as_json)


def test_sink_encodes_maps() -> None:
    """A Spark map arrives as (key, value) pairs: written as an Avro map and a
    JSON object, empty ones too (they were refused: "expected a map")."""
    import io

    import fastavro

    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "m", "type": {"type": "map", "values": "long"}},
            {"name": "a", "type": {"type": "array", "items": {"type": "map", "values": "string"}}},
        ],
    }
    kind = pa.struct(
        [
            ("m", pa.map_(pa.string(), pa.int64())),
            ("a", pa.list_(pa.map_(pa.string(), pa.string()))),
        ]
    )
    rows = [{"m": [("k", 1)], "a": [[("x", "y")], []]}, {"m": [], "a": []}]
    batch = pa.RecordBatch.from_arrays([pa.array(rows, kind)], names=["value"])
    text = json.dumps(schema)
    out = encode_batch(batch, FormatOptions(value_format="avro", value_schema=text))
    parsed = fastavro.parse_schema(schema)
    assert [
        fastavro.schemaless_reader(io.BytesIO(v), parsed, None)
        for v in out.column("value").to_pylist()
    ] == [{"m": {"k": 1}, "a": [{"x": "y"}, {}]}, {"m": {}, "a": []}]
    as_json = json.dumps(
        {
            "type": "object",
            "properties": {
                "m": {"type": "object", "additionalProperties": {"type": "integer"}},
                "a": {"type": "array", "items": {"type": "object"}},
            },
        }
    )
    out = encode_batch(batch, FormatOptions(value_format="json", value_schema=as_json))
    assert out.column("value").to_pylist() == [
        b'{"m":{"k":1},"a":[{"x":"y"},{}]}',
        b'{"m":{},"a":[]}',
    ]


def test_sink_writes_back_unions_read_as_structs() -> None:
    """A union Spark reads as struct<member0, member1> (avro_arrow_type) is
    written back as its non-null member: read -> write round trips."""
    import io

    import fastavro

    from equeue_spark.spark.avro_arrow import avro_arrow_type

    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "u", "type": ["null", "string", "long"]},
            {"name": "l", "type": {"type": "array", "items": ["int", "string"]}},
            {"name": "n", "type": ["null", "long"], "default": None},
        ],
    }
    text = json.dumps(schema)
    rows = [
        {"u": {"member0": None, "member1": 7}, "l": [{"member0": 1, "member1": None},
                                                    {"member0": None, "member1": "x"}], "n": 3},
        {"u": None, "l": [], "n": None},
    ]  # fmt: skip
    batch = pa.RecordBatch.from_arrays([pa.array(rows, avro_arrow_type(text))], names=["value"])
    out = encode_batch(batch, FormatOptions(value_format="avro", value_schema=text))
    parsed = fastavro.parse_schema(schema)
    assert [
        fastavro.schemaless_reader(io.BytesIO(v), parsed, None)
        for v in out.column("value").to_pylist()
    ] == [{"u": 7, "l": [1, "x"], "n": 3}, {"u": None, "l": [], "n": None}]


AVRO_V0 = json.dumps(
    {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}
)


def _avro(schema: str, datum: dict[str, Any]) -> bytes:
    import io

    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(json.loads(schema)), datum)
    return out.getvalue()


def test_avro_versions_resolve_into_the_reader() -> None:
    """v1 reader: v2 records drop the new field; a truncated v1 record is bad."""

    def writers(topic: str, version: int, key: bool) -> WriterSchema | None:
        return {
            1: WriterSchema(1, "AVRO", AVRO_V0, ""),
            2: WriterSchema(2, "AVRO", AVRO_V1, ""),
        }.get(version)

    plan = DecodePlan((PartPlan("value", "avro", "AVRO", AVRO_V0, 1),), mode="PERMISSIVE")
    values = [_avro(AVRO_V0, {"id": 1}), _avro(AVRO_V1, {"id": 2, "note": "x"}), b"", b"\x02"]
    raw = _raw([*values, _avro(AVRO_V0, {"id": 5})], [b"1", b"2", b"1", b"2", None])
    decoder = Decoder(plan, arrow_schema(read_struct(plan)), "orders/0", writers)
    rows = [r for b in decode_batches(iter([raw]), decoder) for r in b.to_pylist()]
    assert [r["value"] for r in rows] == [{"id": 1}, {"id": 2}, None, None, {"id": 5}]
    assert [r["valueSchemaVersion"] for r in rows] == [1, 2, 1, 2, None]
    assert [r["_corrupt_record"]["bytes"] for r in rows[2:4]] == [b"", b"\x02"]
    with pytest.raises(CorruptRecordError, match=r"offset 102 .* schema version 1 does not decode"):
        _decode_with(DecodePlan(plan.parts), raw, writers)


def _decode_with(plan: DecodePlan, raw: pa.RecordBatch, writers: Any) -> list[Any]:
    decoder = Decoder(plan, arrow_schema(read_struct(plan)), "orders/0", writers)
    return [r for b in decode_batches(iter([raw]), decoder) for r in b.to_pylist()]


def test_key_format_uses_the_key_header_and_keeps_keyless_rows() -> None:
    plan = DecodePlan(
        (PartPlan("key", "json", "JSON", JSON_V1, 1), PartPlan("value", "string")),
        mode="PERMISSIVE",
    )
    raw = _raw([b"a", b"b", b"c"], [None, None, None])
    keys = pa.array([b'{"id":1}', None, b'{"id":"x"}'], pa.binary())
    headers = pa.array(
        [
            [{"key": "equeue.key-schema", "value": b"1"}],
            [],
            [{"key": "equeue.schema", "value": b"1"}],
        ],
        raw.schema.field("headers").type,
    )
    raw = raw.set_column(0, raw.schema.field("key"), keys)
    raw = raw.set_column(
        raw.schema.get_field_index("headers"), raw.schema.field("headers"), headers
    )
    rows = _decode(plan, raw)
    assert [r["key"] for r in rows] == [{"id": 1}, None, None]
    assert [r["keySchemaVersion"] for r in rows] == [1, None, None]
    assert [r["value"] for r in rows] == ["a", "b", "c"]
    assert rows[1]["_corrupt_record"] is None  # no key: null, not corrupt
    assert rows[2]["_corrupt_record"]["part"] == "key"


def test_sink_encodes_keys_with_the_key_header() -> None:
    keys = pa.array([{"id": 1}, None], pa.struct([("id", pa.int64())]))
    batch = pa.RecordBatch.from_arrays([pa.array([b"a", b"b"]), keys], names=["value", "key"])
    formats = FormatOptions(key_format="json", key_schema=JSON_V1, key_schema_version=4)
    out = encode_batch(batch, formats)
    assert out.column("key").to_pylist() == [b'{"id":1}', None]  # no key stays no key
    assert out.column("value").to_pylist() == [b"a", b"b"]
    assert out.column("headers").to_pylist() == [
        [{"key": "equeue.key-schema", "value": b"4"}],
        [],
    ]


def test_several_topics_number_the_reader_schema_each_their_own_way() -> None:
    """a's latest is its v1 and b's latest its v2, the same schema: b's v1 (another
    schema) is fetched and resolved, never taken for the reader; restart compares
    each topic's record versions with that topic's number for the reader."""
    import io

    import fastavro

    reader = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}]}
    older = {**reader, "fields": [{"name": "tag", "type": "string"}, *reader["fields"]]}
    registry = {("a", 1): json.dumps(reader), ("b", 1): json.dumps(older),
                ("b", 2): json.dumps(reader)}  # fmt: skip

    def fetch(topic: str, version: int, key: bool) -> WriterSchema:
        version = version or max(v for t, v in registry if t == topic)
        text = registry[topic, version]
        return WriterSchema(version, "AVRO", text, text)

    def lookup(topic: str, version: int, key: bool) -> WriterSchema | None:
        return fetch(topic, version, key) if (topic, version) in registry else None

    def encoded(schema: dict[str, Any], datum: dict[str, Any]) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, fastavro.parse_schema(schema), datum)
        return out.getvalue()

    plan = resolve_plan(FormatOptions(value_format="avro", mode="PERMISSIVE"), ("a", "b"), fetch)
    assert plan is not None and plan.parts[0].topic_versions == (("a", 1), ("b", 2))
    schema = arrow_schema(read_struct(plan))
    values = [encoded(older, {"tag": "x", "id": 5}), encoded(reader, {"id": 6}), b"\x02"]
    rows = (
        Decoder(plan, schema, "b/0", lookup)
        .batch(_raw(values, [b"1", b"2", b"3"], topic="b"))
        .to_pylist()
    )
    assert [r["value"] for r in rows] == [{"id": 5}, {"id": 6}, None]
    assert "no value schema version 3 for topic b" in rows[2]["_corrupt_record"]["error"]
    restart = dataclasses.replace(plan, evolution_mode="restart")
    two = _raw(values[:2], [b"1", b"2"], topic="b")
    assert Decoder(restart, schema, "b/0", lookup).batch(two).num_rows == 2
    with pytest.raises(SchemaChanged, match="version 2, newer than the query's version 1"):
        Decoder(restart, schema, "a/0", lookup).batch(_raw(values[1:2] * 2, [b"1", b"2"], "a"))
