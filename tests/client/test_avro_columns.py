"""Avro values to Arrow columns: the C decoder (equeue_proto/_avro.c) against the
fastavro reference (client/avro_reference.py) on hypothesis-generated schemas and
datums, schema evolution (writer/reader pairs), damaged datums, slices and nulls;
Spark's types (avro_arrow_type, avro_spark_ddl)."""

from __future__ import annotations

import datetime
import io
import json
import math
import os
import subprocess
import sys
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from equeue_spark.client.avro_reference import decode_reference
from equeue_spark.spark import avro_arrow
from equeue_spark.spark.avro_arrow import avro_arrow_type, avro_spark_ddl, decode_avro

needs_c = pytest.mark.skipif(avro_arrow.IMPLEMENTATION != "c", reason="_avro not built")
EXAMPLES = int(os.environ.get("EQUEUE_AVRO_EXAMPLES", "60"))
"""Examples per property (60: a few seconds; a longer local hunt: 2000)."""
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TS_MILLIS = (-62135596800000, 253402300799999)

ORDER: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {
            "name": "status",
            "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID", "SHIPPED"]},
        },
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}


Batch = tuple[dict[str, Any], list[bytes]]


# ---- helpers ------------------------------------------------------------------


def encode(schema: Any, datums: list[Any]) -> list[bytes]:
    parsed = parse_schema(schema)
    out = []
    for datum in datums:
        buf = io.BytesIO()
        schemaless_writer(buf, parsed, datum)
        out.append(buf.getvalue())
    return out


