"""The sink's ``valueFormat``/``keyFormat`` = ``avro`` | ``json``: a struct
column encoded with the topic's schema.

On the driver (``prepare_write``, before any task): the topic's latest (or
``valueSchemaVersion``) schema is fetched and the struct's fields checked
against it by name; the schema's text and version then travel in the write
options. In tasks (``encode_batch``): each row encoded (fastavro's
``schemaless_writer`` / ``json.dumps``: row by row, see docs/spark-formats.md)
and given the header ``equeue.schema: N`` (``equeue.key-schema`` for keys),
after the row's own ``headers`` when the DataFrame has that column.
Pyspark-free.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import io
import json
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import pyarrow as pa

from equeue_proto.schema_rules import KEY_SCHEMA_HEADER, SCHEMA_HEADER
from equeue_spark.client.avro_columns import Node, union_shape
from equeue_spark.client.errors import InvalidRequest, NotFoundError
from equeue_spark.spark.format_options import SCHEMA_FORMATS, FormatOptions
from equeue_spark.spark.formats import Fetch, WriterSchema
from equeue_spark.spark.options import WriteOptions

HEADERS_TYPE = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)


def encoded_parts(formats: FormatOptions) -> list[str]:
    """The columns the sink encodes (``value``, ``key``)."""
    return [
        part
        for part, fmt in (("value", formats.value_format), ("key", formats.key_format))
        if fmt in SCHEMA_FORMATS
    ]


def prepare_write(options: WriteOptions, schema: pa.Schema, fetch: Fetch) -> WriteOptions:
    """``options`` with the writer schemas of the encoded columns (text in
    ``value_schema``/``key_schema``, their versions); InvalidRequest when a
    column does not fit its schema, naming the field."""
    f = options.formats
    changes: dict[str, Any] = {}
    for part in encoded_parts(f):
        fmt = f.value_format if part == "value" else f.key_format
        if not options.topic:
            raise InvalidRequest(
                f"{part}Format={fmt} needs the topic option (the schema is the topic's)"
            )
        version = f.value_schema_version if part == "value" else f.key_schema_version
        try:
            writer = fetch(options.topic, version, part == "key")
        except NotFoundError:
            which = f"version {version}" if version else "schema"
            raise InvalidRequest(
                f"{part}Format={fmt}: topic {options.topic} has no {part} {which}; register one "
                f"with `equeue schema set {options.topic}{' --key' if part == 'key' else ''} FILE`"
            ) from None
        if writer.type != fmt.upper():
            raise InvalidRequest(
                f"{part}Format={fmt}: topic {options.topic}'s {part} schema (version "
                f"{writer.version}) is {writer.type}; use {part}Format={writer.type.lower()}"
            )
        if schema.get_field_index(part) < 0:
            raise InvalidRequest(f"{part}Format={fmt}: the DataFrame has no {part} column")
        check_struct(schema.field(part).type, writer, part)
        changes[f"{part}_schema"] = writer.text
        changes[f"{part}_schema_version"] = writer.version
    if not changes:
        return options
    return dataclasses.replace(options, formats=dataclasses.replace(f, **changes))


def check_struct(kind: pa.DataType, writer: WriterSchema, part: str) -> None:
    """The struct column ``part`` against ``writer`` by field name."""
    if not pa.types.is_struct(kind):
        raise InvalidRequest(
            f"column {part} has type {kind}; with {part}Format={writer.type.lower()} it must be "
            f"a struct of the schema's fields, e.g. F.struct('id', 'name').alias('{part}')"
        )
    doc = json.loads(writer.text)
    names = [kind.field(i).name for i in range(kind.num_fields)]
    if writer.type == "AVRO":
        fields = {f["name"]: f for f in doc.get("fields", [])} if isinstance(doc, dict) else {}
        needed = [n for n, f in fields.items() if "default" not in f]
    else:
        fields = dict(doc.get("properties", {})) if isinstance(doc, dict) else {}
        needed = [n for n in doc.get("required", []) if isinstance(n, str)]
    where = f"the topic's {part} schema version {writer.version}"
    extra = [n for n in names if n not in fields]
    if extra:
        raise InvalidRequest(
            f"column {part} has field {extra[0]!r} that {where} lacks (fields: "
            f"{', '.join(fields)}): drop it or register a schema version with it"
        )
    missing = [n for n in needed if n not in names]
    if missing:
        what = "has no default" if writer.type == "AVRO" else "is required"
        raise InvalidRequest(
            f"column {part} lacks field {missing[0]!r}, which {what} in {where}: add it"
        )


def encode_batch(batch: pa.RecordBatch, formats: FormatOptions) -> pa.RecordBatch:
    """``batch`` with its encoded columns as binary and the version headers."""
    extra: list[list[tuple[str, bytes]]] = [[] for _ in range(batch.num_rows)]
    for part in encoded_parts(formats):
        text = formats.value_schema if part == "value" else formats.key_schema
        version = formats.value_schema_version if part == "value" else formats.key_schema_version
        fmt = formats.value_format if part == "value" else formats.key_format
        column = batch.column(part)
        rows = column.to_pylist()
        if _has_map(column.type):  # Arrow gives a map as (key, value) pairs
            rows = [_with_dicts(row, column.type) for row in rows]
        encoded = encode_rows(rows, fmt, text, part)
        batch = _replace(batch, part, pa.array(encoded, type=pa.binary()))
        header = (KEY_SCHEMA_HEADER if part == "key" else SCHEMA_HEADER, str(version).encode())
        for i, value in enumerate(encoded):
            if value is not None:
                extra[i].append(header)
    return _with_headers(batch, extra)


def _has_map(kind: pa.DataType) -> bool:
    if pa.types.is_map(kind):
        return True
    if pa.types.is_struct(kind):
        return any(_has_map(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_map(kind.value_type)
    return False


def _with_dicts(value: Any, kind: pa.DataType) -> Any:
    """A row of ``kind`` with its maps as dicts, as fastavro and JSON take them
    (an empty map too, which no guess from the value could tell from a list)."""
    if value is None:
        return None
    if pa.types.is_map(kind):
        return {k: _with_dicts(v, kind.item_type) for k, v in value}
    if pa.types.is_struct(kind):
        return {f.name: _with_dicts(value.get(f.name), f.type) for f in kind}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return [_with_dicts(x, kind.value_type) for x in value]
    return value


def encode_rows(rows: list[Any], fmt: str, text: str, part: str) -> list[bytes | None]:
    """Each row (a dict, or None: no value/key) encoded; InvalidRequest names
    the first row that the schema does not take."""
    encode = _avro_encoder(text) if fmt == "avro" else _json_encoder(text)
    out: list[bytes | None] = []
    for i, row in enumerate(rows):
        if row is None:
            out.append(None)
            continue
        try:
            out.append(encode(row))
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise InvalidRequest(
                f"row {i} of a batch: column {part} does not encode as {fmt.upper()} with the "
                f"topic's schema: {exc}"
            ) from None
    return out


@lru_cache(maxsize=64)
def _avro_encoder(text: str) -> Callable[[Mapping[str, Any]], bytes]:
    import fastavro
    from fastavro.validation import ValidationError, validate

    from equeue_spark.client.avro_columns import parse_schema

    parsed = fastavro.parse_schema(json.loads(text))
    tree = parse_schema(text)

    def encode(row: Mapping[str, Any]) -> bytes:
        datum = _no_nulls(_unions(row, tree))
        # fastavro's writer does not range-check: a long 2**40 in an "int" field
        # would be written as bytes no reader takes. Validation refuses it.
        try:
            validate(datum, parsed, raise_errors=True)
        except ValidationError as exc:
            raise ValueError("; ".join(str(e) for e in exc.errors)) from None
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, datum)
        return out.getvalue()

    return encode


def _unions(value: Any, node: Node) -> Any:
    """``value`` with each union that Spark reads as struct<member0, member1, ...>
    (``avro_columns.union_shape``) given back as its one non-null member, so a
    column read with valueFormat=avro can be written back."""
    if value is None:
        return None
    if node.kind == "record" and isinstance(value, Mapping):
        kinds = {f.name: f.type for f in node.fields}
        return {k: _unions(v, kinds[k]) if k in kinds else v for k, v in value.items()}
    if node.kind == "array" and isinstance(value, list) and node.items is not None:
        return [_unions(x, node.items) for x in value]
    if node.kind == "map" and isinstance(value, Mapping) and node.items is not None:
        return {k: _unions(v, node.items) for k, v in value.items()}
    if node.kind != "union":
        return value
    shape, members = union_shape(node)
    if shape == "nullable":
        return _unions(value, members[0])
    names = [f"member{i}" for i in range(len(members))]
    if shape != "struct" or not isinstance(value, Mapping) or list(value) != names:
        return value
    given = [(m, value[n]) for m, n in zip(members, names, strict=True) if value[n] is not None]
    return _unions(given[0][1], given[0][0]) if given else None


def _no_nulls(row: Mapping[str, Any]) -> dict[str, Any]:
    """A missing field (null in the struct) takes the schema's default."""
    return {k: v for k, v in row.items() if v is not None}


