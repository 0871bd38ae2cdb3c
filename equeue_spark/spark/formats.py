"""The read schema of ``valueFormat``/``keyFormat``: which reader schema a
query decodes with, and the Spark type it decodes into.

``resolve_plan`` runs on the driver when the query is loaded: it fetches the
topic's schema (latest, ``valueSchemaVersion``, or the explicit
``valueSchema``) once, so the query's Spark schema and its reader schema are
fixed for its life; ``DecodePlan`` travels to the tasks with the reader
(decode.py uses it). Avro maps to Spark types as Spark's ``from_avro`` does
(``avro_arrow.avro_arrow_type``); JSON Schema as described in
docs/spark-formats.md (``json_spark_type``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from equeue_spark.spark.errors import InvalidOption
from equeue_spark.spark.format_options import SCHEMA_FORMATS, FormatOptions

VALUE, KEY = "value", "key"
TYPE_OF_FORMAT = {"avro": "AVRO", "json": "JSON"}


@dataclass(frozen=True)
class WriterSchema:
    """One registered version of a subject (what ``Admin.get_schema`` returns)."""

    version: int
    type: str
    """``AVRO`` or ``JSON``."""
    text: str
    fingerprint: str


Fetch = Callable[[str, int, bool], WriterSchema]
"""``fetch(topic, version, key)``: version 0 is the latest; raises the
client's ``NotFoundError`` when the topic has no such schema."""


@dataclass(frozen=True)
class PartPlan:
    """How one column (``value`` or ``key``) is decoded."""

    part: str
    format: str
    """``string``, ``avro`` or ``json``."""
    type: str = ""
    """The reader schema's type (``AVRO``/``JSON``); empty for ``string``."""
    reader: str = ""
    """The reader schema's normalized text."""
    version: int = 0
    """The reader schema's version; 0 for an explicit ``valueSchema``."""
    topic_versions: tuple[tuple[str, int], ...] = ()
    """The reader schema's version in each topic read: topics with the same
    latest schema may number it differently (``a`` v3, ``b`` v1), and a
    topic's version N is its own schema, not another topic's."""

    def reader_version(self, topic: str) -> int:
        """The reader schema's version in ``topic`` (0: none, an explicit schema)."""
        if not self.topic_versions:
            return self.version
        return dict(self.topic_versions).get(topic, 0)

    @property
    def version_column(self) -> str:
        return f"{self.part}SchemaVersion"

    @property
    def schema_format(self) -> bool:
        return self.format in SCHEMA_FORMATS


@dataclass(frozen=True)
class DecodePlan:
    """Everything a read task needs to decode (picklable, fixed at ``load()``)."""

    parts: tuple[PartPlan, ...]
    mode: str = "FAILFAST"
    corrupt_column: str = "_corrupt_record"
    evolution_mode: str = "none"
    include_headers: bool = False

    def part(self, name: str) -> PartPlan | None:
        return next((p for p in self.parts if p.part == name), None)

    @property
    def permissive(self) -> bool:
        return self.mode == "PERMISSIVE"


def resolve_plan(
    formats: FormatOptions,
    topics: tuple[str, ...] | None,
    fetch: Fetch,
    *,
    include_headers: bool = False,
) -> DecodePlan | None:
    """The query's decode plan, None when nothing is decoded (``binary``
    both). ``topics``: the topics read, None when not known at ``load()``
    (``topicPattern``)."""
    parts = []
    for part, fmt in ((KEY, formats.key_format), (VALUE, formats.value_format)):
        if fmt == "binary":
            continue
        if fmt == "string":
            parts.append(PartPlan(part, fmt))
            continue
        explicit = formats.key_schema if part == KEY else formats.value_schema
        version = formats.key_schema_version if part == KEY else formats.value_schema_version
        parts.append(_schema_part(part, fmt, explicit, version, topics=topics, fetch=fetch))
    if not parts:
        return None
    return DecodePlan(
        tuple(parts),
        mode=formats.mode,
        corrupt_column=formats.corrupt_column,
        evolution_mode=formats.evolution_mode,
        include_headers=include_headers,
    )


