"""The Spark benchmark's format scenario (``--formats binary,avro``): decoding Avro values.

A topic of Avro records (6 fields, about 30 bytes: a long id, a short string,
an int, a double, a timestamp-millis and an enum) whose value schema is
registered (``Admin.set_schema``), each record carrying the header
``equeue.schema: 1`` as a validating producer writes it; the values are
encoded once with fastavro and reused, so filling costs no encoding. The same
topic is then read by the same streaming query with ``valueFormat=binary``
(the bytes) and with ``valueFormat=avro`` (decoded into a ``value`` struct);
target: the Avro read at >= 0.5x the binary read's rows/s.

Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator

from bench._spark_setup import PRODUCE_BATCH, QUEUES
from equeue_proto.schema_rules import SCHEMA_HEADER, version_header
from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.client import Admin, Producer
from equeue_spark.client.batches import build_request

FORMATS = ("binary", "avro")
AVRO_TARGET = 0.5
AVRO_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "price", "type": "double"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "status", "type": {"type": "enum", "name": "Status",
                                    "symbols": ["NEW", "PAID", "SHIPPED"]}},
    ],
}  # fmt: skip


def avro_values(count: int) -> list[bytes]:
    """``count`` distinct Avro-encoded records of ``AVRO_SCHEMA`` (about 30 bytes each)."""
    import fastavro

    parsed = fastavro.parse_schema(AVRO_SCHEMA)
    now = int(time.time() * 1000)
    out = []
    for i in range(count):
        buf = io.BytesIO()
        record = {
            "id": i, "name": f"item-{i % 1000:04d}", "qty": i % 50, "price": i * 0.25,
            "ts": now + i, "status": ("NEW", "PAID", "SHIPPED")[i % 3],
        }  # fmt: skip
        fastavro.schemaless_writer(buf, parsed, record)
        out.append(buf.getvalue())
    return out


def fill_avro_topic(admin: Admin, producer: Producer, topic: str, count: int) -> float:
    """Create ``topic`` (``QUEUES`` queues) with ``AVRO_SCHEMA`` as its value
    schema (version 1) and produce ``count`` records with the version header;
    the seconds producing took."""
    admin.create_topic(topic, queues=QUEUES)
    info = admin.set_schema(topic, json.dumps(AVRO_SCHEMA), type="avro")
    version = info.latest_version
    values = avro_values(PRODUCE_BATCH)
    headers = [[(SCHEMA_HEADER, version_header(version))]] * PRODUCE_BATCH

    def requests() -> Iterator[pb.ProduceRequest]:
        for b in range(count // PRODUCE_BATCH):
            queue = [b % QUEUES] * PRODUCE_BATCH
            yield build_request(topic, values, headers=headers, queue_ids=queue)

    start = time.perf_counter()
    sent = sum(len(r) for r in producer.send_requests(requests()))
    elapsed = time.perf_counter() - start
    if sent != count // PRODUCE_BATCH * PRODUCE_BATCH:
        raise RuntimeError(f"{topic}: produced {sent} of {count}")
    return elapsed


def format_options(fmt: str) -> dict[str, str]:
    """The read options that pick ``fmt`` (``binary`` is the default)."""
    return {} if fmt == "binary" else {"valueFormat": fmt}
