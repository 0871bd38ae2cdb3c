"""The ceiling of the Spark benchmark: a Python data source serving the read task's
batches from memory (``format("equeue_ceiling")``).

Same schema, offsets and admission as the equeue source, and Arrow batches of
the same shapes, built once per shape in each (reused) Python worker: what is
left is Spark's own cost of running a Python source. Spark's Python workers
import this module by reference (``bench._spark_ceiling``) to unpickle the
source's classes. Nothing here is imported by the broker or the client.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from bench._spark_setup import CEILING, KEY_WIDTH, QUEUES
from equeue_spark.client.columns import RecordColumns
from equeue_spark.spark.arrow import arrow_schema, read_schema, to_record_batch

HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


@dataclass(frozen=True)
class CeilingSpec:
    """What the ceiling source serves: ``rows_per_queue`` rows in each of ``queues``."""

    rows_per_queue: int
    queues: int
    value_size: int
    batch_rows: int
    """Rows per Arrow batch, as the real read task yields them."""
    max_per_trigger: int
    topic: str
    broker_id: str

    @classmethod
    def parse(cls, options: dict[str, str]) -> CeilingSpec:
        o = {k.lower(): v for k, v in options.items()}
        return cls(
            rows_per_queue=int(o["rowsperqueue"]),
            queues=int(o["queues"]),
            value_size=int(o["valuesize"]),
            batch_rows=int(o["batchrows"]),
            max_per_trigger=int(o["maxoffsetspertrigger"]),
            topic=o["topic"],
            broker_id=o["brokerid"],
        )

    def options(self) -> dict[str, str]:
        return {
            "rowsPerQueue": str(self.rows_per_queue),
            "queues": str(self.queues),
            "valueSize": str(self.value_size),
            "batchRows": str(self.batch_rows),
            "maxOffsetsPerTrigger": str(self.max_per_trigger),
            "topic": self.topic,
            "brokerId": self.broker_id,
        }


@dataclass(frozen=True)
class CeilingRange:
    spec: CeilingSpec
    queue_id: int
    start: int
    end: int


class CeilingPartition(InputPartition):
    def __init__(self, part: CeilingRange) -> None:
        super().__init__(part)


class CeilingSource(DataSource):
    """``format("equeue_ceiling")``: the equeue schema, offsets and batches, from memory."""

    @classmethod
    def name(cls) -> str:
        return CEILING

    def schema(self) -> str:
        return read_schema(False)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return CeilingStreamReader(CeilingSpec.parse(dict(self.options)), schema)


class CeilingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{queue: next row}``; admission as the equeue source's
    ``maxOffsetsPerTrigger`` (equal backlogs: an equal share per queue)."""

    def __init__(self, spec: CeilingSpec, schema: StructType) -> None:
        self.spec = spec
        self.schema = schema

    def initialOffset(self) -> dict[str, int]:  # noqa: N802
        return {str(q): 0 for q in range(self.spec.queues)}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.spec.max_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        pass  # the data never grows

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        s = self.spec
        share = s.rows_per_queue
        if isinstance(limit, ReadMaxRows):
            share = max(min(limit.max_rows, s.max_per_trigger) // s.queues, 1)
        return {q: min(int(o) + share, s.rows_per_queue) for q, o in start.items()}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return [
            CeilingPartition(CeilingRange(self.spec, int(q), int(start[q]), int(end[q])))
            for q in sorted(end, key=int)
            if int(end[q]) > int(start[q])
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return ceiling_batches(partition.value, arrow_schema(self.schema))

    def commit(self, end: dict[str, int]) -> None:
        pass


def _digits(numbers: np.ndarray[Any, Any], width: int, base: int) -> np.ndarray[Any, Any]:
    """Fixed-width ASCII digits of ``numbers`` (one row of ``width`` bytes each)."""
    powers = np.int64(base) ** np.arange(width - 1, -1, -1, dtype=np.int64)
    digits = (numbers[:, None] // powers) % base
    out: np.ndarray[Any, Any] = HEX[digits]
    return out


def _fixed_width(rows: np.ndarray[Any, Any]) -> tuple[bytes, bytes]:
    """(offsets, data) of a string/binary column whose items are the rows of ``rows``."""
    n, width = rows.shape
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(width)
    return offsets.tobytes(), np.ascontiguousarray(rows).tobytes()


TEMPLATES: dict[tuple[int, int, str, str, int, str], pa.RecordBatch] = {}
"""Ceiling template batches, per Python worker process (Spark reuses workers)."""


def ceiling_batches(part: CeilingRange, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows ``[start, end)`` of one ceiling queue as Arrow batches of
    ``batch_rows``: slices of one template batch per shape, built on first use
    in this process and kept, so that a task costs Spark's work and nothing else."""
    s = part.spec
    key = (s.value_size, s.batch_rows, s.topic, s.broker_id, part.queue_id, str(schema))
    template = TEMPLATES.get(key)
    if template is None:
        template = template_batch(s, part.queue_id, schema)
        check_template(template, schema)
        TEMPLATES[key] = template
    for lo in range(part.start, part.end, s.batch_rows):
        n = min(s.batch_rows, part.end - lo)
        yield template if n == template.num_rows else template.slice(0, n)


def template_batch(s: CeilingSpec, queue_id: int, schema: pa.Schema) -> pa.RecordBatch:
    """``batch_rows`` rows shaped as the read task's: 10-digit keys, random
    values, the topic, queue, offsets 0.., a timestamp, empty tags, message ids.

    Built as the read task builds its batches: a ``RecordColumns`` handed to
    ``to_record_batch``, so a column added to the read schema is in the
    ceiling too (``check_template`` guards that the schemas stay equal)."""
    n = s.batch_rows
    offsets = np.arange(n, dtype=np.int64)
    key_offsets, keys = _fixed_width(_digits(offsets * QUEUES + queue_id, KEY_WIDTH, 10))
    values = np.random.default_rng(queue_id).bytes(n * s.value_size)
    value_offsets = np.arange(n + 1, dtype=np.int32) * np.int32(s.value_size)
    topic = np.frombuffer(s.topic.encode(), dtype=np.uint8)
    topic_offsets, topics = _fixed_width(np.broadcast_to(topic, (n, topic.size)))
    prefix = np.frombuffer(f"{s.broker_id}-".encode(), dtype=np.uint8)
    positions = offsets * (s.value_size + 80) + queue_id
    ids = np.concatenate(
        [np.broadcast_to(prefix, (n, prefix.size)), _digits(positions, 16, 16)], axis=1
    )
    id_offsets, id_data = _fixed_width(ids)
    stamps = np.full(n, time.time_ns() // 1000, dtype=np.int64).tobytes()
    no_items = np.zeros(n + 1, dtype=np.int32).tobytes()
    cols = RecordColumns(
        count=n,
        topic_offsets=topic_offsets,
        topics=topics,
        queue_ids=np.full(n, queue_id, dtype=np.int32).tobytes(),
        offsets=offsets.tobytes(),
        timestamps_us=stamps,
        key_offsets=key_offsets,
        keys=keys,
        key_validity=None,
        key_nulls=0,
        value_offsets=value_offsets.tobytes(),
        values=values,
        tag_offsets=no_items,
        tags=b"",
        id_offsets=id_offsets,
        ids=id_data,
        header_list_offsets=no_items,
        header_key_offsets=b"\0\0\0\0",
        header_keys=b"",
        header_value_offsets=b"\0\0\0\0",
        header_values=b"",
        store_timestamps_us=stamps,
    )
    return to_record_batch(cols, schema, s.broker_id)


def check_template(template: pa.RecordBatch, schema: pa.Schema) -> None:
    """Raise unless ``template`` has exactly ``schema`` (names, types, nullability):
    a ceiling with fewer or other columns than the read would measure less work."""
    if template.schema != schema:
        raise RuntimeError(
            f"ceiling template columns {template.schema.names} differ from the read "
            f"schema's {schema.names}:\n{template.schema}\nvs\n{schema}"
        )