def normal(v: Any) -> Any:
    """``v`` with NaN comparable (NaN != NaN) and map entries in order."""
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, dict):
        return {k: normal(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [normal(x) for x in v]
    return v


def decode_both(
    values: pa.Array, writer: Any, reader: Any
) -> tuple[pa.StructArray, list[tuple[int, str]]]:
    """Decode with C and the reference; they must agree on values and bad rows."""
    w, r = json.dumps(writer), json.dumps(reader)
    t = avro_arrow_type(r)
    ref, ref_bad = decode_reference(values.to_pylist(), w, r)
    assert ref.type == t
    assert all(" at byte " in reason for _, reason in ref_bad), ref_bad
    if avro_arrow.IMPLEMENTATION != "c":
        return ref, ref_bad
    out, bad = decode_avro(values, w, r, t)
    out.validate(full=True)
    assert out.type == t
    assert len(out) == len(values)
    assert [row for row, _ in bad] == [row for row, _ in ref_bad], (bad, ref_bad)
    assert normal(out.to_pylist()) == normal(ref.to_pylist())
    return out, bad


# ---- schemas and datums ----------------------------------------------------------

PRIMITIVES = ["boolean", "int", "long", "float", "double", "string", "bytes"]
LOGICAL: list[dict[str, Any]] = [
    {"type": "int", "logicalType": "date"},
    {"type": "long", "logicalType": "timestamp-millis"},
    {"type": "long", "logicalType": "timestamp-micros"},
    {"type": "long", "logicalType": "local-timestamp-millis"},
    {"type": "long", "logicalType": "local-timestamp-micros"},
    {"type": "string", "logicalType": "uuid"},
    {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
    {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 10},
]


class Names:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"


def a_type(draw: st.DrawFn, depth: int, names: Names) -> Any:
    kinds = ["prim", "prim", "logical", "enum", "fixed", "fixed_decimal", "nullable"]
    if depth < 3:
        kinds += ["array", "map", "record", "union", "pair"]
    kind = draw(st.sampled_from(kinds))
    if kind == "prim":
        return draw(st.sampled_from(PRIMITIVES))
    if kind == "logical":
        return dict(draw(st.sampled_from(LOGICAL)))
    if kind == "enum":
        symbols = draw(st.lists(st.sampled_from("ABCDEFG"), min_size=1, max_size=4, unique=True))
        return {"type": "enum", "name": names("E"), "symbols": symbols}
    if kind == "fixed":
        return {"type": "fixed", "name": names("F"), "size": draw(st.integers(1, 5))}
    if kind == "fixed_decimal":
        p = draw(st.integers(1, 38))
        return {"type": "fixed", "name": names("D"), "size": 16, "logicalType": "decimal",
                "precision": p, "scale": draw(st.integers(0, p))}  # fmt: skip
    if kind == "nullable":
        inner = a_type(draw, depth + 1, names) if depth < 3 else draw(st.sampled_from(PRIMITIVES))
        if isinstance(inner, list):
            return inner
        return ["null", inner] if draw(st.booleans()) else [inner, "null"]
    if kind == "array":
        return {"type": "array", "items": a_type(draw, depth + 1, names)}
    if kind == "map":
        return {"type": "map", "values": a_type(draw, depth + 1, names)}
    if kind == "record":
        return a_record(draw, depth + 1, names)
    if kind == "pair":
        return draw(st.sampled_from([["int", "long"], ["null", "float", "double"]]))
    # A general union: members of distinct Python types (the reference tells them apart so).
    # At most one of each promotable group: fastavro resolves a branch to the first reader
    # branch it can promote to, Java and the C decoder to the same type first.
    pool: list[Any] = ["boolean", draw(st.sampled_from(["long", "double"])),
                       draw(st.sampled_from(["string", "bytes"]))]  # fmt: skip
    members = draw(st.lists(st.sampled_from(pool), min_size=2, max_size=3, unique=True))
    if draw(st.booleans()):
        members.append({"type": "array", "items": a_type(draw, 3, names)})
    if draw(st.booleans()):
        members.append(a_record(draw, 3, names))
    members.sort(key=lambda m: m != "boolean")  # fastavro's writer: True is an int too
    return ["null", *members] if draw(st.booleans()) else members


def a_record(draw: st.DrawFn, depth: int, names: Names) -> dict[str, Any]:
    count = draw(st.integers(1, 5 if depth == 0 else 3))
    fields = [{"name": f"f{i}", "type": a_type(draw, depth, names)} for i in range(count)]
    return {"type": "record", "name": names("R"), "fields": fields}


def a_value(draw: st.DrawFn, t: Any) -> Any:
    if isinstance(t, list):
        branch = draw(st.sampled_from(t))
        return None if branch == "null" else a_value(draw, branch)
    name = t if isinstance(t, str) else t["type"]
    logical = "" if isinstance(t, str) else t.get("logicalType", "")
    if logical == "date":
        return draw(st.dates())
    if logical.endswith("millis"):
        return draw(st.integers(*TS_MILLIS))
    if logical.endswith("micros"):
        return draw(st.integers(TS_MILLIS[0] * 1000, TS_MILLIS[1] * 1000 + 999))
    if logical == "uuid":
        return str(draw(st.uuids()))
    if logical == "decimal":
        p, s = t["precision"], t["scale"]
        digits = draw(st.integers(0, 10**p - 1))
        sign = draw(st.integers(0, 1))
        return Decimal((sign, tuple(int(c) for c in str(digits)), -s))
    simple = {
        "boolean": st.booleans(),
        "int": st.integers(-(2**31), 2**31 - 1),
        "long": st.integers(-(2**63), 2**63 - 1),
        "float": st.floats(width=32, allow_nan=False),
        "double": st.floats(allow_nan=False),
        "string": st.text(max_size=8),
        "bytes": st.binary(max_size=8),
    }
    if name in simple:
        return draw(simple[name])
    if name == "enum":
        return draw(st.sampled_from(t["symbols"]))
    if name == "fixed":
        return draw(st.binary(min_size=t["size"], max_size=t["size"]))
    if name == "array":
        return [a_value(draw, t["items"]) for _ in range(draw(st.integers(0, 3)))]
    if name == "map":
        keys = draw(st.lists(st.text(max_size=4), max_size=3, unique=True))
        return {k: a_value(draw, t["values"]) for k in keys}
    return {f["name"]: a_value(draw, f["type"]) for f in t["fields"]}


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    schema = a_record(draw, 0, Names())
    datums = [a_value(draw, schema) for _ in range(draw(st.integers(1, 6)))]
    return schema, encode(schema, datums)


# ---- generated schemas -----------------------------------------------------------


@SETTINGS
@given(batches())
def test_generated_schemas_decode_as_fastavro_does(
    batch: Batch,
) -> None:
    schema, values = batch
    out, bad = decode_both(pa.array(values, pa.binary()), schema, schema)
    assert bad == []
    assert out.null_count == 0


@SETTINGS
@given(batches(), st.data())
def test_damaged_datums_are_bad_rows_in_both(batch: Batch, data: st.DataObject) -> None:
    """Truncated, extended and bit-flipped datums: the same bad rows, never a crash."""
    schema, values = batch
    damaged: list[bytes | None] = []
    for v in values:
        how = data.draw(st.sampled_from(["cut", "extend", "flip", "flip", "keep", "null"]))
        if how == "cut" and v:
            damaged.append(v[: data.draw(st.integers(0, len(v) - 1))])
        elif how == "extend":
            damaged.append(v + data.draw(st.binary(min_size=1, max_size=3)))
        elif how == "flip" and v:
            bit = data.draw(st.integers(0, 8 * len(v) - 1))
            flipped = bytearray(v)
            flipped[bit // 8] ^= 1 << (bit % 8)
            damaged.append(bytes(flipped))
        else:
            damaged.append(None if how == "null" else v)
    out, bad = decode_both(pa.array(damaged, pa.binary()), schema, schema)
    for row, reason in bad:
        assert " at byte " in reason
        assert not out[row].is_valid
    for row, maybe in enumerate(damaged):
        if maybe is None:
            assert not out[row].is_valid


@SETTINGS
@given(batches(), st.data())
def test_slices_and_large_binary(batch: Batch, data: st.DataObject) -> None:
    schema, values = batch
    whole = pa.array(
        [None, *values, None], pa.large_binary() if data.draw(st.booleans()) else pa.binary()
    )
    start = data.draw(st.integers(0, len(whole) - 1))
    part = whole.slice(start, data.draw(st.integers(0, len(whole) - start)))
    out, _ = decode_both(part, schema, schema)
    expected, _ = decode_both(whole, schema, schema)
    assert normal(out.to_pylist()) == normal(expected.slice(start, len(part)).to_pylist())


# ---- evolution -------------------------------------------------------------------

PROMOTE = {"int": ["long", "float", "double"], "long": ["float", "double"],
           "float": ["double"], "string": ["bytes"]}  # fmt: skip
"""bytes -> string too, but random bytes are not UTF-8: test_bytes_read_as_string."""
DEFAULTS: list[tuple[Any, Any]] = [
    ("int", 7),
    ("string", "dflt"),
    (["null", "string"], None),
    ({"type": "array", "items": "long"}, [1, 2]),
    ({"type": "map", "values": "double"}, {"k": 1.5}),
    ({"type": "enum", "name": "Added", "symbols": ["X", "Y"]}, "Y"),
    ({"type": "record", "name": "AddedRec", "fields": [{"name": "a", "type": "boolean"}]},
     {"a": True}),
]  # fmt: skip


@st.composite
def evolutions(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], list[bytes]]:
    writer = a_record(draw, 0, Names())
    fields = []
    for f in writer["fields"]:
        how = draw(st.sampled_from(["keep", "drop", "promote"]))
        if how == "drop":
            continue
        t = f["type"]
        if how == "promote" and isinstance(t, str) and t in PROMOTE:
            t = draw(st.sampled_from(PROMOTE[t]))
        fields.append({"name": f["name"], "type": t})
    for i, (added, default) in enumerate(draw(st.lists(st.sampled_from(DEFAULTS), max_size=3))):
        t = json.loads(json.dumps(added))
        if isinstance(t, dict) and "name" in t:
            t["name"] += str(i)
        fields.insert(
            draw(st.integers(0, len(fields))), {"name": f"new{i}", "type": t, "default": default}
        )
    if not fields:
        fields.append({"name": "only", "type": "int", "default": 0})
    reader = {**writer, "fields": fields}
    datums = [a_value(draw, writer) for _ in range(draw(st.integers(1, 4)))]
    return writer, reader, encode(writer, datums)


@SETTINGS
@given(evolutions())
def test_writer_reader_pairs_resolve_as_fastavro_does(
    pair: tuple[dict[str, Any], dict[str, Any], list[bytes]],
) -> None:
    writer, reader, values = pair
    out, bad = decode_both(pa.array(values, pa.binary()), writer, reader)
    assert bad == []
    assert [f.name for f in out.type] == [f["name"] for f in reader["fields"]]


def test_enum_symbols_resolve_by_name_with_the_readers_default() -> None:
    w_enum = {"type": "enum", "name": "S", "symbols": ["A", "B", "C"]}
    writer = {"type": "record", "name": "R", "fields": [{"name": "s", "type": w_enum}]}
    values = pa.array(encode(writer, [{"s": "C"}, {"s": "B"}]))
    with_default = {**w_enum, "symbols": ["B", "A"], "default": "A"}
    reader = {**writer, "fields": [{"name": "s", "type": with_default}]}
    out, bad = decode_both(values, writer, reader)
    assert out.to_pylist() == [{"s": "A"}, {"s": "B"}] and bad == []
    strict = {**w_enum, "symbols": ["B", "A"]}
    out, bad = decode_both(values, writer, {**writer, "fields": [{"name": "s", "type": strict}]})
    assert out.to_pylist() == [None, {"s": "B"}]
    assert [row for row, _ in bad] == [0]


def test_bytes_read_as_string_must_be_utf8() -> None:
    writer = {"type": "record", "name": "R", "fields": [{"name": "b", "type": "bytes"}]}
    values = pa.array(encode(writer, [{"b": "é".encode()}, {"b": b"\x80"}]))
    reader = {**writer, "fields": [{"name": "b", "type": "string"}]}
    out, bad = decode_both(values, writer, reader)
    assert out.to_pylist() == [{"b": "é"}, None]
    assert [row for row, _ in bad] == [1]
    assert "utf-8" in bad[0][1].lower()  # C: "invalid UTF-8 at byte 0 of 2"


def test_unions_resolve_by_branch() -> None:
    writer = {"type": "record", "name": "R", "fields": [{"name": "u", "type": ["int", "string"]}]}
    values = pa.array(encode(writer, [{"u": 3}, {"u": "x"}]))
    reader = {**writer, "fields": [{"name": "u", "type": ["null", "long"]}]}
    out, bad = decode_both(values, writer, reader)
    assert out.to_pylist() == [{"u": 3}, None]
    assert [row for row, _ in bad] == [1]
    both = {**writer, "fields": [{"name": "u", "type": ["string", "double"]}]}
    out, bad = decode_both(values, writer, both)
    assert out.to_pylist() == [
        {"u": {"member0": None, "member1": 3.0}},
        {"u": {"member0": "x", "member1": None}},
    ]


# ---- the fact-5 schema, bad rows named -------------------------------------------


def order_values() -> list[bytes]:
    ts = datetime.datetime(2026, 11, 27, tzinfo=datetime.UTC)
    return encode(ORDER, [
        {"id": i, "customer": f"cust-{i:05d}", "amount": i * 0.5, "ts": ts,
         "status": "PAID", "note": None if i % 2 else "x"}
        for i in range(4)
    ])  # fmt: skip


def test_order_schema_values_and_reasons() -> None:
    good = order_values()
    values = pa.array([good[0], good[1][:12], None, good[2] + b"\x00", good[3]], pa.binary())
    out, bad = decode_both(values, ORDER, ORDER)
    rows = out.to_pylist()
    assert rows[0] is not None and rows[0]["customer"] == "cust-00000" and rows[0]["note"] == "x"
    assert rows[0]["ts"] == datetime.datetime(2026, 11, 27, tzinfo=datetime.UTC)
    assert rows[1] is None and rows[2] is None and rows[3] is None
    assert rows[4] is not None and rows[4]["id"] == 3 and rows[4]["note"] is None
    assert bad == [
        (1, "unexpected end of data at byte 12 of 12"),  # the double after id, customer
        (3, f"1 bytes left over at byte {len(good[2])} of {len(good[2]) + 1}"),
    ]


def test_spark_types_of_every_avro_type() -> None:
    schema = {
        "type": "record",
        "name": "All",
        "fields": [
            {"name": "b", "type": "boolean"},
            {"name": "i", "type": "int"},
            {"name": "f", "type": "float"},
            {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A"]}},
            {"name": "x", "type": {"type": "fixed", "name": "X", "size": 2}},
            {"name": "d", "type": {"type": "int", "logicalType": "date"}},
            {"name": "t", "type": {"type": "long", "logicalType": "timestamp-micros"}},
            {"name": "lt", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
            {
                "name": "dec",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 3},
            },
            {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "a", "type": {"type": "array", "items": ["null", "bytes"]}},
            {"name": "m", "type": {"type": "map", "values": ["int", "long"]}},
            {"name": "g", "type": ["null", "int", "string"]},
            {"name": "fd", "type": ["double", "float"]},
        ],
    }
    text = json.dumps(schema)
    assert avro_spark_ddl(text) == (
        "struct<`b`:boolean,`i`:int,`f`:float,`e`:string,`x`:binary,`d`:date,`t`:timestamp,"
        "`lt`:timestamp_ntz,`dec`:decimal(10,3),`u`:string,`a`:array<binary>,"
        "`m`:map<string,bigint>,`g`:struct<`member0`:int,`member1`:string>,`fd`:double>"
    )
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        BooleanType,
        DateType,
        DecimalType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampNTZType,
        TimestampType,
    )  # fmt: skip

    def s(*fields: tuple[str, Any]) -> StructType:
        return StructType([StructField(n, t, True) for n, t in fields])

    spark = s(
        ("b", BooleanType()), ("i", IntegerType()), ("f", FloatType()), ("e", StringType()),
        ("x", BinaryType()), ("d", DateType()), ("t", TimestampType()),
        ("lt", TimestampNTZType()), ("dec", DecimalType(10, 3)), ("u", StringType()),
        ("a", ArrayType(BinaryType(), True)), ("m", MapType(StringType(), LongType(), True)),
        ("g", s(("member0", IntegerType()), ("member1", StringType()))), ("fd", DoubleType()),
    )  # fmt: skip
    assert avro_arrow_type(text) == to_arrow_type(spark, timezone="UTC")


def test_recursive_and_unreadable_schemas_are_refused() -> None:
    recursive = {"type": "record", "name": "Node", "fields": [
        {"name": "next", "type": ["null", "Node"]}]}  # fmt: skip
    with pytest.raises(ValueError, match="recursive Avro type Node"):
        avro_arrow_type(json.dumps(recursive))
    with pytest.raises(ValueError, match="must be an Avro record"):
        avro_arrow_type('"string"')
    wide = {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 0}
    with pytest.raises(ValueError, match="precision 40"):
        avro_arrow_type(json.dumps({"type": "record", "name": "R",
                                    "fields": [{"name": "d", "type": wide}]}))  # fmt: skip


def test_arrow_type_must_be_the_readers() -> None:
    text = json.dumps(ORDER)
    with pytest.raises(ValueError, match="not the reader's type"):
        decode_avro(pa.array(order_values()), text, text, pa.struct([pa.field("id", pa.int64())]))
    with pytest.raises(TypeError, match="must be binary"):
        decode_avro(pa.array(["x"]), text, text, avro_arrow_type(text))


def test_pure_python_switch_uses_the_reference() -> None:
    """``EQUEUE_PURE_PYTHON=1`` (read at import) decodes with the reference."""
    code = (
        "import sys, json, pyarrow as pa\n"
        "from equeue_spark.spark import avro_arrow\n"
        "t, values = sys.argv[1], [bytes.fromhex(v) for v in sys.argv[2:]]\n"
        "out, bad = avro_arrow.decode_avro(pa.array(values), t, t, avro_arrow.avro_arrow_type(t))\n"
        "print(avro_arrow.IMPLEMENTATION, len(out), out.null_count, bad)\n"
    )
    args = [json.dumps(ORDER), *(v.hex() for v in order_values())]
    env = {**os.environ, "EQUEUE_PURE_PYTHON": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
        timeout=120, check=True,
    )  # fmt: skip
    assert done.stdout.split() == ["python", "4", "0", "[]"]


@needs_c
def test_unsupported_construct_falls_back_to_the_reference(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dec = {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}
    writer = {"type": "record", "name": "R", "fields": [{"name": "d", "type": dec}]}
    reader = {**writer, "fields": [{"name": "d", "type": {**dec, "precision": 8}}]}
    values = pa.array(encode(writer, [{"d": Decimal("12.34")}]))
    w, r = json.dumps(writer), json.dumps(reader)
    out, bad = decode_avro(values, w, r, avro_arrow_type(r))
    assert out.to_pylist() == [{"d": Decimal("12.34")}] and bad == []
    assert "Avro decoding in Python" in caplog.text