@lru_cache(maxsize=64)
def _json_encoder(text: str) -> Callable[[Mapping[str, Any]], bytes]:
    import fastjsonschema

    check = fastjsonschema.compile(json.loads(text))

    def encode(row: Mapping[str, Any]) -> bytes:
        doc = _json_value(row)
        # As Producer(validate=True): the topic's schema holds for every record
        # (a null required field, a string for an integer, are refused).
        try:
            check(doc)
        except fastjsonschema.JsonSchemaValueException as exc:
            raise ValueError(str(exc.message)) from None
        # allow_nan=False: NaN and Infinity are not JSON; no reader takes them.
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode()  # fmt: skip

    return encode


def _json_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _json_value(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        # A Spark map arrives as (key, value) pairs.
        if value and all(isinstance(x, tuple) and len(x) == 2 for x in value):
            return {str(k): _json_value(v) for k, v in value}
        return [_json_value(x) for x in value]
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def _replace(batch: pa.RecordBatch, name: str, array: pa.Array) -> pa.RecordBatch:
    i = batch.schema.get_field_index(name)
    return batch.set_column(i, pa.field(name, array.type), array)


def _with_headers(batch: pa.RecordBatch, extra: list[list[tuple[str, bytes]]]) -> pa.RecordBatch:
    """``batch`` whose ``headers`` column ends with ``extra``'s headers."""
    names = batch.schema.names
    own = batch.column("headers").to_pylist() if "headers" in names else [None] * batch.num_rows
    merged = []
    for mine, added in zip(own, extra, strict=True):
        # A copied row's own stamp (read with includeHeaders from another topic or
        # version) is dropped, as Producer(validate=True) drops it: a reader that
        # takes the first header would decode with the stale version.
        stamps = {k for k, _ in added}
        row = [
            {"key": h["key"], "value": h["value"].encode() if isinstance(h["value"], str)
             else h["value"]}
            for h in mine or [] if h["key"] not in stamps
        ]  # fmt: skip
        row.extend({"key": k, "value": v} for k, v in added)
        merged.append(row)
    array = pa.array(merged, type=HEADERS_TYPE)
    if "headers" in names:
        return _replace(batch, "headers", array)
    return batch.append_column(pa.field("headers", array.type), array)