def _option(part: str, what: str) -> str:
    return f"{part}{what}"


def _schema_part(
    part: str,
    fmt: str,
    explicit: str,
    version: int,
    *,
    topics: tuple[str, ...] | None,
    fetch: Fetch,
) -> PartPlan:
    kind = TYPE_OF_FORMAT[fmt]
    option = _option(part, "Schema")
    if explicit:
        from equeue_proto import schema_rules

        try:
            parsed = schema_rules.parse(kind, explicit)
        except ValueError as exc:
            raise InvalidOption(f"option {option}: not a valid {kind} schema: {exc}") from None
        return PartPlan(part, fmt, kind, parsed.text, 0)
    if not topics:
        raise InvalidOption(
            f"option {_option(part, 'Format')}={fmt} with topicPattern: the topics are not "
            f"known when the query starts; give the reader schema with option {option}"
        )
    found = [_fetch(fetch, topic, version, part) for topic in topics]
    first = found[0]
    # The normalized text, not the fingerprint: Avro's canonical form ignores
    # defaults and aliases, which resolution uses.
    if any((w.type, w.text) != (first.type, first.text) for w in found[1:]):
        listed = ", ".join(f"{t} v{w.version}" for t, w in zip(topics, found, strict=True))
        raise InvalidOption(
            f"option {_option(part, 'Format')}={fmt} over several topics whose schemas differ "
            f"({listed}): give the reader schema with option {option}"
        )
    if first.type != kind:
        raise InvalidOption(
            f"option {_option(part, 'Format')}={fmt}: topic {topics[0]}'s {part} schema "
            f"(version {first.version}) is {first.type}; use {part}Format="
            f"{first.type.lower()}"
        )
    versions = tuple((t, w.version) for t, w in zip(topics, found, strict=True))
    return PartPlan(part, fmt, kind, first.text, first.version, versions)


def _fetch(fetch: Fetch, topic: str, version: int, part: str) -> WriterSchema:
    from equeue_spark.client.errors import NotFoundError

    try:
        return fetch(topic, version, part == KEY)
    except NotFoundError:
        which = f"version {version}" if version else "schema"
        raise InvalidOption(
            f"option {_option(part, 'Format')}: topic {topic} has no {part} {which}; register "
            f"one with `equeue schema set {topic}{' --key' if part == KEY else ''} FILE`, or "
            f"give option {_option(part, 'Schema')}"
        ) from None


# -- Spark types -------------------------------------------------------------------

BASE_FIELDS: tuple[tuple[str, DataType], ...] = (
    ("key", BinaryType()),
    ("value", BinaryType()),
    ("topic", StringType()),
    ("queue", IntegerType()),
    ("offset", LongType()),
    ("timestamp", TimestampType()),
    ("tag", StringType()),
    ("message_id", StringType()),
    ("broker", StringType()),
    ("timestampType", IntegerType()),
    ("storeTimestamp", TimestampType()),
)
"""arrow.READ_SCHEMA as Spark types."""
HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
CORRUPT_TYPE = StructType(
    [
        StructField("part", StringType()),
        StructField("bytes", BinaryType()),
        StructField("error", StringType()),
    ]
)


def read_struct(plan: DecodePlan) -> StructType:
    """The query's Spark schema: arrow.READ_SCHEMA with decoded ``key``/``value``,
    then the version columns, ``headers`` (asked for), the corrupt column
    (``PERMISSIVE``)."""
    types = {p.part: part_type(p) for p in plan.parts}
    fields = [StructField(name, types.get(name, kind)) for name, kind in BASE_FIELDS]
    for name in (VALUE, KEY):
        part = plan.part(name)
        if part is not None and part.schema_format:
            fields.append(StructField(part.version_column, IntegerType()))
    if plan.include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    if plan.permissive:
        fields.append(StructField(plan.corrupt_column, CORRUPT_TYPE))
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise InvalidOption(
            f"option columnNameOfCorruptRecord={plan.corrupt_column}: a column of that name "
            "exists already; choose another"
        )
    return StructType(fields)


