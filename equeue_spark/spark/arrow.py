"""The read schema, and Arrow record batches built straight from record bytes.

A pull reply carries records in the broker's format; ``client.columns`` turns a
run of them into column buffers (in C), and this module wraps those buffers as
Arrow arrays with ``Array.from_buffers``: no Python object per record.

Spark checks a returned batch's Arrow schema against the declared one exactly
(types and nullability), so the batch schema is derived from the Spark schema
with pyspark's own converter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from equeue_spark.client.columns import RecordColumns

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

READ_SCHEMA = (
    "key binary, value binary, topic string, queue int, offset long, "
    "timestamp timestamp, tag string, message_id string, broker string, "
    "timestampType int, storeTimestamp timestamp"
)
"""``broker``: the broker name in a cluster (option ``namesrv``), the broker's
id (its name if it has one) on a single broker. ``timestamp`` is the
producer's time (the broker's store time when the producer gave none), so
``timestampType`` is always ``CREATE_TIME`` (Kafka's 0, CreateTime);
``storeTimestamp`` is the broker's store time (Kafka's LogAppendTime), the
time ``startingTimestamp``/``endingTimestamp`` compare. The two columns come
after ``broker`` so existing positional uses of the columns keep working."""
CREATE_TIME = 0
"""``timestampType`` of a row whose ``timestamp`` is the producer's time (Kafka's CreateTime)."""
LOG_APPEND_TIME = 1
"""Kafka's LogAppendTime: the broker's store time (equeue's ``storeTimestamp``)."""
HEADERS_COLUMN = "headers array<struct<key:string,value:binary>>"


def read_schema(include_headers: bool) -> str:
    """The DDL of the source's fixed schema (``headers`` only when asked)."""
    return f"{READ_SCHEMA}, {HEADERS_COLUMN}" if include_headers else READ_SCHEMA


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects for ``schema`` (timestamps in UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _buf(data: bytes) -> pa.Buffer:
    return pa.py_buffer(data)


def _varlen(kind: pa.DataType, n: int, offsets: bytes, data: bytes) -> pa.Array:
    return pa.Array.from_buffers(kind, n, [None, _buf(offsets), _buf(data)])


def _fixed(kind: pa.DataType, n: int, data: bytes) -> pa.Array:
    return pa.Array.from_buffers(kind, n, [None, _buf(data)])


def to_record_batch(cols: RecordColumns, schema: pa.Schema, broker: str = "") -> pa.RecordBatch:
    """One Arrow batch of the records decoded into ``cols``, with ``schema``
    (all read from ``broker``)."""
    n = cols.count
    validity = None if cols.key_validity is None else _buf(cols.key_validity)
    keys = pa.Array.from_buffers(
        pa.binary(), n, [validity, _buf(cols.key_offsets), _buf(cols.keys)], cols.key_nulls
    )
    arrays = [
        keys,
        _varlen(pa.binary(), n, cols.value_offsets, cols.values),
        _varlen(pa.string(), n, cols.topic_offsets, cols.topics),
        _fixed(pa.int32(), n, cols.queue_ids),
        _fixed(pa.int64(), n, cols.offsets),
        _fixed(schema.field("timestamp").type, n, cols.timestamps_us),
        _varlen(pa.string(), n, cols.tag_offsets, cols.tags),
        _varlen(pa.string(), n, cols.id_offsets, cols.ids),
        pa.repeat(pa.scalar(broker, pa.string()), n),
        pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), n),
        _fixed(schema.field("storeTimestamp").type, n, cols.store_timestamps_us),
    ]
    if schema.get_field_index("headers") >= 0:
        arrays.append(_headers(cols, schema.field("headers").type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _headers(cols: RecordColumns, kind: pa.ListType) -> pa.Array:
    m = (len(cols.header_key_offsets) // 4) - 1
    struct_type = kind.value_type
    entries = pa.StructArray.from_arrays(
        [
            _varlen(pa.string(), m, cols.header_key_offsets, cols.header_keys),
            _varlen(pa.binary(), m, cols.header_value_offsets, cols.header_values),
        ],
        fields=list(struct_type),
    )
    offsets = _buf(cols.header_list_offsets)
    return pa.Array.from_buffers(kind, cols.count, [None, offsets], children=[entries])