def part_type(part: PartPlan) -> DataType:
    """The Spark type ``part`` decodes into."""
    if part.format == "string":
        return StringType()
    if part.type == "AVRO":
        return avro_spark_type(part.reader)
    import json

    return json_spark_type(json.loads(part.reader))


def avro_spark_type(reader: str) -> StructType:
    """Spark's type of an Avro record schema (as ``from_avro``), every field nullable."""
    from pyspark.sql.pandas.types import from_arrow_type

    from equeue_spark.spark.avro_arrow import avro_arrow_type

    try:
        kind = from_arrow_type(avro_arrow_type(reader))
    except ValueError as exc:  # avro_columns.Unsupported: no Spark type for it
        raise InvalidOption(f"the Avro reader schema has no Spark type: {exc}") from None
    if not isinstance(kind, StructType):
        raise InvalidOption("an Avro reader schema must be a record")
    return kind


# -- JSON Schema -> Spark ---------------------------------------------------------

_SIMPLE: dict[str, DataType] = {
    "string": StringType(),
    "integer": LongType(),
    "number": DoubleType(),
    "boolean": BooleanType(),
}


def json_spark_type(schema: Mapping[str, Any]) -> StructType:
    """The Spark struct of a JSON Schema whose root is an object with
    ``properties``; parts that map to no Spark type are strings holding
    their JSON text."""
    kind = _JsonTypes(schema).convert(schema, frozenset())
    if not isinstance(kind, StructType):
        raise InvalidOption(
            "a JSON Schema to decode values with must describe an object with properties"
        )
    return kind


class _JsonTypes:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root

    def convert(self, node: Any, seen: frozenset[str]) -> DataType:
        if not isinstance(node, Mapping):
            return StringType()
        ref = node.get("$ref")
        if isinstance(ref, str):
            return self._ref(ref, seen)
        kind = _one_type(node.get("type"))
        if kind is None and "enum" in node and all(isinstance(x, str) for x in node["enum"]):
            return StringType()
        if kind is None and "properties" in node:
            kind = "object"
        if kind == "object":
            return self._object(node, seen)
        if kind == "array":
            items = node.get("items")
            return ArrayType(self.convert(items, seen) if isinstance(items, Mapping)
                             else StringType())  # fmt: skip
        if kind == "string":
            return {"date-time": TimestampType(), "date": DateType()}.get(
                str(node.get("format", "")), StringType()
            )
        return _SIMPLE.get(kind or "", StringType())

    def _object(self, node: Mapping[str, Any], seen: frozenset[str]) -> DataType:
        props = node.get("properties")
        if isinstance(props, Mapping) and props:
            return StructType(
                [StructField(str(k), self.convert(v, seen)) for k, v in props.items()]
            )
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping):
            return MapType(StringType(), self.convert(extra, seen))
        return StringType()

    def _ref(self, ref: str, seen: frozenset[str]) -> DataType:
        if ref in seen:  # recursive: no Spark type; the part's JSON text
            return StringType()
        for prefix in ("#/definitions/", "#/$defs/"):
            if ref.startswith(prefix):
                target = self.root.get(prefix[2:-1], {}).get(ref[len(prefix) :])
                if isinstance(target, Mapping):
                    return self.convert(target, seen | {ref})
        return StringType()


def _one_type(kind: Any) -> str | None:
    """``"T"`` or ``["T", "null"]`` -> T; several types -> None."""
    if isinstance(kind, str):
        return None if kind == "null" else kind
    if isinstance(kind, list):
        named = [k for k in kind if k != "null"]
        if len(named) == 1 and isinstance(named[0], str):
            return named[0]
    return None


def raw_schema() -> pa.Schema:
    """What the read task yields for the decode stage: arrow.READ_SCHEMA and ``headers``."""
    from equeue_spark.spark.arrow import arrow_schema

    return arrow_schema(
        StructType(
            [StructField(n, k) for n, k in BASE_FIELDS] + [StructField("headers", HEADERS_TYPE)]
        )
    )
